"""The cost of certification (issue 9), timed next to the solve it certifies.

Every :func:`matroot.inv_root_info` call certifies its λmax bound
(:func:`matroot.spectrum.scaling.certified_lambda_max`) and checks the root it returns
(:func:`matroot.certify.verify.verify_root`). The solver benchmark times that work on its
own, interleaved with the whole call, so the overhead shows as a measured time
ratio next to ``check_matmuls`` (its cost in matmul equivalents).
"""

from __future__ import annotations

from collections.abc import Callable

from array_api_compat import array_namespace

from matroot.certify.accuracy import unit_roundoff
from matroot.certify.verify import verify_root
from matroot.spectrum.scaling import certified_lambda_max

__all__ = ["certification_call"]


def certification_call(a, p, result) -> Callable:
    """A zero-argument callable redoing the certification of ``result = inv_root_info(a, p)``.

    It bounds λmax of the symmetric part of ``a`` (eps = 0, as the benchmark
    calls) and checks ``result.root`` against it, in ``a``'s dtype.

    Examples
    --------
    >>> import numpy as np, matroot
    >>> from bench.certification import certification_call
    >>> a = np.diag([1.0, 4.0])[None]
    >>> check = certification_call(a, 2, matroot.inv_root_info(a, 2, method="evd"))()
    >>> bool(check.positive[0]), float(check.residual[0]) < 1e-12
    (True, True)
    """
    xp = array_namespace(a)
    n = a.shape[-1]
    stack = xp.reshape(a, (-1, n, n))
    stack = stack / 2 + xp.matrix_transpose(stack) / 2
    root = xp.astype(xp.reshape(result.root, (-1, n, n)), stack.dtype)
    unit = unit_roundoff(xp, stack.dtype)

    def certify():
        bound = certified_lambda_max(stack).bound
        scaled = stack / bound[:, None, None]
        return verify_root(scaled, root * (bound ** (1.0 / p))[:, None, None], p,
                           unit_roundoff=unit)

    return certify
