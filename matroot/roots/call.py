"""One :func:`matroot.inv_root` call, resolved once into a frozen value every later layer reads.

:func:`resolve_call` validates the options, resolves ``method="auto"``, looks the
method up in the registry, stages the dtypes (compute, matmul operands) and fills in
the defaults (``tol`` from ``rtol`` or the registry, ``max_iter``). The stack solve
(:mod:`matroot.roots.stack_solve`), the check and the repair read the :class:`RootCall`
instead of deriving any of it again.
"""

from __future__ import annotations

import warnings
import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import _xp
from .._checks import (COMPUTE_DTYPES, FALLBACKS, MATMUL_DTYPES, SCALINGS, check_choice,
                       check_matmul_dtype, check_max_iter, check_nonnegative, check_p)
from ..certify.accuracy import (BUCKET_SLACK, KAPPA_BUCKETS, check_rtol, is_converged,
                                measured_unseen, row_target, rtol_allowance, unit_roundoff,
                                within_rtol)
from ..spectrum.lambda_max_bounds import BOUND_CERTIFICATES, DEFAULT_BOUND_CERTIFICATE
from ..certify.probes import FROBENIUS_FACTOR
from .result import ConvergenceWarning
from ..solvers import get_solver
from ..solvers.auto import choose_method
from ..solvers.fixed_steps import MAX_FIXED_STEPS, FixedPlan, certifiable_kappa, fixed_plan
from ..spectrum.lambda_max_bounds import schatten_overestimate
from ..solvers.registry import SolverSpec, check_method, require_dtypes, require_support
from ..certify.verify import CERTIFICATES, DEFAULT_CERTIFICATE

__all__ = ["RootCall", "resolve_call", "check_keywords", "default_max_iter", "STEPS",
           "VERDICTS", "compiled_call"]


@dataclass(frozen=True)
class RootCall:
    """Everything an ``inv_root`` call decided before it touches the stack.

    Hashable (a JAX compile key): two equal calls compile to the same program.

    Attributes
    ----------
    solver : SolverSpec
        The method's registry entry (``"auto"`` already resolved).
    p : int or float
        Root order (integral values as int).
    eps : float
        Ridge (in a compiled program's key 0.0, the value passed traced: see
        :func:`compiled_call`).
    has_ridge : bool
        ``eps > 0``: what the code's structure depends on (a new ``eps`` of the same
        sign compiles nothing new).
    scaling : {"power", "frobenius", "schatten"}
        How λmax is bounded.
    tol : float
        Per-matrix stop threshold of the iteration (0: exactly ``max_iter`` steps).
    rtol : float or None
        The accuracy target ``converged`` promises; None: the accuracy table.
    max_iter : int
        Iteration (or degree) cap.
    work_dtype : {"float32", "float64"}
        The compute dtype.
    matmul_dtype : {None, "float16", "bfloat16"}
        Dtype of matmul operands.
    certificate : {"deterministic", "randomized"}
        How the returned root is checked.
    bound_certificate : {"randomized", "cholesky"}
        How the Lanczos estimate of λmax becomes the upper bound that scales the
        stack (``scaling="power"`` only).
    fallback : {None, "evd"}
        Method that re-solves the matrices whose check failed.
    fixed : FixedPlan or None
        The steps of a fixed-step solve (:mod:`matroot.solvers.fixed_steps`), or None
        for the adaptive loop with its batched stop checks.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.roots.call import resolve_call
    >>> call = resolve_call(np, np.eye(3, dtype=np.float32), 2, method="newton_db", rtol=1e-2)
    >>> call.method, call.work_dtype, call.tol, call.precision
    ('newton_db', 'float32', 0.00125, 'float32')
    """

    solver: SolverSpec
    p: int | float
    eps: float
    scaling: str
    tol: float
    rtol: float | None
    max_iter: int
    work_dtype: str
    matmul_dtype: str | None
    certificate: str
    bound_certificate: str
    fallback: str | None
    has_ridge: bool = False
    fixed: FixedPlan | None = None

    def _replace_fallback(self, fallback: str | None) -> RootCall:
        """This call with another fallback."""
        return dataclasses.replace(self, fallback=fallback)

    @property
    def method(self) -> str:
        """The method's name."""
        return self.solver.name

    @property
    def precision(self) -> str:
        """The accuracy table's precision: the matmul operands' dtype where they are
        16-bit, else the compute dtype."""
        if self.solver.forms_matmuls and self.matmul_dtype is not None:
            return self.matmul_dtype
        return self.work_dtype

    def unit_roundoff(self, xp) -> float:
        """u of the compute dtype."""
        return unit_roundoff(xp, getattr(xp, self.work_dtype))

    def certifies(self, error_estimate, kappa, n: int):
        """Per matrix, whether ``error_estimate`` is within :meth:`accuracy` (in two
        operations for a target ``rtol`` and a first-order estimate:
        :func:`matroot.certify.accuracy.within_rtol`)."""
        if self.rtol is not None and self.solver.iterative:
            return within_rtol(error_estimate, self.rtol, kappa, self.p,
                               self.unit_roundoff(_xp.array_namespace(kappa)))
        return is_converged(True, True, error_estimate, self.accuracy(kappa, n))

    def accuracy(self, kappa, n: int):
        """Per matrix of size ``n``, the error estimate ``converged`` allows.

        The table's target for each κ (:func:`matroot.certify.accuracy.row_target`), whose
        entries hold the first-order estimate's undershoot where they were measured
        (κ ≤ 1e6), less what an iterative method's estimate cannot see near the
        rounding floor (``measured_unseen(n)·u·κ/p``). Any other target — a caller's
        ``rtol``, a ``tol`` looser than the table where the table's measurements do not
        reach (within them it is held as the table's targets are), the last column's target past
        κ = 1e6, every target with the randomized λmax bound (its scaling stalls some
        iterations nearer the rounding floor) — is certified by an iterative method's
        estimate only as :func:`matroot.certify.accuracy.rtol_allowance` allows (half of it
        less the check's rounding ``u·κ/p``)."""
        xp = _xp.array_namespace(kappa)
        first_order = self.solver.iterative
        unit = self.unit_roundoff(xp)
        if self.rtol is not None:
            return rtol_allowance(self.rtol, kappa, self.p, unit, first_order)
        target = row_target(self.solver.accuracy_row, self.precision, self.p, kappa)
        if not first_order:
            return xp.maximum(target, xp.full_like(target, self.tol))
        unmeasured = kappa > KAPPA_BUCKETS[-1] * BUCKET_SLACK
        if self.bound_certificate == "randomized":
            unmeasured = xp.ones_like(unmeasured)
        measured = target - measured_unseen(n) * unit * kappa / self.p
        guarded = xp.where(unmeasured, rtol_allowance(target, kappa, self.p, unit, True),
                           measured)
        if self.tol <= 0:
            return guarded
        # A looser tol is a target held as the table's are (less the unseen part where
        # measured, else as rtol is), never taken as it stands (issue 36).
        loose = xp.where(unmeasured, rtol_allowance(self.tol, kappa, self.p, unit, True),
                         self.tol - measured_unseen(n) * unit * kappa / self.p)
        return xp.where(self.tol > target, xp.maximum(guarded, loose), guarded)


