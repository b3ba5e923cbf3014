"""Automatic differentiation: a result whose derivative is given by a formula instead
of by differentiating the operations that computed it.

matroot's solvers stop on data-dependent tests (a host check eagerly, a
``lax.while_loop`` under ``jax.jit``), and their operations' own derivatives are
not the derivative of the function they approximate: torch's ``eigh`` backward
divides by eigenvalue gaps (NaN for the identity), JAX cannot reverse a
``while_loop``. So a differentiated input is solved without gradient tracking and
the result is attached to the input through a derivative formula
(:func:`with_gradient`): ``torch.autograd.Function`` for PyTorch,
``jax.custom_jvp`` for JAX (forward mode, and reverse mode by transposing it; JAX's
tracers cannot tell ``jax.grad`` from ``jax.jit``, and the rule costs nothing where
nothing is differentiated).

torch.func's transforms (``vmap``, ``grad``, ``jacrev``) wrap tensors in a way
that the solvers' host reads and the custom backward do not support; they are
refused by name (:func:`refuse_torch_func`).
"""

from __future__ import annotations

import array_api_compat

from .namespace import is_traced

__all__ = ["refuse_torch_func", "gradient_flows", "without_gradient", "with_gradient"]


def refuse_torch_func(a, name: str) -> None:
    """Raise a TypeError naming the fix when ``a`` is wrapped by a torch.func transform."""
    if not array_api_compat.is_torch_array(a):
        return
    import torch

    # Dynamo cannot trace the test (and a compiled graph sees plain tensors).
    if not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(a):
        raise TypeError(
            f"{name} does not run under torch.func transforms (vmap, grad, jacrev, "
            "functional_call's grads): its solvers read values on the host. It takes "
            "stacks already: pass the batch as leading dimensions instead of vmap, and "
            "differentiate with torch.autograd (loss.backward() or "
            f"torch.autograd.grad), which {name} supports")


def gradient_flows(a) -> bool:
    """Whether a derivative with respect to ``a`` may be asked for: a torch tensor
    that requires grad with grad mode on or carries a forward-mode tangent, or any
    JAX tracer."""
    if array_api_compat.is_torch_array(a):
        import torch

        from .torch_autodiff import has_forward_tangent

        return (bool(a.requires_grad) and torch.is_grad_enabled()) or has_forward_tangent(a)
    return array_api_compat.is_jax_array(a) and is_traced(a)


def without_gradient(a):
    """``a`` cut from the derivative graph (the same values); ``a`` itself where
    :func:`gradient_flows` says no derivative can be asked for."""
    if not gradient_flows(a):
        return a
    if array_api_compat.is_torch_array(a):
        return a.detach()
    import jax

    return jax.lax.stop_gradient(a)


def with_gradient(a, out, derivative):
    """``out`` (computed from ``a`` without gradient tracking) as a function of ``a``
    whose derivative is the linear map ``derivative(a, direction)``.

    Parameters
    ----------
    a : torch tensor or JAX array
        The differentiated input.
    out : array
        The result, the same library as ``a``, not tracked.
    derivative : callable
        ``derivative(a, d)``: the derivative of ``out`` at ``a`` applied to ``d``, an
        array shaped like ``a``. It must be self-adjoint (as the derivative of a
        symmetric matrix function is), so that it serves as the vector-Jacobian
        product too: torch's backward pass calls it on the output's gradient; JAX
        uses it as the JVP (``jax.jvp``, ``jacfwd``) and transposes it for
        ``jax.grad``, so it must be built of linear operations in ``d``.
    """
    if array_api_compat.is_torch_array(a):
        # A module: torch.compile cannot trace a class body.
        from .torch_autodiff import Attached, AttachedWithTangent, has_forward_tangent

        function = AttachedWithTangent if has_forward_tangent(a) else Attached
        return function.apply(a, out, derivative)
    import jax

    @jax.custom_jvp
    def attached(a_in, out_in):
        return out_in

    @attached.defjvp
    def tangent(primals, tangents):
        a_in, out_in = primals
        return out_in, derivative(a_in, tangents[0])

    return attached(a, out)
