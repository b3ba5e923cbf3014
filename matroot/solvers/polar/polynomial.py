"""Matmul-only polar iterations: odd quintics applied to the singular values.

Each step maps ``X ← X·(c1·I + c3·A + c5·A²)`` with ``A = XᵀX`` (three products:
``XᵀX``, ``A²`` and ``X·q(A)``), so every singular value σ goes to
``c1·σ + c3·σ³ + c5·σ⁵`` while the singular vectors stay. ``X`` is ``(b, m, n)``
with ``n ≤ m`` (the caller transposes wide stacks), so ``A`` is the smaller Gram
matrix. The Gram-side variant keeps only n×n matrices in its loop.
"""

from __future__ import annotations

from ... import _xp


def _polynomial_of(gram, row, eye, matmul, gram_squared=None):
    """``c1·I + c3·A + c5·A²`` for ``row = (c1, c3, c5)``: one product, none when
    ``A²`` is given. ``c5·A²`` is added by the product itself (one ``baddbmm`` on
    torch): one pass over the n×n stack besides it, where the plain sum takes four."""
    c1, c3, c5 = (float(c) for c in row)
    linear = _xp.add_scaled(eye * c1, c3, gram)
    if gram_squared is None:
        return matmul.added(linear, gram, gram, alpha=c5)
    return _xp.add_scaled(linear, c5, gram_squared)


def odd_quintic_steps(x, gram, rows, matmul, gram_squared=None):
    """Apply the quintics ``rows`` (an iterable of ``(c1, c3, c5)``) in turn.

    ``gram`` is ``XᵀX`` of the incoming ``x`` (formed by the caller's scaling),
    ``gram_squared`` its square where the scaling formed it too; later Gram
    matrices are formed here. Returns the last iterate.
    """
    xp = _xp.array_namespace(x)
    eye = _xp.identity_stack(xp, x.shape[-1], x.dtype, _xp.device_of(x))
    for k, row in enumerate(rows):
        if k > 0:
            gram, gram_squared = matmul(xp.matrix_transpose(x), x), None
        x = matmul(x, _polynomial_of(gram, row, eye, matmul, gram_squared))
    return x


def gram_side_steps(x, gram, rows, matmul, gram_squared=None, *, restart_every: int):
    """The same quintics iterated on the n×n side, for tall ``x`` (m ≫ n).

    With ``A₀ = XᵀX`` every iterate is ``X·R`` for an n×n polynomial ``R`` in
    ``A₀``, and its Gram matrix is ``q(A)·A·q(A)``: a step costs three n×n
    products (``A²``, ``R·q`` and ``q·A·q`` as two) instead of two m×n×n ones
    and one n×n. Squaring the singular values into ``A`` loses the small ones to
    rounding as the iteration sharpens them, so every ``restart_every`` steps the
    iterate ``X·R`` is formed and its Gram matrix recomputed (the restart of the
    "Gram Newton–Schulz" scheme). ``gram_squared`` as in :func:`odd_quintic_steps`.
    """
    xp = _xp.array_namespace(x)
    eye = _xp.identity_stack(xp, x.shape[-1], x.dtype, _xp.device_of(x))
    transform = None
    for k, row in enumerate(rows):
        if k > 0 and k % restart_every == 0:
            x = matmul(x, transform)
            gram = matmul(xp.matrix_transpose(x), x)
            transform = None
        poly = _polynomial_of(gram, row, eye, matmul, gram_squared if k == 0 else None)
        transform = poly if transform is None else matmul(transform, poly)
        gram = matmul(poly, matmul(gram, poly))
    return x if transform is None else matmul(x, transform)
