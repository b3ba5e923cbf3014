"""matroot.polar against the float64 SVD oracle: the accuracy table on every backend,
shapes, 16-bit matmuls, rank deficiency, NaN isolation and bad input.

The table (:mod:`matroot.certify.polar_accuracy`) is what ``converged=True`` promises:
relative error ``‖Q − U·Vᵀ‖_F/√min(m, n) ≤ max(2·rtol, ROUNDING·κ)``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.certify.polar_accuracy import (DEFAULT_LOWER, DEFAULT_RTOL, ERROR_SLACK,
                                            polar_error_bound)
from matroot.solvers.polar.coefficients import (MUON_BAND, MUON_LOWER, MUON_POLAR_STEPS, band_lower,
                                        polar_schedule)
from matroot.polar_factor.api import GRAM_NORM_MAX_N
from matroot.testing import oracle_polar, polar_case, polar_relative_error
from matroot.testing.polar_oracle import PolarCase
from matroot.testing.spectra import random_orthogonal
from conftest import to_numpy

#: (dtype, κ): the default schedule's lower bound covers κ up to about 1/lower.
ACCURACY_CASES = [("float64", 10.0), ("float64", 1e4), ("float64", 1e6),
                  ("float32", 10.0), ("float32", 1e3), ("float32", 3e4)]
SHAPES = [(12, 12), (20, 7), (6, 15)]


def _assert_meets_table(result, case, precision):
    error = polar_relative_error(to_numpy(result.root), case.polar)
    converged = to_numpy(result.converged)
    assert converged.all(), f"not converged: {to_numpy(result.error_estimate)}"
    bound = polar_error_bound(precision, case.kappa, method=result.method)
    assert np.all(error <= bound), f"error {error.max():.2e} > {bound:.2e}"
    # The estimate bounds the error in real arithmetic; rounding adds up to ROUNDING·κ.
    estimate = to_numpy(result.error_estimate)
    assert np.all(error <= estimate + bound), (error, estimate)


@pytest.mark.parametrize("dtype,kappa", ACCURACY_CASES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("sigma_bound", ["gram_norm", "cholesky"])
def test_polar_express_meets_the_table(backend, dtype, kappa, shape, sigma_bound):
    case = polar_case(np.random.default_rng(int(kappa) % 89), (2,), *shape, kappa)
    result = matroot.polar_info(backend.asarray(case.g, dtype), sigma_bound=sigma_bound)
    assert result.method == "polar_express"
    assert result.root.shape == case.g.shape
    assert result.root.dtype == backend.asarray(case.g, dtype).dtype
    _assert_meets_table(result, case, dtype)


@pytest.mark.parametrize("method,kappa,shape", [("svd", 1e3, (16, 9)), ("eigh", 10.0, (16, 9)),
                                                ("gram_newton_schulz", 1e3, (160, 40))])
def test_other_methods_meet_the_table(backend, method, kappa, shape):
    """eigh squares κ in the Gram matrix: in float32 it converges only for small κ."""
    case = polar_case(np.random.default_rng(3), (3,), *shape, kappa)
    result = matroot.polar_info(backend.asarray(case.g, "float32"), method=method)
    _assert_meets_table(result, case, "float32")


def test_eigh_is_not_converged_where_squaring_loses_the_small_singular_values():
    case = polar_case(np.random.default_rng(4), (2,), 10, 10, 1e5)
    result = matroot.polar_info(case.g.astype(np.float32), method="eigh")
    assert not result.converged.any()


def test_quintic_baseline_is_fast_but_never_converged(backend):
    """Muon's 5-step quintic leaves the singular values in about [0.7, 1.2]."""
    case = polar_case(np.random.default_rng(5), (2,), 16, 8, 100.0)
    result = matroot.polar_info(backend.asarray(case.g, "float32"), method="quintic")
    assert not to_numpy(result.converged).any()
    assert (to_numpy(result.matmuls) == 15).all() and (to_numpy(result.iterations) == 5).all()
    sigma = np.linalg.svd(to_numpy(result.root).astype(np.float64), compute_uv=False)
    assert sigma.min() > 0.6 and sigma.max() < 1.25


@pytest.mark.parametrize("matmul_dtype", ["bfloat16", "float16"])
def test_sixteen_bit_matmuls_meet_their_row(backend, matmul_dtype):
    if backend.backend not in ("torch", "jax"):
        pytest.skip("bfloat16 exists on torch and JAX only")
    case = polar_case(np.random.default_rng(6), (3,), 24, 16, 100.0)
    result = matroot.polar_info(backend.asarray(case.g, "float32"), matmul_dtype=matmul_dtype)
    _assert_meets_table(result, case, matmul_dtype)


