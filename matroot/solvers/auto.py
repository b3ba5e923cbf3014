"""The rule behind ``method="auto"``, and the measurements it rests on.

The numbers are from ``python -m bench solvers`` (committed in
``bench/results/``, discussed in ``docs/benchmarks.rst``): float32 stacks with
κ = 1e4, every method at its default tolerance, timed side by side with eigh.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._typing import Array
from .registry import SOLVERS, solvers_supporting

#: On CPUs (NumPy, torch CPU; n = 128…2048, batches of 1…32, p = 2 and 4) the
#: float64 eigh of ``"evd"`` was the fastest method in all 28 configurations:
#: the runner-up took 1.4–3.6× its time. A CPU eigh costs only 7–36 batched
#: matmuls of the same size, fewer than any iteration needs at κ = 1e4.
CPU_METHOD = "evd"

#: On accelerators matmul-only iterations win (DASH, 8×H100, block 1024: EVD
#: 2850 ms per optimizer step against 136–149 ms for coupled Newton, 174–188 ms
#: for Newton-DB), and they run near the matmul floor, so the one with the fewest
#: matmuls is the fastest. Matmul counts do not depend on the device; measured
#: at the default tolerance, κ = 1e4, n = 512: minimax 23 (p = 2) and 38
#: (p = 4), coupled Newton 41 and 51, Newton-DB 45 and 72. The solvers are
#: ranked by their spec's cost model at this κ.
REFERENCE_KAPPA = 1e4

#: Measured on one H200 (bench/results/h200/syncs.log, float32, κ = 1e4, torch):
#: coupled Newton was the fastest matmul-only method at 16 × 256² (p = 2: 16.2 ms
#: against Newton-DB 16.8 and minimax 51.4; p = 4: 16.5 against 60.0 and 57.0)
#: and at 8 × 1024² (32.0 against 33.4 and 54.4; 38.6 against 83.9 and 63.8):
#: there a solve's dispatched operations weigh more than its matmul count, and
#: minimax's Lanczos run (its λmin estimate) and Newton-DB's two stages at p = 4
#: cost more than the matmuls they save.
ACCELERATOR_METHOD = "coupled_newton"

#: JAX without float64 (``jax_enable_x64`` off) on a CPU: evd's float32 eigh meets the
#: table only at κ ≲ 12·p and cannot retry in float64, so it returned converged=False
#: for every matrix at κ = 1e4 (issue 36). Measured there (JAX 0.10.2, jit, float32,
#: κ = 1e4, best of 5, side by side on a 2-core CPU under a load of ~15, so noisy):
#: coupled Newton was fastest at 4 × 128² (p = 2 / 4: 63 / 145 ms against Newton-DB 82 /
#: 241 and minimax 82 / 282) and 16 × 64² p = 4 (28 against 461 and 214), Newton-DB at
#: 16 × 64² p = 2 (15 against 17), minimax at 4 × 256² (721 / 2147 against coupled
#: Newton 1789 / 3080); every matmul method converged on every matrix, evd on none.
NO_FLOAT64_METHOD = "coupled_newton"
#: With an accuracy target ``rtol`` on an accelerator the solve runs a fixed step count
#: (:mod:`matroot.solvers.fixed_steps`): no Lanczos run, no per-step norm, no host read.
#: Counted through torch's dispatcher (docs/benchmarks.rst, ``python -m bench launches``;
#: float32 8 × 384², κ = 1e4, rtol = 5e-3, host verdict), minimax took 83 operations at
#: p = 2 and 103 at p = 4, coupled Newton 125 and 139, Newton–Schulz 110 and 142
#: (DASH's cheapest configuration reaching the same error: 140 and 138). Where minimax
#: does not take p, coupled Newton.
FIXED_STEP_METHOD = "minimax"

#: With 16-bit matmul operands: coupled Newton, which DASH found to tolerate
#: fp16 where Newton–Schulz (Newton-DB) with 16-bit iterates did not.
LOW_PRECISION_METHOD = "coupled_newton"


def choose_method(xp: Any, a: Array, p: float, *, matmul_dtype: str | None = None,
                  fixed_steps: bool = False) -> str:
    """Pick the solver ``method="auto"`` runs for this input.

    The rule (docs/benchmarks.rst has the measurements behind it):

    - p not a positive integer: ``"evd"``, the only method for real p.
    - ``matmul_dtype`` set (16-bit matmuls asked for): ``"coupled_newton"``.
    - CPU backends (NumPy, torch CPU, array-api-strict, JAX with float64), any size and dtype:
      ``"evd"``, the fastest at the default tolerance in every CPU configuration
      measured (:data:`CPU_METHOD`).
    - JAX on a CPU without float64 (``jax_enable_x64`` off): ``"coupled_newton"``
      (:data:`NO_FLOAT64_METHOD`): evd cannot retry in float64 there and certifies
      float32 roots only to κ ≈ 12·p. For a real p it is evd, the only method, and
      :func:`matroot.inv_root` says so with a :class:`~matroot.ConvergenceWarning`
      (at trace time under ``jax.jit``) that names ``jax_enable_x64``.
    - Accelerators with ``fixed_steps`` (an accuracy target ``rtol`` given, whose
      solve runs a fixed step count): ``"minimax"``, the fewest operations per solve
      (:data:`FIXED_STEP_METHOD`), or coupled Newton for a p it does not take.
    - Accelerators otherwise (CUDA torch, CuPy, JAX on a GPU): ``"coupled_newton"``, the
      fastest matmul-only method on an H200 for p = 2 and 4 at 256² and 1024²
      (:data:`ACCELERATOR_METHOD`); for a p it does not take, the method with
      the fewest matmuls that does (:func:`accelerator_candidates`).

    Parameters
    ----------
    xp : namespace
        The input's array namespace.
    a : array
        The input stack (its device matters).
    p : float
        Root order.
    matmul_dtype : str or None
        The requested matmul operand dtype.
    fixed_steps : bool
        Whether the call may run a fixed step count (it has an accuracy target).

    Returns
    -------
    str

    Examples
    --------
    >>> import numpy as np, matroot
    >>> from array_api_compat import array_namespace
    >>> a = np.eye(4)
    >>> matroot.choose_method(array_namespace(a), a, 4)
    'evd'
    >>> matroot.choose_method(array_namespace(a), a, 4, matmul_dtype="float16")
    'coupled_newton'
    """
    candidates = accelerator_candidates(p)
    if not candidates:
        return CPU_METHOD
    if matmul_dtype is not None and LOW_PRECISION_METHOD in solvers_supporting(p):
        return LOW_PRECISION_METHOD
    if not _xp.is_accelerator(xp, a):
        if not _xp.has_float64(xp):
            return NO_FLOAT64_METHOD if NO_FLOAT64_METHOD in candidates else candidates[0]
        return CPU_METHOD
    if fixed_steps:
        return FIXED_STEP_METHOD if FIXED_STEP_METHOD in candidates else ACCELERATOR_METHOD
    return ACCELERATOR_METHOD if ACCELERATOR_METHOD in candidates else candidates[0]


def accelerator_candidates(p: float) -> tuple[str, ...]:
    """The matmul-only solvers that accept ``p``, cheapest first by their cost model.

    Examples
    --------
    >>> from matroot.solvers.auto import accelerator_candidates
    >>> accelerator_candidates(4)[:2], accelerator_candidates(3)[0]
    (('minimax', 'coupled_newton'), 'coupled_newton')
    """
    names = [m for m in solvers_supporting(p) if SOLVERS[m].forms_matmuls]
    return tuple(sorted(names, key=lambda m: SOLVERS[m].cost(p, REFERENCE_KAPPA)))
