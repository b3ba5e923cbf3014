"""Which dimensions of a parameter get a Kronecker factor, and how a dimension is cut
into blocks: the policy :func:`matroot.optim.shampoo_core.blocking.plan_blocks` applies to every
parameter (its memory rule, :func:`factor_ratio`, and the block sizes,
:func:`split_sizes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_FACTOR_RATIO", "FactorPolicy", "factor_ratio", "split_sizes"]

#: The default :attr:`FactorPolicy.max_factor_ratio`: a square weight's factors hold one
#: number per element, a 1024×256 weight's left factor four; only a dimension far longer
#: than its other side (an embedding's vocabulary against its width) holds more.
DEFAULT_MAX_FACTOR_RATIO = 4.0

@dataclass(frozen=True)
class FactorPolicy:
    """Which dimensions of one parameter's view get a Kronecker factor.

    Parameters
    ----------
    precondition : bool
        False leaves the parameter on the elementwise (grafting) update.
    precondition_1d : bool
        Give vectors one factor (root 2) instead of the elementwise update.
    max_preconditioned_dim : int or float
        A view dimension longer than this gets no factor (``math.inf``: none skipped
        for length).
    skip_dims : tuple of int
        View dimensions (0: rows, 1: columns; 0 for a vector) that get no factor.
    max_factor_ratio : float
        A matrix dimension cut into blocks (longer than the block size) gets no
        factor when its factors would hold more than this many numbers per
        parameter element: a 50000×64 embedding's 1024×1024 left factors hold 16
        (:func:`factor_ratio`),
        a square weight's 1 (``math.inf``: no dimension is left out for this).

    Examples
    --------
    >>> FactorPolicy(max_preconditioned_dim=4096).sides((50000, 64))
    (False, True)
    >>> FactorPolicy(skip_dims=(1,)).sides((300, 200))
    (True, False)
    >>> FactorPolicy().sides((50000, 64), block_size=1024)
    (False, True)
    >>> FactorPolicy().sides((4096, 1024), block_size=1024)
    (True, True)
    """

    precondition: bool = True
    precondition_1d: bool = False
    max_preconditioned_dim: float = math.inf
    skip_dims: tuple[int, ...] = ()
    max_factor_ratio: float = DEFAULT_MAX_FACTOR_RATIO

    def sides(self, view: tuple[int, ...], block_size: float = math.inf) -> tuple[bool, ...]:
        """Per dimension of ``view`` (cut into blocks of ``block_size``), whether it gets
        a factor."""
        if not self.precondition or (len(view) == 1 and not self.precondition_1d):
            return (False,) * len(view)
        return tuple(d not in self.skip_dims and n <= self.max_preconditioned_dim
                     and not (len(view) == 2 and n > block_size
                              and factor_ratio(view, d, block_size) > self.max_factor_ratio)
                     for d, n in enumerate(view))


def factor_ratio(view: tuple[int, int], dim: int, block_size: float) -> float:
    """Numbers held by the factors of dimension ``dim`` of a matrix view cut into blocks
    of ``block_size``, per element of the view.

    Examples
    --------
    >>> factor_ratio((50000, 64), 0, 1024)  # 48 factors of 1024², one of 848², per 3.2M
    15.95336
    >>> factor_ratio((2048, 2048), 0, 1024)
    1.0
    """
    other = view[1 - dim]
    numbers = len(split_sizes(other, block_size)) * sum(
        n * n for n in split_sizes(view[dim], block_size))
    return numbers / (view[0] * view[1])


def split_sizes(n: int, block_size: float) -> list[int]:
    """Sizes of the blocks along a dimension of length ``n``: full blocks, then the rest.

    Examples
    --------
    >>> split_sizes(1000, 384)
    [384, 384, 232]
    >>> split_sizes(1000, math.inf)
    [1000]
    """
    if n <= block_size:
        return [n]
    block_size = int(block_size)
    sizes = [block_size] * (n // block_size)
    if n % block_size:
        sizes.append(n % block_size)
    return sizes
