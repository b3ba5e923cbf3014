"""The rule behind ``method="auto"``."""

from __future__ import annotations

from .. import _xp
from .._checks import methods_supporting


def choose_method(xp, a, p, *, matmul_dtype=None) -> str:
    """Pick the solver ``method="auto"`` runs for this input.

    The rule (see docs/methods.rst for the measurements behind it):

    - p not a positive integer: ``"evd"`` (the only method for real p).
    - CPU backends (NumPy, torch CPU, array-api-strict): ``"evd"``. LAPACK's
      batched eigh beats a dozen n³ matmuls per matrix on a CPU.
    - Accelerators (CUDA torch, CuPy): matmul-only iterations, since cuSOLVER's
      eigh is latency-bound and serial per matrix. ``"newton_db"`` for p a power of
      two, else ``"coupled_newton"``; with 16-bit matmuls ``"coupled_newton"``,
      which tolerates fp16 operands where Newton–Schulz does not.

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
    """
    supported = methods_supporting(p)
    if supported == ("evd",):
        return "evd"
    if not _xp.is_accelerator(xp, a) and matmul_dtype is None:
        return "evd"
    if matmul_dtype is None and "newton_db" in supported:
        return "newton_db"
    return "coupled_newton"
