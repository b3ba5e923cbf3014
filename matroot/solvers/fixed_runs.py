"""The iterations run for a fixed step count (:mod:`matroot.solvers.fixed_steps`): straight-line
products, no norm, no comparison, no select, nothing read back.

Every step is written in the fewest backend operations: each scale-and-add rides on
a product (``beta·C + alpha·(A@B)``, one ``baddbmm`` on torch through
:func:`matroot._xp.add_product`; NumPy and JAX form the plain expression, which XLA
fuses) or on one ``add`` with a Python ``alpha`` (:func:`matroot._xp.add_scaled`), and
Python scalars that multiply a whole iterate are carried on the host and folded into
the next product's ``alpha`` instead of being applied. Operations per step on torch
(``n×n`` products and full-size passes):

==============  ===========  ===============================
method          first step   later steps
==============  ===========  ===============================
minimax         3            5 (``ZY − I``, ``I + cD``, ``q``, ``Y·q``, ``q·Z``)
newton_db       2            3 (``E``, ``Y·E``, ``E·Z``)
coupled_newton  1 + log₂p+1  2 + ⌊log₂p⌋ + popcount(p) (``N``, ``X·N``, ``N^p·M``)
==============  ===========  ===============================

A stage's last step forms only what is used next (``Z`` in the last stage, ``Y`` in
the others): one product fewer for minimax and newton_db; coupled Newton's last step
forms no new ``M`` (``log₂p + 1`` products fewer at p a power of two).

Each run returns the root of the scaled stack as ``(matrix, host_factor)``: the root is
``host_factor · matrix``; the factors carried on the host (and a factor the caller asks
for, ``out_factor``) ride on the run's last product, so ``host_factor`` is 1 wherever
the run has one.
"""

from __future__ import annotations

from .. import _xp
from .._xp import matrix_power
from .fixed_steps import FixedPlan

__all__ = ["run_fixed"]


def _identity_like(a):
    xp = _xp.array_namespace(a)
    return _xp.shared_identity(xp, a.shape[-1], a.dtype, _xp.device_of(a))


def _product(matmul, eye, a, b, alpha: float):
    """``alpha·(a @ b)``: the factor rides on the product (``beta = 0``)."""
    return matmul(a, b) if alpha == 1.0 else matmul.added(eye, a, b, beta=0.0, alpha=alpha)


def _minimax_stage(a, a_factor, rows, eye, matmul, *, last: bool, out_factor: float):
    """One square-root stage of ``c = a_factor·a``: ``(Y, y_factor, Z, z_factor)`` with
    ``y_factor·Y → c^(1/2)`` and ``z_factor·Z → out_factor·c^(-1/2)``, by the stage's
    quintics ``q = α + βD + γD²`` about ``D = ZY − I``, written
    ``αI + β·D·(I + (γ/β)·D)``. The last step forms only what is used next: ``Z`` in
    the ``last`` stage (Y is None; ``out_factor`` rides on its product, so ``z_factor``
    is 1 unless the stage is one step), ``Y`` in the others (Z is None)."""
    y = z = None
    y_factor = a_factor
    final = len(rows) - 1
    for k, (alpha, beta, gamma) in enumerate(rows):
        if k == 0:
            # From Z = I, Y = c: q(c) = c₀I + c₁c + c₂c² = c₀·(I + (c₁/c₀)·c) + c₂·c²
            # (c₀ = q(0) > 0, the growth of the smallest eigenvalue), in two operations.
            c0, c1, c2 = alpha - beta + gamma, beta - 2 * gamma, gamma
            inner = _xp.add_scaled(eye, c1 * a_factor / c0, a)
            q = matmul.added(inner, a, a, beta=c0, alpha=c2 * a_factor ** 2)
            y, z = (None if k == final and last else matmul(a, q)), q
            continue
        d = matmul.added(eye, z, y, beta=-1.0, alpha=y_factor)
        if beta != 0:
            inner = _xp.add_scaled(eye, gamma / beta, d)
            q = matmul.added(eye, d, inner, beta=alpha, alpha=beta)
        else:
            q = matmul.added(eye, d, d, beta=alpha, alpha=gamma)
        y = None if k == final and last else matmul(y, q)
        if k == final and last:
            return y, y_factor, _product(matmul, eye, q, z, out_factor), 1.0
        z = None if k == final else matmul(q, z)
    return y, y_factor, z, out_factor