def default_max_iter(method: str) -> int:
    """The iteration cap (degree cap for chebyshev) used when none is given.

    Parameters
    ----------
    method : str
        A registered solver name (not ``"auto"``), e.g. ``"minimax"``.

    Returns
    -------
    int

    Examples
    --------
    >>> import matroot
    >>> matroot.default_max_iter("coupled_newton")
    60
    """
    return get_solver(method).default_max_iter


#: ``scaling`` values of a root call: the Krylov-based bound, the Frobenius norm, and
#: the Schatten-8 norm (:func:`matroot.spectrum.lambda_max_bounds.schatten_lambda_max`).
ROOT_SCALINGS = (*SCALINGS, "schatten")


#: Where a call's verdict is decided: read once on the host at the end of the call
#: ("host": non-finite input raises, warnings, the fallback re-solves only the
#: matrices that failed), or left on the device ("device": no host read at all;
#: non-finite input gives NaN roots with converged=False, the fallback is solved for
#: the whole stack and taken with a per-matrix select).
VERDICTS = ("host", "device")
#: ``steps`` values: the fixed-step rule where the call allows it on an accelerator
#: ("auto"), always ("fixed": a ValueError where the call does not allow it), never.
STEPS = ("auto", "fixed", "adaptive")
#: The keywords that take one of a list of values, and their lists.
_CHOICES = {"scaling": ROOT_SCALINGS, "matmul_dtype": MATMUL_DTYPES,
            "compute_dtype": COMPUTE_DTYPES, "fallback": FALLBACKS,
            "certificate": CERTIFICATES, "bound_certificate": BOUND_CERTIFICATES,
            "steps": STEPS, "verdict": VERDICTS}


