"""The torch side of :func:`matroot._xp.autodiff.with_gradient`, in a module of its own
so that importing matroot needs no torch and torch.compile finds the class made
(it cannot trace a class definition)."""

from __future__ import annotations

import torch

#: Nothing for the package to re-export: only :mod:`.autodiff` uses these.
__all__: list[str] = []


def has_forward_tangent(x) -> bool:
    """Whether ``x`` is a forward-mode dual tensor (``torch.autograd.forward_ad``)."""
    return torch.autograd.forward_ad.unpack_dual(x).tangent is not None


class Attached(torch.autograd.Function):
    """``out`` as a function of ``a`` whose backward pass is ``derivative(a, out_bar)``
    (a self-adjoint derivative is its own vector-Jacobian product)."""

    @staticmethod
    def forward(a, out, derivative):
        return out.view_as(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, _, derivative = inputs
        ctx.save_for_backward(a)
        ctx.derivative = derivative

    @staticmethod
    def backward(ctx, out_bar):
        (a,) = ctx.saved_tensors
        return ctx.derivative(a, out_bar), None, None


class AttachedWithTangent(Attached):
    """:class:`Attached` for a dual tensor: forward mode's tangent too. A class of its
    own because torch.compile cannot trace a Function that defines ``jvp``."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        Attached.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, a_dot, out_dot, derivative_dot):
        (a,) = ctx.saved_tensors
        return ctx.derivative(a, a_dot)
