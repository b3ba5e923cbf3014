"""The public entry points: resolve the call once (:mod:`matroot.roots.call`), solve the
stack (:mod:`matroot.roots.stack_solve`: regularise → scale → solve → unscale → judge),
repair what failed, warn."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import warnings
from typing import Any

from .. import _xp
from . import stack_solve
from .verdict import repair, repair_on_device, solve_fixed, warn_cast
from .._checks import check_bound, check_choice, check_flag, check_stack
from .._typing import Array
from .call import VERDICTS, RootCall, compiled_call, default_max_iter, resolve_call
from .gradient import inv_root_derivative
from .result import ConvergenceWarning, InvRootResult, empty_result, reshaped
from ..solvers import get_solver
from ..spectrum.lambda_max_bounds import DEFAULT_BOUND_CERTIFICATE
from ..certify.verify import DEFAULT_CERTIFICATE

__all__ = ["inv_root", "inv_root_info", "InvRootResult", "ConvergenceWarning",
           "default_tol", "default_max_iter", "VERDICTS"]


def default_tol(method: str, compute_dtype: str) -> float:
    """The ``tol`` that ``method`` uses when none is given, for float32 or float64.

    Parameters
    ----------
    method : str
        A registered solver name (not ``"auto"``), e.g. ``"minimax"``.
    compute_dtype : {"float32", "float64"}
        The dtype the solver computes in.

    Returns
    -------
    float

    Examples
    --------
    >>> import matroot
    >>> matroot.default_tol("newton_db", "float32")
    1e-05
    """
    solver = get_solver(method)
    check_choice(compute_dtype, "compute_dtype", solver.compute_dtypes)
    return solver.default_tol[compute_dtype]


def _with_signature_of(source):
    """Show ``source``'s parameters for the decorated ``f(a, /, p, **options)`` (in
    ``help()``, ``inspect`` and Sphinx), so both are declared and validated once."""
    def decorate(func):
        own = inspect.signature(func)
        func.__signature__ = inspect.signature(source).replace(
            return_annotation=own.return_annotation)
        return func

    return decorate


def inv_root_info(a: Array, /, p: float, *, method: str = "auto", eps: float = 0.0,
                  scaling: str | None = None, tol: float | None = None,
                  rtol: float | None = None, max_iter: int | None = None,
                  matmul_dtype: str | None = None,
                  check_finite: bool = True, compute_dtype: str | None = None,
                  fallback: str | None = None, lambda_max_upper: Any = None,
                  lambda_min_lower: Any = None,
                  certificate: str = DEFAULT_CERTIFICATE,
                  bound_certificate: str = DEFAULT_BOUND_CERTIFICATE,
                  verdict: str = "host", steps: str = "auto") -> InvRootResult:
    """:func:`inv_root` with per-matrix diagnostics.

    Takes the same arguments as :func:`inv_root`.

    Returns
    -------
    InvRootResult
        ``root`` plus per-matrix ``residual``, ``iterations``, ``converged``,
        ``lambda_max`` and ``matmuls`` arrays of shape ``a.shape[:-2]``, and the
        ``method`` that ran.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.stack([np.diag([1.0, 4.0]), np.diag([9.0, 9.0])])
    >>> res = matroot.inv_root_info(a, 2, method="coupled_newton")
    >>> res.converged.tolist(), res.iterations.shape
    ([True, True], (2,))
    """
    return _info(a, p, method=method, eps=eps, scaling=scaling, tol=tol, rtol=rtol,
                 max_iter=max_iter, matmul_dtype=matmul_dtype, check_finite=check_finite,
                 compute_dtype=compute_dtype, fallback=fallback,
                 lambda_max_upper=lambda_max_upper, lambda_min_lower=lambda_min_lower,
                 certificate=certificate, bound_certificate=bound_certificate,
                 verdict=verdict, steps=steps)[0]


def _info(a, p, *, method, eps, scaling, tol, rtol, max_iter, matmul_dtype, check_finite,
          compute_dtype, fallback, lambda_max_upper, lambda_min_lower, certificate,
          bound_certificate, verdict, steps):
    """:func:`inv_root_info` and the number of matrices that failed, read on the host with
    the verdict (None where nothing was read: a traced call, the device verdict)."""
    xp = check_stack(a)
    check_choice(verdict, "verdict", VERDICTS)
    check_finite = check_flag(check_finite, "check_finite")
    _xp.refuse_torch_func(a, "inv_root")
    if _xp.is_jax_namespace(xp):
        _xp.register_jax_pytree(InvRootResult, ("method", "failure_probability"))
    differentiated, a = a, _xp.without_gradient(a)
    call = resolve_call(xp, a, p, method=method, eps=eps, scaling=scaling, tol=tol, rtol=rtol,
                        max_iter=max_iter, matmul_dtype=matmul_dtype,
                        compute_dtype=compute_dtype, fallback=fallback,
                        certificate=certificate, bound_certificate=bound_certificate,
                        caller_bounds=lambda_max_upper is not None
                        or lambda_min_lower is not None, steps=steps)
    batch = tuple(a.shape[:-2])
    n = a.shape[-1]
    traced = _xp.is_traced(a)
    on_device = traced or verdict == "device"
    if traced and fallback is not None:
        raise ValueError("fallback= re-solves the matrices that failed their check, which "
                         "reads them from the host: not possible under jax.jit or "
                         "torch.compile. Pass fallback=None and re-solve where "
                         "result.converged is False outside the compiled function")
    b = math.prod(batch)
    if b == 0 or n == 0:
        return empty_result(xp, a, batch, call.method), None

    bounds = {name: check_bound(value, name, xp, batch, traced=traced) for name, value in
              (("lambda_max_upper", lambda_max_upper), ("lambda_min_lower", lambda_min_lower))}
    with _xp.solve_context(xp, a):
        if call.fixed is not None:
            result, failed = solve_fixed(a, xp, call, batch, b, n, on_device, check_finite,
                                         inv_root_info)
            if result is None:  # out of the fixed path's range: the adaptive path's call
                result = _solved(a, xp, dataclasses.replace(call, fixed=None), batch, b, n,
                                 traced, check_finite, bounds)
        elif on_device and not traced:
            # The adaptive path, every decision on the device (its traced code paths:
            # all max_iter steps with per-matrix freezing, no early exit).
            with _xp.host_reads_off():
                result = _solved(a, xp, call._replace_fallback(None), batch, b, n, True,
                                 check_finite, bounds)
                if call.fallback is not None:
                    flat = reshaped(xp, result, (b,))
                    usable = xp.isfinite(flat.lambda_max) & (flat.lambda_max > 0)
                    result = reshaped(xp, repair_on_device(
                        xp.reshape(a, (b, n, n)), flat, usable, call, inv_root_info), batch)
            failed = None
        else:
            result, failed = _solved(a, xp, call, batch, b, n, traced, check_finite, bounds), None
    if not _xp.gradient_flows(differentiated):
        return result, failed
    # The solve ran untracked; the root's derivative is the exact one (matroot.roots.gradient).
    return result._replace(root=_xp.with_gradient(
        differentiated, result.root,
        functools.partial(inv_root_derivative, p=float(call.p), eps=float(call.eps)))), failed


def _solved(a, xp, call: RootCall, batch, b: int, n: int, traced: bool, check_finite: bool,
            bounds: dict) -> InvRootResult:
    """The body of :func:`inv_root_info` after its arguments are checked."""
    if _xp.is_jax_namespace(xp) and (call.solver.needs_scaling or not traced):
        # Eager JAX dispatches, and first compiles, every operation on its own: one
        # compiled call per shape is faster from the first call on (evd's eager call
        # lowered ~120 programs, 20-40 s on a 2-core CPU; its float32 screen and float64
        # retry then decide on the device, matrix by matrix as eagerly). Traced, the
        # same cached program for the iterative methods: an eager jax.vmap re-traced and
        # re-compiled the solve's loops at every call (3 programs, 4-13 s a call), and
        # under jax.jit it is traced once per shape, not at every trace of the caller.
        if check_finite and not traced and not bool(xp.all(xp.isfinite(a))):
            raise ValueError(stack_solve.NONFINITE_INPUT)
        result, usable, cast_trouble, rtol_floor = compiled_call(
            stack_solve.solve_stack, a, call, bounds, check_finite=False,
            eager_program=not traced)
    else:
        result, usable, cast_trouble, rtol_floor = stack_solve.solve_stack(
            a, call=call, check_finite=check_finite, **bounds)
    if not traced and bool(cast_trouble):
        warn_cast(a, call)
    if not traced and call.fallback is None and float(rtol_floor) > 0:
        # One message per rtol and dtype (no per-call numbers), so Python's default
        # filter shows it once per calling line, not at every refresh of an optimizer.
        warnings.warn(
            f"inv_root_info: rtol={call.rtol:g} is below what {call.work_dtype} can "
            "certify for some matrices (their rounding u·κ/p is larger), so they are "
            "converged=False; pass compute_dtype='float64', fallback='evd', or a looser "
            "rtol", ConvergenceWarning, stacklevel=3)
    if call.fallback is not None:
        result = repair(xp.reshape(a, (b, n, n)), result, usable, call, inv_root_info)
    return reshaped(xp, result, batch)


@_with_signature_of(inv_root_info)
def inv_root(a: Array, /, p: float, **options: Any) -> Array:
    """Inverse p-th root ``(A + eps·I)^(-1/p)`` of every matrix in a stack.

    Parameters
    ----------
    a : array, shape (..., n, n)
        Symmetric positive (semi)definite matrices of any supported backend
        (NumPy, CuPy, PyTorch, array-api-strict). The symmetric part
        ``(A + Aᵀ)/2`` is used, so rounding-level asymmetry does not matter.
    p : float
        Root order, ``> 0``. Each method states the p it takes in its registry
        entry (the built-in ones: any real p for ``"evd"``, integers for
        ``"coupled_newton"`` and ``"chebyshev"``, powers of two for
        ``"newton_db"`` and ``"minimax"``); another p is a ValueError that names
        the methods that take it.
    method : str
        ``"auto"`` or a registered solver (built in: ``"evd"``, ``"newton_db"``,
        ``"coupled_newton"``, ``"chebyshev"``, ``"minimax"``; see
        :mod:`matroot.solvers.registry`). ``"auto"`` picks by backend, device
        and p (:func:`matroot.choose_method`).
    eps : float
        Ridge added to the diagonal before the root is taken, ``>= 0``.
    scaling : {None, "power", "frobenius", "schatten"}
        How λmax is bounded to scale the spectrum into the solver's basin: a Krylov
        estimate made an upper bound (``bound_certificate``), ``‖A‖_F``, or the
        Schatten-8 norm ``‖A⁴‖_F^(1/4)`` (two products, at most ``n^(1/8)·λmax``).
        Default None: ``"schatten"`` for a fixed-step solve (``steps``), whose step
        count needs a scale whose overestimate is known in advance, else ``"power"``.
    tol : float, optional
        Per-matrix residual at which an iterative solver stops (chebyshev: the
        target relative error of its fit). ``tol=0`` with ``max_iter=k`` runs
        exactly k steps. Default: :func:`matroot.default_tol`, or
        ``rtol·rtol_stop_fraction`` (the method's registry entry; 1/8 for the
        coupled iterations, 1/2 for chebyshev) when ``rtol`` is given, divided
        by :data:`matroot.certify.probes.FROBENIUS_FACTOR` (5.4) with
        ``certificate="randomized"``, whose estimate is that much looser.
    rtol : float, optional
        The accuracy target: the relative Frobenius error
        ``‖X̃ − X‖_F/‖X‖_F`` asked of every root, the quantity the README's
        accuracy table states, in ``(0, 1]`` and at least 10 unit roundoffs of
        the compute dtype. ``tol`` is when the iteration stops, ``rtol`` what
        ``converged`` promises: a root is converged when its certified
        ``error_estimate`` is at most ``rtol`` (``rtol/2`` for the iterative
        methods, whose estimate is first order, and nothing at a κ whose
        rounding ``0.5·u·κ/p`` their check cannot resolve below ``rtol``:
        :func:`matroot.certify.accuracy.rtol_allowance`), and each matrix stops as soon as
        its own residual is below the ``tol`` derived from ``rtol``, so a loose
        target costs fewer products. Default None: the table's target for each
        matrix's κ (or a looser ``tol``), today's behaviour. An ``rtol`` below a
        matrix's rounding ``u·κ/p`` in the compute dtype cannot be certified: that
        matrix is ``converged=False``, and eagerly a ConvergenceWarning (shown once
        per calling line by Python's default filter) names the fixes
        (``compute_dtype="float64"``, ``fallback="evd"``, a looser ``rtol``). Under
        ``jax.jit`` / ``torch.compile`` κ is known only on the device, after the
        bounds, so nothing warns: read ``converged``.
    max_iter : int, optional
        Cap on iterations (on the degree for chebyshev), at most
        :data:`matroot._checks.MAX_ITER_LIMIT` (10,000).
    matmul_dtype : {None, "float16", "bfloat16"}
        Round matmul operands to 16 bits with float32 accumulation.
    check_finite : bool
        Raise ValueError on NaN/Inf input. With False, affected matrices come back
        NaN with ``converged=False`` and the others are unaffected.
    compute_dtype : {None, "float32", "float64"}
        Dtype of the computation. Default: float64 for ``"evd"`` and for float64
        input, else float32 (16-bit inputs are computed in float32).
    fallback : {None, "evd"}
        Re-solve the matrices whose a-posteriori check failed with this method in
        float64 (``InvRootResult.repaired`` says which). Default None: nothing is
        re-solved, failures are reported (``converged=False``, a warning). Its
        cost is one float64 eigh per failed matrix, and nothing when all pass.
    lambda_max_upper : float or array of shape ``a.shape[:-2]``, optional
        A certified upper bound on λmax(A + eps·I) that you already know (e.g.
        carried from a previous refresh: λmax(β·L + (1−β)·GGᵀ) ≤ β·λmax(L) +
        (1−β)·‖G‖²_F). Then no bound is computed, and no Lanczos run is made
        where no λmin estimate is needed (``lambda_min_lower`` given, or a method
        that takes no λmin or takes the ridge eps as one): the check's κ is then
        the smaller of the bounds' ratio and a power estimate from the root
        (:func:`matroot.certify.verify.kappa_from_root`, 40 matrix-vector products). A
        wrong (too small) bound is caught by the check of the root: the matrix
        is ``converged=False``, never a wrong root reported converged. An entry
        of an array that is NaN, infinite or ≤ 0 gives its matrix a NaN root with
        ``converged=False`` and leaves the others unchanged (a number must be
        finite and > 0: ValueError).
    certificate : {"deterministic", "randomized"}
        How the returned root is checked (:func:`matroot.certify.verify.verify_root`):
        with every product of its residual formed, or with products of the
        residual and a block of Gaussian vectors only (O(p·n²) per vector instead
        of O(n³); its bounds fail with probability at most 1e-12 per matrix,
        ``InvRootResult.failure_probability``). Both also test X's sign with a
        Cholesky factorisation (even p).
    bound_certificate : {"cholesky", "randomized"}
        How the λmax bound that scales the stack is made one (``scaling="power"``):
        a Lanczos estimate proven by Cholesky tests (n³/3 flops each), or the same
        run's largest Ritz value with Kuczyński and Woźniakowski's margin, below
        λmax with probability at most 1e-12 per matrix
        (:func:`matroot.spectrum.lambda_max_bounds.randomized_lambda_max`; it adds to
        ``InvRootResult.failure_probability`` where the run does not span the
        whole space). A bound that falls short costs convergence, never a wrong
        root reported converged: the check judges the root.
    lambda_min_lower : float or array of shape ``a.shape[:-2]``, optional
        A lower bound on λmin(A + eps·I), used by ``minimax`` and ``chebyshev``
        instead of their estimate (never below eps). A bound that is too high is
        caught by the check of the root as well.
    verdict : {"host", "device"}
        ``"host"`` (default): the verdict is read on the host once at the end of
        the call (a fixed-step solve reads nothing else; a second read happens only
        where some matrix failed, to say why): non-finite input raises (with
        ``check_finite``), a ConvergenceWarning is given, ``fallback`` re-solves
        only the failed matrices. ``"device"``: nothing is read on the host, what
        ``jax.jit``, ``torch.compile`` and an optimizer step want: ``converged``
        stays on the device, non-finite input gives NaN roots with
        ``converged=False`` (``check_finite`` is not applied), no warning, and
        ``fallback`` is solved for the whole stack and taken per matrix with a
        select. With ``steps`` adaptive the loop then runs all ``max_iter`` steps,
        freezing each matrix where it stopped.
    steps : {"auto", "fixed", "adaptive"}
        ``"fixed"``: run the number of steps the method's scalar error map needs
        for the largest κ ``rtol`` can be certified at (``p·rtol/u``) and the
        scale's known overestimate, with no stop test, norm or select per step
        (:mod:`matroot.solvers.fixed_steps`; docs/launches.rst). Needs ``rtol``, a
        method with a fixed-step rule (``minimax``, ``newton_db``,
        ``coupled_newton``) and no ``tol``, ``max_iter``, ``matmul_dtype``, caller
        bounds or randomized certificate (a ValueError says which is missing).
        ``"adaptive"``: the loop with batched stop checks. ``"auto"`` (default):
        fixed where the call allows it, in float32, on an accelerator (where a
        solve's time is its launches), else adaptive. A matrix whose entries all
        lie below the compute dtype's normal range is beyond the fixed path's
        power-of-two normalisation: the host verdict then solves the call on the
        adaptive path; the device verdict returns it NaN with ``converged=False``.

    Returns
    -------
    array, shape (..., n, n)
        Same namespace, device, shape and dtype as ``a``. Differentiable (torch
        autograd, ``jax.grad``): the derivative is the exact root's, whatever
        the method (:mod:`matroot.roots.gradient`, docs/jax.rst).

    Raises
    ------
    ValueError
        Bad shape, p, eps, option, or non-finite input with ``check_finite``.
    TypeError
        Integer, boolean or complex input.

    Warns
    -----
    ConvergenceWarning
        When matrices did not converge or came back non-finite; call
        :func:`inv_root_info` to see which.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> a = np.diag([16.0, 81.0])
    >>> np.round(matroot.inv_root(a, 4, method="newton_db"), 6)
    array([[0.5     , 0.      ],
           [0.      , 0.333333]])
    """
    bound = inspect.signature(inv_root_info).bind(a, p, **options)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    result, count = _info(arguments.pop("a"), arguments.pop("p"), **arguments)
    xp = _xp.array_namespace(result.root)
    if _xp.is_traced(result.root) or options.get("verdict") == "device":
        return result.root  # no host read: inv_root_info says which failed
    if count is None:
        count = int(xp.sum(xp.astype(~result.converged, xp.int32)))
    if count:
        warnings.warn(
            f"inv_root(method={result.method!r}): {count} of "
            f"{math.prod(result.converged.shape)} "
            "matrices did not converge or are not positive definite; "
            "inv_root_info tells which", ConvergenceWarning, stacklevel=2)
    return result.root