def check_keywords(**keywords) -> dict:
    """The checks of :func:`matroot.inv_root`'s keywords that need no array, for the
    keywords given (``scaling``, ``tol``, ``rtol``, ``max_iter``, ``matmul_dtype``,
    ``compute_dtype``, ``fallback``, ``certificate``, ``bound_certificate``, ``steps``,
    ``verdict``): the values, ``tol`` and ``rtol`` as floats and ``max_iter`` as an int.

    ``rtol`` is held to the floor of ``compute_dtype`` where it is given, else of
    float64 (the call checks it again against the dtype it computes in). Every caller
    that takes these keywords ahead of a call (:class:`matroot.optim.RootOptions`)
    checks them here, as the call does.

    Raises
    ------
    ValueError, TypeError
        A value :func:`matroot.inv_root` refuses, or a keyword it does not take.

    Examples
    --------
    >>> from matroot.roots.call import check_keywords
    >>> check_keywords(tol=0, steps="fixed")
    {'tol': 0.0, 'steps': 'fixed'}
    >>> check_keywords(verdict="later")
    Traceback (most recent call last):
    ...
    ValueError: verdict='later' is not one of 'host', 'device'
    """
    checked = dict(keywords)
    for name, value in keywords.items():
        if name in _CHOICES:
            if not (name == "scaling" and value is None):
                check_choice(value, name, _CHOICES[name])
        elif name == "tol":
            checked[name] = None if value is None else check_nonnegative(value, "tol")
        elif name == "max_iter":
            checked[name] = check_max_iter(value)
        elif name == "rtol":
            if value is not None:
                dtype = keywords.get("compute_dtype") or "float64"
                checked[name] = check_rtol(value, unit_roundoff(np, getattr(np, dtype)))
        else:
            raise TypeError(f"{name!r} is not a keyword of inv_root these checks cover")
    if keywords.get("matmul_dtype") is not None and keywords.get("compute_dtype") == "float64":
        check_matmul_dtype(np, keywords["matmul_dtype"], "float64")
    return checked


def resolve_call(xp, a, p, *, method: str = "auto", eps: float = 0.0,
                 scaling: str | None = None,
                 tol: float | None = None, rtol: float | None = None,
                 max_iter: int | None = None, matmul_dtype: str | None = None,
                 compute_dtype: str | None = None, fallback: str | None = None,
                 certificate: str = DEFAULT_CERTIFICATE,
                 bound_certificate: str = DEFAULT_BOUND_CERTIFICATE,
                 caller_bounds: bool = False, steps: str = "auto",
                 fixed_on_any_device: bool = False) -> RootCall:
    """Validate an ``inv_root`` call's options and decide everything they leave open.

    Parameters
    ----------
    xp : namespace
        The array namespace of ``a`` (from :func:`matroot._checks.check_stack`).
    a : array, shape (..., n, n)
        The validated stack (its dtype and backend pick the defaults).
    p, method, eps, scaling, tol, rtol, max_iter, matmul_dtype, compute_dtype, fallback
        As in :func:`matroot.inv_root`.
    certificate, bound_certificate
        As in :func:`matroot.inv_root`.
    caller_bounds : bool
        Whether the caller gave λmax or λmin bounds (then the adaptive path runs).
    steps : {"auto", "fixed", "adaptive"}
        As in :func:`matroot.inv_root`.
    fixed_on_any_device : bool
        Let ``steps="auto"`` choose fixed steps on a CPU too (the optimizer's rule:
        :mod:`matroot.optim.shampoo_core.root_options`).

    Returns
    -------
    RootCall

    Raises
    ------
    ValueError
        For any option the call cannot take, with what to pass instead.
    """
    check_method(method)
    p = check_p(p)
    require_support(method, p)
    eps = check_nonnegative(eps, "eps")
    checked = check_keywords(scaling=scaling, tol=tol, max_iter=max_iter,
                             compute_dtype=compute_dtype, fallback=fallback,
                             certificate=certificate, bound_certificate=bound_certificate,
                             steps=steps)
    tol, max_iter = checked.get("tol"), checked.get("max_iter")
    explicit_tol = tol
    if compute_dtype == "float64" and not _xp.has_float64(xp):
        raise ValueError("compute_dtype='float64' needs JAX's float64: enable it with "
                         "jax.config.update('jax_enable_x64', True) (or JAX_ENABLE_X64=1)")
    work_dtype = compute_dtype or _xp.work_dtype_name(xp, a.dtype)
    matmul_dtype = check_matmul_dtype(xp, matmul_dtype, work_dtype)
    if method == "auto":
        method = choose_method(xp, a, p, matmul_dtype=matmul_dtype,
                               fixed_steps=rtol is not None and steps != "adaptive")
        if method == "evd" and work_dtype == "float32" and not _xp.has_float64(xp):
            warnings.warn(  # a real p: evd is the only method (at trace time under jit)
                f"method='auto' for p={p} runs 'evd', and JAX without float64 gives it no "
                "float64 eigh: its float32 roots are certified only to κ ≈ 12·p, the "
                "others come back converged=False; enable jax_enable_x64",
                ConvergenceWarning, stacklevel=4)
    solver = get_solver(method)
    require_dtypes(solver, work_dtype, matmul_dtype)
    if eps > float(xp.finfo(getattr(xp, work_dtype)).max) / 4:
        raise ValueError(f"eps={eps:g} is beyond the range of the {work_dtype} computation "
                         "(A + eps·I would overflow); pass a smaller eps, or float64 "
                         "input or compute_dtype='float64'")
    if rtol is not None:
        rtol = check_rtol(rtol, unit_roundoff(xp, getattr(xp, work_dtype)))
    if tol is None and rtol is not None and not solver.iterative:
        tol = rtol
    elif tol is None and rtol is not None:
        # The randomized check's estimate is up to its Frobenius factor above the
        # deterministic one: the iteration aims that much lower to meet it.
        margin = FROBENIUS_FACTOR if certificate == "randomized" else 1.0
        tol = rtol * solver.rtol_stop_fraction / margin
    elif tol is None:
        tol = solver.default_tol[work_dtype]
    plan = _resolve_steps(xp, a, steps, solver, p, rtol=rtol, tol=tol,
                          explicit_tol=explicit_tol, max_iter=max_iter,
                          matmul_dtype=matmul_dtype, certificate=certificate,
                          scaling=scaling, caller_bounds=caller_bounds, work_dtype=work_dtype,
                          any_device=fixed_on_any_device)
    if scaling is None:
        scaling = "schatten" if plan is not None else "power"
    return RootCall(solver=solver, p=p, eps=eps, scaling=scaling, tol=tol, rtol=rtol,
                    max_iter=solver.default_max_iter if max_iter is None else max_iter,
                    work_dtype=work_dtype, matmul_dtype=matmul_dtype,
                    certificate=certificate, bound_certificate=bound_certificate,
                    fallback=fallback, has_ridge=eps > 0, fixed=plan)