def test_fewer_products_than_the_quintic_at_its_orthogonality():
    """Polar Express built for κ ≤ 100 and the quintic's own accuracy needs fewer products
    (12 against 15 here; docs/polar.rst has the sweep over κ)."""
    case = polar_case(np.random.default_rng(7), (4,), 32, 32, 100.0)
    g = case.g.astype(np.float32)
    quintic = matroot.polar_info(g, method="quintic")
    express = matroot.polar_info(g, rtol=float(quintic.error_estimate.min()), lower=1e-2)
    assert express.converged.all()
    assert express.matmuls.max() < quintic.matmuls.min()
    assert express.error_estimate.max() <= quintic.error_estimate.min()


@pytest.mark.parametrize("kappa", [1e2, 1e3, 1e4])
def test_muon_default_beats_the_quintic_with_fewer_products(kappa):
    """Muon's default Polar Express (4 steps for [MUON_LOWER, 1]) against the 5-step
    quintic on singular values log-spaced over [1/κ, 1], n = 64: 12 products against
    15 and a smaller defect (in real arithmetic 0.27/0.39/0.60 against 0.35/0.47/0.63,
    so float32 rounding, ~1e-6, cannot reverse it)."""
    case = polar_case(np.random.default_rng(14), (2,), 64, 64, kappa)
    g = case.g.astype(np.float32)
    quintic = matroot.polar_info(g, method="quintic")
    express = matroot.polar_info(g, lower=MUON_LOWER, max_iter=MUON_POLAR_STEPS)
    assert (express.matmuls == 12).all() and (quintic.matmuls == 15).all()
    assert express.error_estimate.max() < quintic.error_estimate.min()


def test_gram_norm_bound_covers_its_worst_case_spectrum():
    """All singular values at σmax but one at σmax/κ, κ just inside 1/lower: the
    Gram-norm bound is n^(1/8) above σmax, the most it can be, and the schedule built for
    lower/n^(1/8) still converges (built for lower itself it does not: defect 2.7e-6)."""
    n, kappa = 64, 0.9 / DEFAULT_LOWER["float64"]
    rng = np.random.default_rng(5)
    u, v = random_orthogonal(rng, (2,), n), random_orthogonal(rng, (2,), n)
    sigma = np.ones(n)
    sigma[-1] = 1.0 / kappa
    g = (u * sigma) @ np.swapaxes(v, -1, -2)
    result = matroot.polar_info(g, sigma_bound="gram_norm")
    _assert_meets_table(result, PolarCase(g, u @ np.swapaxes(v, -1, -2), kappa), "float64")
    tight = matroot.polar_info(g, sigma_bound="cholesky")
    assert (result.matmuls == tight.matmuls).all()


def test_auto_takes_the_product_free_bound_where_it_costs_no_step_or_n_is_small():
    """The Gram-norm bound reuses the first step's A²: the same products when its
    schedule (for lower/n^(1/8)) is no longer; "auto" takes it then, and up to
    GRAM_NORM_MAX_N on the smaller side even at one step more."""
    def case(n):
        return polar_case(np.random.default_rng(8), (1,), n + 8, n, 1e3).g
    big = GRAM_NORM_MAX_N * 2
    for g, options, expected in ((case(24), {}, "gram_norm"),
                                 (case(big), {}, "cholesky"),
                                 (case(big), dict(max_iter=4, lower=MUON_LOWER), "gram_norm")):
        auto = matroot.polar_info(g, **options)
        chosen = matroot.polar_info(g, sigma_bound=expected, **options)
        np.testing.assert_array_equal(auto.root, chosen.root)  # same program, same input
        other = "cholesky" if expected == "gram_norm" else "gram_norm"
        assert not np.array_equal(auto.root, matroot.polar_info(g, sigma_bound=other,
                                                                **options).root)
    tight = matroot.polar_info(case(big), sigma_bound="cholesky")
    loose = matroot.polar_info(case(big), sigma_bound="gram_norm")
    assert (loose.matmuls == tight.matmuls + 3).all()


def test_muon_lower_is_the_widest_interval_four_steps_bring_into_the_band():
    schedule = polar_schedule(MUON_LOWER, 1e-12, 0.01)
    assert schedule.errors[MUON_POLAR_STEPS - 1] <= MUON_BAND
    lower = band_lower(MUON_POLAR_STEPS)
    assert lower <= MUON_LOWER
    # The smallest such bound to 1 %: 2 % below it the band is missed.
    assert polar_schedule(0.98 * lower, 1e-12, 0.01).errors[MUON_POLAR_STEPS - 1] > MUON_BAND


