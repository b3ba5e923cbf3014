"""The accuracy policy, in one place: the README's table, its κ buckets, and what
``converged=True`` means.

A root is converged when its method stopped (on ``tol``, at its rounding floor,
or after the fixed ``tol=0`` step count), it is usable (finite and positive
definite in the output dtype) and its a-posteriori error estimate
(:mod:`matroot.certify.verify`) meets the accuracy asked for: the README table's target
for its κ (:func:`row_target`), or a looser ``tol``. This module sits at the
bottom of the library: the check (:mod:`matroot.certify.verify`), ``evd`` and the public
testing toolkit (:mod:`matroot.testing`, which re-exports the table) read it.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _xp
from .._xp import unit_roundoff
from .._checks import refuse_traced
from .._typing import Array

__all__ = ["ACCURACY_TABLE", "BUCKET_SLACK", "CHECK_RESOLUTION", "ESTIMATE_UNDERSHOOT",
           "MEASURED_UNSEEN", "SMALL_MATRIX_UNSEEN", "measured_unseen",
           "FLOAT32_INVERSE_TOLERANCE", "KAPPA_BUCKETS", "LOW_PRECISION_ROWS",
           "RTOL_FLOOR_UNITS", "check_rtol", "is_converged", "row_target", "rtol_allowance",
           "rtol_limit", "rtol_margin", "unit_roundoff", "within_rtol"]

#: Upper ends of the κ(A + eps·I) buckets of the table.
KAPPA_BUCKETS: tuple[float, ...] = (1e2, 1e4, 1e6)

#: (row, dtype) -> relative Frobenius error allowed per κ bucket; None: no target.
ACCURACY_TABLE: dict[tuple[str, str], tuple[float | None, ...]] = {
    ("evd", "float32"): (1e-5, 1e-4, 1e-3),
    ("iterative", "float32"): (1e-4, 1e-3, 2e-2),
    ("chebyshev", "float32"): (1e-3, 1e-2, None),
    ("evd", "float64"): (1e-8, 1e-7, 1e-6),
    ("iterative", "float64"): (1e-8, 1e-7, 1e-6),
    ("chebyshev", "float64"): (1e-8, 1e-7, None),
}

#: The plain inverse of a float32 matrix beyond κ = 1e4: rounding A to float32 alone
#: moves A⁻¹ by about κ·u ≈ 6e-2 in its worst direction.
FLOAT32_INVERSE_TOLERANCE = 5e-2

#: Rows of the accuracy table for 16-bit matmul operands (float32 accumulation):
#: what ``converged=True`` promises with ``matmul_dtype``, per κ bucket. Measured
#: errors (``matroot.solvers.minimax``'s table) are 3–10× below these.
LOW_PRECISION_ROWS = {
    "float16": (5e-3, 2e-2, 5e-2),
    "bfloat16": (3e-2, 1e-1, 2e-1),
}
#: The product check's first-order error estimate (:mod:`matroot.certify.verify`) is
#: measured down to 0.58× the float64-oracle error near the compute dtype's rounding
#: floor (float32, κ 1e4–1e6, isolated-top, clustered and Gram spectra, p = 1, 2, 4):
#: a root of an iterative method meets a caller's ``rtol`` where its estimate is at
#: most ``rtol / ESTIMATE_UNDERSHOOT`` (the table's targets hold this slack already).
ESTIMATE_UNDERSHOOT = 2.0

#: The product check cannot see a root's error below about u·κ/p: its own products
#: carry that much rounding, and near that floor the estimate sees only part of the
#: error (float32 inverses at κ ≈ 8e5 reported at 1e-3 with an oracle error of 1e-2;
#: float64 square roots at κ ≈ 3e10 at 3.9e-7 with 1.2e-6 ≈ 0.65·u·κ/p). A target
#: the table's measurements do not cover is certified where
#: ``ESTIMATE_UNDERSHOOT·estimate + CHECK_RESOLUTION·u·κ/p ≤ target``.
CHECK_RESOLUTION = 1.0

#: Within the table's measured range the estimate is trusted as it stands, less the
#: part of the error it cannot see near the rounding floor: a table target certifies
#: where ``estimate + measured_unseen(n)·u·κ/p ≤ target`` (κ the check's). Over about
#: 6,300 converged float32 roots (every iterative method, p 1–8, n 4–128, κ 1e4–1e6,
#: the spectrum families of matroot.testing and flat bulks with one or two eigenvalues
#: far below) the error exceeded the estimate by at most ``0.47·u·κ/p`` (above 0.39
#: only at n = 4), and 3,200 more near κ ≈ 4e5–1e6 gave no converged error above 0.0153;
#: a larger constant at every n would turn roots the estimate resolves exactly (a
#: geometric spectrum at κ = 1e6, p = 2, n = 48: estimate 5.8e-3, error 5.9e-3)
#: unconverged. Small matrices see more: their rounding does not average over many
#: entries. Measured again for issue 36 (stopped roots of newton_db, coupled_newton,
#: minimax and chebyshev, float32, p 1–8, κ 1e4–2e6, the six spectral families of
#: matroot.testing and flat bulks with one or two small eigenvalues; about 5,000 per n
#: for n = 2…8, 1,000 per n for n = 10, 12, 16, 24, 32), the largest excess per n was
#: 0.52, 0.55, 0.61, 0.56, 0.74, 0.52, 0.55 (n = 2…8), 0.33, 0.49, 0.33, 0.20, 0.21
#: (n = 10…32) times u·κ/p: at most 1.82/√n at every n. The allowance is
#: ``max(MEASURED_UNSEEN, SMALL_MATRIX_UNSEEN/√n)``, 1.35× that at its tightest (n = 6),
#: the constant from n = 31 on (issue 36's n = 3 square roots at κ = 1e6 were 0.67·u·κ/p
#: off the estimate, certified at 0.45, now held to 1.44). (n = 1 has κ = 1: its error
#: is a few u whatever the estimate, far below any target.)
MEASURED_UNSEEN = 0.45
#: ``measured_unseen(n)``'s small-matrix term: the allowance is this divided by √n.
SMALL_MATRIX_UNSEEN = 2.5


def measured_unseen(n: int) -> float:
    """The part of an iterative root's error, in units of ``u·κ/p``, that the product
    check cannot see at size ``n`` (:data:`MEASURED_UNSEEN`, :data:`SMALL_MATRIX_UNSEEN`).

    Examples
    --------
    >>> from matroot.certify.accuracy import measured_unseen
    >>> [round(measured_unseen(n), 3) for n in (1, 4, 16, 64)]
    [2.5, 1.25, 0.625, 0.45]
    """
    return max(MEASURED_UNSEEN, SMALL_MATRIX_UNSEEN / math.sqrt(max(int(n), 1)))

#: κ bucket edges are widened by this factor towards the stricter target: the
#: Ritz values carry rounding of about n·u·λmax, a few percent at κ = 1e4 in float32.
BUCKET_SLACK = 1.1


def row_target(row: str, precision: str, p, kappa):
    """The error ``converged=True`` promises for each matrix of a table ``row``.

    The README's table (:data:`ACCURACY_TABLE`), or :data:`LOW_PRECISION_ROWS`
    for 16-bit matmuls, at each matrix's κ estimate (bucket edges widened by
    :data:`BUCKET_SLACK` towards the stricter target). Beyond κ = 1e6, and where
    the table sets no target, the loosest target the row states applies.

    Parameters
    ----------
    row : {"evd", "iterative", "chebyshev"}
        The table row (a solver's registry entry names its row).
    precision : {"float32", "float64", "float16", "bfloat16"}
        Compute dtype, or the matmul operand dtype for 16-bit products.
    p : int or float
        Root order.
    kappa : array, shape (b,)
        Estimated condition numbers (a number or an integer array is taken as
        float64).

    Returns
    -------
    array, shape (b,)

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.accuracy import row_target
    >>> row_target("iterative", "float32", 2, np.array([10.0, 1e3, 1e5, 1e9])).tolist()
    [0.0001, 0.001, 0.02, 0.02]
    """
    if not hasattr(kappa, "dtype"):  # a number or a list
        kappa = np.asarray(kappa, dtype=np.float64)
    xp = _xp.array_namespace(kappa)
    if not xp.isdtype(kappa.dtype, "real floating"):
        # Integer κ: the targets are filled in κ's dtype, where they would round to 0.
        kappa = xp.astype(kappa, xp.float64 if _xp.has_float64(xp) else xp.float32)
    stated_row: tuple[float | None, ...]
    if precision in LOW_PRECISION_ROWS:
        stated_row = LOW_PRECISION_ROWS[precision]
    else:
        stated_row = ACCURACY_TABLE[(row, precision)]
    stated = [t for t in stated_row if t is not None]
    targets = [t if t is not None else stated[-1] for t in stated_row]
    if p == 1 and precision == "float32":
        targets[-1] = max(targets[-1], FLOAT32_INVERSE_TOLERANCE)
    result = xp.full_like(kappa, targets[-1])
    for edge, target in reversed(list(zip(KAPPA_BUCKETS[:-1], targets[:-1]))):
        result = xp.where(kappa <= edge * BUCKET_SLACK, xp.full_like(kappa, target), result)
    return result


#: An accuracy target below this many unit roundoffs of the compute dtype cannot be
#: certified: rounding A to that dtype alone moves the root by about u·κ/p, and the
#: check's own products carry a few u.
RTOL_FLOOR_UNITS = 10


def check_rtol(rtol, unit: float, *, result: str = "root",
               remedy: str = "float64 input or compute_dtype='float64'") -> float:
    """``rtol`` as a float if it is an accuracy target the computation can reach.

    Parameters
    ----------
    rtol : float
        The relative Frobenius error asked of every root, in
        ``[RTOL_FLOOR_UNITS·u, 1]``.
    unit : float
        The unit roundoff u of the compute dtype (:func:`unit_roundoff`).
    result, remedy : str
        What is computed ("root", "polar factor") and how to reach a smaller rtol,
        for the messages.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        For a non-number, NaN, a value ≤ 0 or > 1, or one below what the compute
        dtype can certify (the message names float64 as the way out).

    Examples
    --------
    >>> from matroot.certify.accuracy import check_rtol
    >>> check_rtol(1e-3, 2.0 ** -24)
    0.001
    >>> check_rtol(1e-8, 2.0 ** -24)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: rtol=1e-08 is below what this computation can certify (10 unit roundoffs ...
    """
    rtol = refuse_traced(rtol, "rtol")
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real):
        raise ValueError(f"rtol must be a real number in (0, 1], got {rtol!r}")
    value = float(rtol)
    if not 0 < value <= 1:  # NaN fails this too
        raise ValueError(f"rtol must be in (0, 1] (the relative error asked of each {result}), "
                         f"got {value!r}")
    floor = RTOL_FLOOR_UNITS * unit
    if value < floor:
        raise ValueError(f"rtol={value:g} is below what this computation can certify "
                         f"({RTOL_FLOOR_UNITS} unit roundoffs of its dtype, {floor:.1g}): no "
                         f"{result} would converge; pass a larger rtol, or {remedy}")
    return value


def rtol_allowance(rtol: float | Array, kappa: Array, p, unit: float,
                   first_order: bool) -> Array:
    """Per matrix, the largest error estimate that certifies a target ``rtol`` (a
    caller's, or one per matrix) the table's measurements do not cover.

    ``rtol`` itself for an estimate that bounds the error (``evd``'s); for the product
    check's first-order estimate ``(rtol − CHECK_RESOLUTION·u·κ/p) / ESTIMATE_UNDERSHOOT``,
    and ``-inf`` (nothing certifies) where that is not positive: the check's own
    rounding already reaches ``rtol``.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.accuracy import rtol_allowance
    >>> rtol_allowance(1e-2, np.array([1e2, 1e6]), 1, 2.0 ** -24, True).round(6).tolist()
    [0.004997, -inf]
    >>> rtol_allowance(1e-2, np.array([1e2, 1e6]), 1, 2.0 ** -24, False).tolist()
    [0.01, 0.01]
    """
    xp = _xp.array_namespace(kappa)
    if not first_order:
        return xp.zeros_like(kappa) + rtol  # rtol: a float or one target per matrix
    unseen = rtol - kappa * (CHECK_RESOLUTION * unit / p)
    return xp.where(unseen > 0, unseen / ESTIMATE_UNDERSHOOT, -float("inf"))


def rtol_margin(error_estimate: Array, kappa_root: Array, p, unit: float, *,
                kappa_power: int = 1) -> Array:
    """``estimate + CHECK_RESOLUTION·u·κ/(p·ESTIMATE_UNDERSHOOT)`` for ``κ =
    kappa_root^kappa_power`` (a power of 1 or 2) in one operation: what
    :func:`within_rtol` compares with :func:`rtol_limit`. The two broadcast: a
    ``kappa_root`` of shape (b, k) against an estimate of shape (b, 1) gives each
    matrix's margins for k candidate κ, whose largest a caller reduces with its own
    reduction.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.accuracy import rtol_margin
    >>> rtol_margin(np.array([1e-3]), np.array([1e3]), 2, 2.0 ** -24, kappa_power=2).round(4)
    array([0.0159])
    """
    slope = CHECK_RESOLUTION * unit / (p * ESTIMATE_UNDERSHOOT)
    if kappa_power == 2:
        return _xp.add_product_of(error_estimate, slope, kappa_root, kappa_root)
    return _xp.add_scaled(error_estimate, slope, kappa_root)


def rtol_limit(rtol: float) -> float:
    """What :func:`rtol_margin` must stay below to certify ``rtol``:
    ``rtol/ESTIMATE_UNDERSHOOT``."""
    return rtol / ESTIMATE_UNDERSHOOT


def within_rtol(error_estimate: Array, rtol: float, kappa: Array, p, unit: float) -> Array:
    """Per matrix, whether a first-order ``error_estimate`` certifies ``rtol``:
    ``error_estimate ≤`` :func:`rtol_allowance` (the same test, in two operations:
    :func:`rtol_margin` ``<`` :func:`rtol_limit`, i.e.
    ``estimate + CHECK_RESOLUTION·u·κ/(p·ESTIMATE_UNDERSHOOT) < rtol/ESTIMATE_UNDERSHOOT``
    for a non-negative estimate, stricter only at equality).

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.accuracy import within_rtol
    >>> within_rtol(np.array([4e-3, 4e-3, 0.0]), 1e-2, np.array([1e2, 1e6, 1e6]), 1,
    ...             2.0 ** -24).tolist()
    [True, False, False]
    """
    return rtol_margin(error_estimate, kappa, p, unit) < rtol_limit(rtol)


def is_converged(stopped: Array, usable: Array, error_estimate: Array,
                 accuracy: Array) -> Array:
    """Per matrix: the method stopped, the root is usable and its estimated error is
    within ``accuracy``. Every verdict ``converged`` in matroot is this one.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.certify.accuracy import is_converged
    >>> yes = np.array([True, True, True])
    >>> is_converged(yes, np.array([True, True, False]), np.array([1e-4, 1e-2, 0.0]),
    ...              np.array([1e-3, 1e-3, 1e-3])).tolist()
    [True, False, False]
    """
    return stopped & usable & (error_estimate <= accuracy)