def _minimax(a, a_factor, p, plan: FixedPlan, matmul, out_factor):
    eye = _identity_like(a)
    final = len(plan.coefficients) - 1
    for stage, rows in enumerate(plan.coefficients):
        a, a_factor, z, z_factor = _minimax_stage(
            a, a_factor, rows, eye, matmul, last=stage == final,
            out_factor=1.0 if p == 1 else out_factor)
    if p == 1:
        return _product(matmul, eye, z, z, out_factor), 1.0
    return z, z_factor


def _newton_schulz_stage(a, a_factor, steps, eye, matmul, *, last: bool, out_factor: float):
    """``(Y, y_factor, Z, z_factor)`` for ``c = a_factor·a``: ``E = (3I − ZY)/2``,
    ``Y ← YE``, ``Z ← EZ``; ``E`` is formed as ``I − ZY/3`` and its 3/2 carried on
    the host into the next products, as are the factors of ``Y`` and ``Z``. The last
    step forms only what is used next (``Z`` in the ``last`` stage, else ``Y``); in
    the ``last`` stage ``z_factor·Z → out_factor·c^(-1/2)``, the factor on its last
    product (``z_factor`` 1) where the stage has more than one step."""
    y, z, y_factor, z_factor = a, None, a_factor, 1.0
    for k in range(steps):
        if k == 0:
            e = _xp.add_scaled(eye, -a_factor / 3.0, a)
        else:
            e = matmul.added(eye, z, y, alpha=-y_factor * z_factor / 3.0)
        final = k == steps - 1
        y = None if final and last else matmul(y, e)
        y_factor, z_factor = y_factor * 1.5, z_factor * 1.5
        if final and last and k > 0:
            return y, y_factor, _product(matmul, eye, e, z, z_factor * out_factor), 1.0
        z = e if k == 0 else (None if final and not last else matmul(e, z))
    return y, y_factor, z, z_factor * (out_factor if last else 1.0)


def _newton_db(a, a_factor, p, plan: FixedPlan, matmul, out_factor):
    eye = _identity_like(a)
    final = len(plan.steps) - 1
    for stage, steps in enumerate(plan.steps):
        a, a_factor, z, z_factor = _newton_schulz_stage(
            a, a_factor, steps, eye, matmul, last=stage == final,
            out_factor=1.0 if p == 1 else out_factor)
    if p == 1:
        return _product(matmul, eye, z, z, z_factor * z_factor * out_factor), 1.0
    return z, z_factor


def _coupled_newton(a, a_factor, p, plan: FixedPlan, matmul, out_factor):
    """``X₀ = t^(1/p)·I``, ``M₀ = t·c``; ``N = ((p+1)I − M)/p`` is formed as
    ``I − M/(p+1)`` and its ``(p+1)/p`` carried on the host, as is ``M``'s factor;
    the root's factor (times ``out_factor``) rides on the last product."""
    eye = _identity_like(a)
    t = (p + 1) / 2
    grow = (p + 1) / p
    steps = plan.steps[0]
    x, x_factor = None, t ** (1.0 / p) * out_factor
    m, m_factor = a, t * a_factor
    for step in range(steps):
        n = _xp.add_scaled(eye, -m_factor / (p + 1), m)
        x_factor *= grow
        if x is None:
            x = n
        elif step == steps - 1:
            x, x_factor = _product(matmul, eye, x, n, x_factor), 1.0
        else:
            x = matmul(x, n)
        if step < steps - 1:  # the last step's M is not used
            m = matmul(matrix_power(n, p, matmul), m)
            m_factor *= grow ** p
    return x, x_factor


_RUNS = {"minimax": _minimax, "newton_db": _newton_db, "coupled_newton": _coupled_newton}


def run_fixed(method: str, a, p: int, plan: FixedPlan, matmul, *, a_factor: float = 1.0,
              out_factor: float = 1.0):
    """``(matrix, host_factor)`` with ``host_factor·matrix ≈ out_factor·(a_factor·a)^(-1/p)``
    after the plan's steps (``a_factor``, ``out_factor``: host scalars the products take,
    not passes). The root's factor rides on the run's last product: ``host_factor`` is 1
    except where that product does not exist (a run of one step).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot import _xp
    >>> from matroot.solvers.fixed_steps import fixed_plan
    >>> from matroot.solvers.fixed_runs import run_fixed
    >>> a = np.diag([1.0, 0.25, 0.01])[None]
    >>> plan = fixed_plan("coupled_newton", 2, 0.01, 1e-10, 2.0 ** -53)
    >>> x, factor = run_fixed("coupled_newton", a, 2, plan, _xp.Matmul(np))
    >>> factor, np.round(np.diag(x[0]), 8).tolist()
    (1.0, [1.0, 2.0, 10.0])
    """
    return _RUNS[method](a, a_factor, p, plan, matmul, out_factor)