def test_rank_deficient_directions_map_to_zero_and_zero_maps_to_zero(backend):
    rng = np.random.default_rng(8)
    u, _ = np.linalg.qr(rng.standard_normal((9, 9)))
    v, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    low_rank = (u[:, :3] * [4.0, 1.0, 0.5]) @ v[:, :3].T
    g = np.stack([low_rank, np.zeros((9, 6))])
    result = matroot.polar_info(backend.asarray(g, "float64"), lower=1e-3)
    root = to_numpy(result.root)
    assert np.isfinite(root).all()
    np.testing.assert_allclose(root[0], u[:, :3] @ v[:, :3].T, atol=1e-9)
    assert np.all(root[1] == 0)
    # Documented: a partial isometry is not orthogonal, so not converged.
    assert not to_numpy(result.converged).any()


def test_nan_matrix_leaves_its_neighbours_alone(backend):
    case = polar_case(np.random.default_rng(9), (3,), 8, 5, 50.0)
    alone = to_numpy(matroot.polar(backend.asarray(case.g, "float64")))
    g = case.g.copy()
    g[1, 2, 3] = np.nan
    result = matroot.polar_info(backend.asarray(g, "float64"), check_finite=False)
    root = to_numpy(result.root)
    assert np.isnan(root[1]).all()
    converged = to_numpy(result.converged)
    assert converged[[0, 2]].all() and not converged[1]
    # Same program on the same inputs for the clean matrices: rounding may still
    # differ with the batch composition, so compare to the float64 table's bound.
    assert np.abs(root[[0, 2]] - alone[[0, 2]]).max() <= polar_error_bound("float64", 50.0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        matroot.polar(backend.asarray(g, "float64"))


def test_batch_shapes_and_empty_stacks():
    case = polar_case(np.random.default_rng(10), (2, 3), 5, 4, 10.0)
    result = matroot.polar_info(case.g)
    assert result.root.shape == (2, 3, 5, 4) and result.converged.shape == (2, 3)
    empty = matroot.polar_info(np.zeros((0, 4, 3)))
    assert empty.root.shape == (0, 4, 3) and empty.converged.shape == (0,)


def test_low_precision_input_is_computed_in_float32():
    torch = pytest.importorskip("torch")
    case = polar_case(np.random.default_rng(11), (2,), 12, 8, 10.0)
    result = matroot.polar_info(torch.asarray(case.g).to(torch.bfloat16), rtol=1e-2)
    assert result.root.dtype == torch.bfloat16
    # Rounding the factor to bfloat16 is in the defect: about 2⁻⁸ per entry.
    assert result.converged.all()
    error = polar_relative_error(result.root.float().numpy(), case.polar)
    assert error.max() <= 1e-2


def test_plain_function_warns_when_not_converged():
    g = np.random.default_rng(12).standard_normal((2, 6, 4))
    with pytest.warns(matroot.ConvergenceWarning, match="quintic"):
        matroot.polar(g, method="quintic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matroot.polar(g)


@pytest.mark.parametrize("call,error,match", [
    (lambda: matroot.polar(np.ones(3)), ValueError, "at least 2 dimensions"),
    (lambda: matroot.polar(np.ones((3, 3), dtype=np.int64)), TypeError, "cast integers"),
    (lambda: matroot.polar([[1.0]]), TypeError, "supported library"),
    (lambda: matroot.polar(np.eye(3), method="newton"), ValueError, "polar_express"),
    (lambda: matroot.polar(np.eye(3), lower=2.0), ValueError, "lower must lie in"),
    (lambda: matroot.polar(np.eye(3), rtol=-1.0), ValueError, "rtol"),
    (lambda: matroot.polar(np.eye(3), max_iter=0), ValueError, "max_iter"),
    (lambda: matroot.polar(np.eye(3), sigma_bound="frobenius"), ValueError, "gram_norm"),
    (lambda: matroot.polar(np.eye(3, dtype=np.float32), matmul_dtype="bfloat16"),
     ValueError, "bfloat16"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_default_lower_bounds_are_what_the_table_claims():
    """The cases above stay within the κ the default schedules are built for."""
    for dtype, kappa in ACCURACY_CASES:
        assert kappa * DEFAULT_LOWER[dtype] <= 1.0


def test_matroot_polar_is_the_function_not_a_module():
    """The implementation lives in matroot.polar_factor.api; nothing named matroot.polar
    shadows or is shadowed by the function."""
    import importlib

    assert callable(matroot.polar) and matroot.polar.__module__ == "matroot.polar_factor.api"
    assert importlib.import_module("matroot.polar_factor.api").polar_info is matroot.polar_info
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("matroot.polar")


def test_oracle_agrees_with_the_constructed_factor():
    case = polar_case(np.random.default_rng(13), (2,), 7, 4, 1e3)
    np.testing.assert_allclose(oracle_polar(case.g), case.polar, atol=1e-11)


@pytest.mark.parametrize("name, unit", [("float64", 2.0 ** -53), ("float32", 2.0 ** -24),
                                        ("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)])
def test_the_polar_rtol_floor_reads_the_one_unit_roundoff(name, unit):
    """polar_info's rtol floor once read a table of its own (polar_accuracy.UNIT_ROUNDOFF);
    it now reads :func:`matroot._xp.unit_roundoff` of the dtype the products run in,
    which must give the same unit for every precision, 16-bit operands included."""
    from matroot import _xp
    from matroot.certify.accuracy import RTOL_FLOOR_UNITS

    if name == "bfloat16":
        torch = pytest.importorskip("torch")
        xp = _xp.array_namespace(torch.zeros(1))
        g, matmul_dtype = torch.eye(4), name
    else:
        xp = np
        g = np.eye(4, dtype=np.float64 if name == "float64" else np.float32)
        matmul_dtype = name if name == "float16" else None
    assert _xp.unit_roundoff(xp, _xp.dtype_from_name(xp, name)) == unit
    method = "polar_express"
    with pytest.raises(ValueError, match=f"can certify.*computes in {name}"):
        matroot.polar_info(g, method=method, matmul_dtype=matmul_dtype,
                           rtol=0.5 * RTOL_FLOOR_UNITS * unit)
    matroot.polar_info(g, method=method, matmul_dtype=matmul_dtype,
                       rtol=min(2.0 * RTOL_FLOOR_UNITS * unit, 1.0))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 3), (2, 3, 0)])
def test_polar_of_empty_matrices(shape):
    """A matrix with no rows or no columns raised ZeroDivisionError building the schedule."""
    res = matroot.polar_info(np.zeros(shape))
    assert res.root.shape == shape
    assert res.converged.shape == shape[:-2] and np.all(res.converged)


@pytest.mark.parametrize("make,match", [(lambda g: g.astype(np.longdouble), "long double"),
                                        (np.matrix, "numpy.matrix")])
def test_polar_refuses_what_inv_root_refuses(make, match):
    """polar took long double input, computed it in float32 and returned float128
    reported converged (its own input check had none of inv_root's cases)."""
    g = np.random.default_rng(0).standard_normal((5, 3))
    if match == "long double" and np.longdouble == np.float64:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(TypeError, match=match):
        matroot.polar(make(g))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_polar_of_16bit_input_converges_by_default(dtype):
    """A float16/bfloat16 input (Muon's momentum) was never converged with the default
    rtol: float32's 1e-5 is below the defect of any factor rounded to 16 bits, so
    ``polar`` warned on every call. The default is now the 16-bit dtype's rtol, and
    the factor is held to it against the float64 oracle."""
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(1).standard_normal((2, 48, 32))
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    res = matroot.polar_info(torch.asarray(g).to(getattr(torch, dtype)))
    assert res.root.dtype == getattr(torch, dtype)
    assert res.converged.all()
    error = polar_relative_error(res.root.double().numpy(), u @ vt)
    # κ of a 48×32 Gaussian is ~10: the rounding term is far below rtol's.
    assert error.max() <= DEFAULT_RTOL[dtype] * ERROR_SLACK
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        matroot.polar(torch.asarray(g).to(getattr(torch, dtype)))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 0.0), (np.float64, 1e-20),
                                         (np.float32, 1e-8)])
def test_polar_refuses_an_rtol_no_factor_can_meet(dtype, rtol):
    """``polar(g, rtol=0)`` (or any rtol below the rounding of the returned factor)
    ran the whole schedule and reported every matrix not converged, where
    ``inv_root`` refuses such an rtol up front with the fix."""
    g = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(dtype)
    refused = r"(below what .* certify.*no polar factor)|(in \(0, 1\].*got 0.0)"
    with pytest.raises(ValueError, match=refused):
        matroot.polar_info(g, rtol=rtol)


def test_polar_refuses_an_rtol_above_one():
    g = np.random.default_rng(0).standard_normal((2, 5, 3))
    with pytest.raises(ValueError, match=r"rtol must be in \(0, 1\].*polar factor.*got 1.5"):
        matroot.polar_info(g, rtol=1.5)


def test_polar_result_has_a_one_line_repr():
    result = matroot.polar_info(np.stack([np.eye(3), np.full((3, 3), np.nan)]),
                                check_finite=False)
    line = repr(result)
    assert line.startswith("PolarResult(method=") and "converged 1/2" in line
    assert "\n" not in line and "float64[2, 3, 3]" in line