def _resolve_steps(xp, a, steps: str, solver, p, *, rtol, tol, explicit_tol, max_iter,
                   matmul_dtype, certificate, scaling, caller_bounds, work_dtype,
                   any_device: bool = False):
    """The fixed plan of this call, or None for the adaptive loop."""
    if steps == "adaptive":
        return None
    needs = [why for why, missing in (
        (f"a method with a fixed-step rule (not {solver.name!r})", not solver.fixed_steps),
        ("rtol= (the target fixes the step count)", rtol is None),
        ("no tol= or max_iter= (they ask for the adaptive loop)",
         explicit_tol is not None or max_iter is not None),
        ("matmul_dtype=None", matmul_dtype is not None),
        ("certificate='deterministic'", certificate != "deterministic"),
        ("scaling='schatten' or None (a scale whose overestimate is known)",
         scaling not in (None, "schatten")),
        ("no lambda_max_upper= or lambda_min_lower=", caller_bounds)) if missing]
    if steps == "auto" and (needs or work_dtype != "float32"
                            or not (any_device or _xp.is_accelerator(xp, a))):
        return None
    if needs:
        raise ValueError("steps='fixed' needs " + "; ".join(needs))
    plan = _fixed_plan(solver.name, p, rtol, tol, a.shape[-1],
                       unit_roundoff(xp, getattr(xp, work_dtype)))
    if plan is None and steps == "fixed":
        raise ValueError(f"steps='fixed': {solver.name} would need more than "
                         f"{MAX_FIXED_STEPS} steps in a stage for rtol={rtol:g}; pass "
                         "steps='adaptive' or a smaller rtol")
    return plan


@_xp.host_constant
def _fixed_plan(method: str, p, rtol: float, tol: float, n: int, unit: float):
    """The fixed-step rule (:mod:`matroot.solvers.fixed_steps`): the steps that bring every
    eigenvalue of a scaled spectrum down to ``1/(κ_max·overestimate)`` to ``tol``, where
    ``κ_max`` is the largest κ a root can be certified at for ``rtol``."""
    lower = 1.0 / (certifiable_kappa(p, rtol, unit) * schatten_overestimate(n, unit))
    return fixed_plan(method, p, lower, tol, unit)


def compiled_call(solve, a, call: RootCall, dynamic: dict | None = None, **static):
    """``solve(a, call=call, **dynamic, **static)`` as one ``jax.jit`` program (eager
    JAX), compiled once per ``call`` less its ``eps``: the ridge is a traced argument
    (data, not structure: ``call.has_ridge`` is the structure), so a caller whose eps
    changes from call to call, or who sweeps it, compiles once, not once per value."""
    return _xp.jax_compiled(_with_ridge, a, dict(dynamic or {}, eps=call.eps), solve=solve,
                            call=dataclasses.replace(call, eps=0.0), **static)


def _with_ridge(a, *, eps, solve, call: RootCall, **options):
    return solve(a, call=dataclasses.replace(call, eps=eps), **options)
