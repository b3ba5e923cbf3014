"""Small polar factors (n = 2…8) meet :func:`polar_error_bound` where converged.

Issue 36: float32 ``polar(method="svd")`` on 64 square 4 × 4 matrices with singular
values (1e-3, 1e-3, 1, 1) returned ``converged=True`` with errors 3.96e-5 (torch) and
4.3e-5 (JAX) against the bound 3.0e-5, whose rounding constant was measured at n = 64
on distinct singular values: an SVD rotates the two tiny singular directions into each
other by about u·κ, which √n no longer hides at n = 4, nor a cluster of many tiny ones
at any n. Errors against the refined float64 SVD oracle.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.certify.polar_accuracy import polar_error_bound
from matroot.testing import oracle_polar, polar_relative_error
from matroot.testing.spectra import random_orthogonal

from conftest import to_numpy

METHODS = ("polar_express", "gram_newton_schulz", "svd", "eigh")


def _stack(sigma, m, seed):
    sigma = np.asarray(sigma, dtype=np.float64)
    b, n = sigma.shape
    rng = np.random.default_rng(seed)
    u = random_orthogonal(rng, (b,), m)[..., :n]
    v = random_orthogonal(rng, (b,), n)
    return (u * sigma[:, None, :]) @ np.swapaxes(v, -1, -2)


def _broken(backend, g, method, dtype, matmul_dtype=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = matroot.polar_info(backend.asarray(g, dtype), method=method,
                                     matmul_dtype=matmul_dtype)
        except (ValueError, TypeError):  # a method or matmul dtype this backend lacks
            return []
    g32 = to_numpy(backend.asarray(g, dtype)).astype(np.float64)
    sv = np.linalg.svd(g32, compute_uv=False)
    kappa = sv[:, 0] / sv[:, -1]
    error = polar_relative_error(to_numpy(res.root).astype(np.float64), oracle_polar(g32))
    bound = np.array([polar_error_bound(matmul_dtype or dtype, k, method=res.method)
                      for k in kappa])
    bad = to_numpy(res.converged) & ~(error <= bound)
    return list(zip(kappa[bad], error[bad], bound[bad]))


def test_svd_of_4x4_with_two_tiny_singular_values(backend):
    g = _stack(np.tile([1e-3, 1e-3, 1.0, 1.0], (64, 1)), 4, seed=0)
    assert not _broken(backend, g, "svd", "float32")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_polar_factors_meet_the_bound(backend, method, dtype):
    """n = 2…8, square and tall, a cluster of k tiny singular values under ones."""
    rng = np.random.default_rng(5)
    top = 5 if dtype == "float32" else 7
    for n in (2, 3, 4, 6, 8):
        sigma = np.ones((8, n))
        for i in range(8):
            sigma[i, :max(1, rng.integers(1, n + 1) - 1)] = 10.0 ** -rng.uniform(1, top)
        for m in (n, 2 * n):
            g = _stack(sigma, m, seed=n + m)
            assert not _broken(backend, g, method, dtype), (n, m)


@pytest.mark.parametrize("matmul_dtype", ["bfloat16", "float16"])
def test_small_polar_factors_with_16_bit_matmuls(matmul_dtype):
    torch = pytest.importorskip("torch")
    from matroot.testing.backends import candidate_targets

    target = next(t for t, missing in candidate_targets() if t.name == "torch")
    del torch
    rng = np.random.default_rng(6)
    for n in (2, 3, 4, 8):
        sigma = np.ones((8, n))
        sigma[:, : max(1, n // 2)] = 10.0 ** -rng.uniform(1, 3, (8, 1))
        for m in (n, 2 * n):
            g = _stack(sigma, m, seed=n + m)
            assert not _broken(target, g, "polar_express", "float32", matmul_dtype), (n, m)
