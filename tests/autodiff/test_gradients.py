"""Differentiating through the roots and the polar factor, and transforming them:
torch autograd (reverse and forward mode, under torch.compile too), ``jax.grad`` /
``jax.jvp`` under ``jax.jit`` and ``jax.vmap``, and torch.func refused with the fix.

Each test names what it found before its fix. Derivatives are compared with the
Daleckii–Krein formula written out by hand, or with central differences of the
float64 oracle.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import matroot
from matroot.testing import (oracle_inv_root, relative_error)

torch = pytest.importorskip("torch")

METHODS = ["evd", "newton_db", "coupled_newton", "minimax", "chebyshev"]


def _gram_stack(seed: int, b: int = 2, n: int = 5, ridge: float = 0.1) -> np.ndarray:
    g = np.random.default_rng(seed).standard_normal((b, n, n + 2))
    return g @ np.swapaxes(g, -1, -2) + ridge * np.eye(n)


def _oracle_directional(a, p, eps, weight, direction, h=1e-5):
    """d/dt Σ W ∘ (A + tD + eps·I)^(-1/p) at t = 0 by central differences of the
    float64 oracle: truncation O(h²·‖D‖²/λmin²), rounding O(u/h); both far below
    the 1e-6 the tests allow at these spectra (λmin ≥ 0.1, ‖D‖ ≈ 3)."""
    def value(t):
        return np.sum(weight * oracle_inv_root(a + t * direction, p, eps=eps), axis=(-2, -1))
    return (value(h) - value(-h)) / (2 * h)


@pytest.mark.parametrize("method", METHODS + ["auto"])
def test_the_gradient_at_repeated_eigenvalues_is_finite_and_exact(method):
    """The gradient of an evd root (the CPU default, ``auto``) was NaN wherever two
    eigenvalues coincide, the identity and every ``eps·I`` Shampoo starts from
    included: torch's eigh backward divides by their gap. The iterative methods
    differentiated their own iterations. Every method now gives the derivative of the
    exact root: for V = I it is Γ ∘ W, Γ the divided differences of λ^(-1/2)."""
    lam = np.array([1.0, 1.0, 2.0])
    a = torch.tensor(np.diag(lam)[None], requires_grad=True)
    weight = torch.tensor(np.arange(9.0).reshape(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        root = matroot.inv_root(a, 2, method=method)
    (grad,) = torch.autograd.grad((root * weight).sum(), a)
    f, slope = lam ** -0.5, -0.5 * lam ** -1.5
    gap = lam[:, None] - lam[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(gap == 0, slope[:, None], (f[:, None] - f[None, :]) / gap)
    w = weight.numpy()
    expected = gamma * (w + w.T) / 2  # the root is a function of (A + Aᵀ)/2
    # float64 eigh of a diagonal matrix: exact up to a few rounding errors.
    np.testing.assert_allclose(grad[0].numpy(), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("p", [1, 2, 4])
def test_torch_gradient_matches_finite_differences_of_the_oracle(method, p):
    """Differentiating through the iterations gave the derivative of the truncated
    iteration (and kept every iterate alive for the backward pass); the attached
    derivative is the exact root's, a nonsymmetric input included."""
    eps = 1e-2
    a = _gram_stack(p)
    rng = np.random.default_rng(10 + p)
    weight = rng.standard_normal(a.shape)
    direction = rng.standard_normal(a.shape)  # not symmetric: the root sees its sym part
    at = torch.tensor(a, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroot.ConvergenceWarning)
        root = matroot.inv_root(at, p, method=method, eps=eps)
    (grad,) = torch.autograd.grad((root * torch.tensor(weight)).sum(), at)
    ad = np.sum(grad.numpy() * direction, axis=(-2, -1))
    fd = _oracle_directional(a, p, eps, weight, (direction + np.swapaxes(direction, -1, -2)) / 2)
    np.testing.assert_allclose(ad, fd, rtol=1e-6)


def test_float32_gradients_and_no_grad():
    """A float32 root's gradient comes back in float32 (computed in float64 from the
    input), to float32's rounding of it; under ``torch.no_grad`` nothing is attached."""
    a = _gram_stack(3).astype(np.float32)
    at = torch.tensor(a, requires_grad=True)
    root = matroot.inv_root(at, 4, method="newton_db", eps=1e-2)
    (grad,) = torch.autograd.grad(root.sum(), at)
    assert grad.dtype == torch.float32
    a64 = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    (grad64,) = torch.autograd.grad(matroot.inv_root(a64, 4, method="evd", eps=1e-2).sum(), a64)
    # κ ≈ 1e2 here: the float32 cast of a float64 gradient, nothing of the solve.
    assert torch.linalg.norm(grad.double() - grad64) <= 1e-6 * torch.linalg.norm(grad64)
    with torch.no_grad():
        assert not matroot.inv_root(at, 4, method="newton_db", eps=1e-2).requires_grad


@pytest.mark.compile
def test_the_gradient_under_torch_compile():
    """The attached derivative traces into a fullgraph torch.compile graph (a torch
    Function class defined inside the compiled call could not be traced) and equals
    the eager one to float32 rounding of the same formula."""
    a = torch.tensor(_gram_stack(4), dtype=torch.float32, requires_grad=True)

    def loss(x):
        return matroot.inv_root(x, 2, method="newton_db", eps=1e-2, tol=0.0, max_iter=2).sum()

    (eager,) = torch.autograd.grad(loss(a), a)
    (compiled,) = torch.autograd.grad(torch.compile(loss, fullgraph=True)(a), a)
    # Both are the float32 cast of one float64 formula on the same input.
    assert torch.linalg.norm(compiled - eager) <= 1e-6 * torch.linalg.norm(eager)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
@pytest.mark.parametrize("call", ["inv_root", "polar"])
def test_torch_func_transforms_are_refused_with_the_fix(transform, call):
    """torch.func.vmap died with torch's "data-dependent control flow ... please file
    an issue at pytorch" RuntimeError, torch.func.grad with "Cannot access data
    pointer of Tensor that doesn't have storage"."""
    a = torch.tensor(_gram_stack(0), dtype=torch.float64)

    def fn(x):
        out = matroot.inv_root(x, 2) if call == "inv_root" else matroot.polar(x)
        return out if transform == "vmap" else out.sum()

    with pytest.raises(TypeError, match=r"torch\.func.*leading dimensions.*torch\.autograd"):
        getattr(torch.func, transform)(fn)(a)


@pytest.fixture
def jax_x64():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", previous)


@pytest.mark.parametrize("method", ["newton_db", "evd"])
def test_jax_grad_under_jit_and_vmap(jax_x64, method):
    """``jax.grad`` through an iterative method raised JAX's "Reverse-mode
    differentiation does not work for lax.while_loop" ValueError, and through evd
    gave NaN at repeated eigenvalues. Now jit, grad and vmap compose, with the
    exact derivative."""
    jnp = jax_x64.numpy
    a = np.concatenate([_gram_stack(5, b=1), 2.0 * np.eye(5)[None]])
    weight = np.random.default_rng(6).standard_normal(a.shape)

    def loss(x, w):
        return jnp.sum(matroot.inv_root(x, 2, method=method, eps=1e-2) * w)

    per_matrix = jax_x64.jit(jax_x64.vmap(jax_x64.grad(loss)))(jnp.asarray(a), jnp.asarray(weight))
    direction = np.random.default_rng(7).standard_normal(a.shape)
    direction = direction + np.swapaxes(direction, -1, -2)
    ad = np.sum(np.asarray(per_matrix) * direction, axis=(-2, -1))
    np.testing.assert_allclose(ad, _oracle_directional(a, 2, 1e-2, weight, direction),
                               rtol=1e-6)


def test_jax_vmap_over_coupled_newton(jax_x64):
    """``jax.vmap`` over coupled_newton raised TracerArrayConversionError: the loop
    judged "traced" from its first state entry, an identity built from constants and
    so concrete under vmap, and read the batched masks on the host."""
    jnp = jax_x64.numpy
    a = _gram_stack(8, b=4).reshape(2, 2, 5, 5)
    res = jax_x64.vmap(lambda x: matroot.inv_root_info(x, 4, method="coupled_newton"),
                       in_axes=1, out_axes=1)(jnp.asarray(a))
    assert np.asarray(res.converged).all()
    assert (relative_error(np.asarray(res.root), oracle_inv_root(a, 4)) <= 1e-7).all()


def test_jax_forward_mode_derivative(jax_x64):
    """``jax.jvp`` through an iterative method worked before (forward mode through a
    while_loop) and must keep working with the attached derivative: it is the same
    exact one as reverse mode's."""
    jnp = jax_x64.numpy
    a = _gram_stack(9)
    direction = np.random.default_rng(9).standard_normal(a.shape)
    direction = direction + np.swapaxes(direction, -1, -2)
    _, tangent = jax_x64.jvp(lambda x: matroot.inv_root(x, 4, method="newton_db", eps=1e-2),
                             (jnp.asarray(a),), (jnp.asarray(direction),))
    weight = np.random.default_rng(10).standard_normal(a.shape)
    np.testing.assert_allclose(np.sum(np.asarray(tangent) * weight, axis=(-2, -1)),
                               _oracle_directional(a, 4, 1e-2, weight, direction), rtol=1e-6)


def test_torch_forward_mode_derivative():
    """Forward-mode AD (``torch.autograd.forward_ad`` dual tensors) went through the
    iterations before the derivative was attached; it must still give the exact
    derivative, not drop the tangent."""
    forward_ad = torch.autograd.forward_ad
    a = _gram_stack(11)
    direction = np.random.default_rng(11).standard_normal(a.shape)
    direction = direction + np.swapaxes(direction, -1, -2)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(torch.tensor(a), torch.tensor(direction))
        tangent = forward_ad.unpack_dual(matroot.inv_root(dual, 2, method="minimax",
                                                          eps=1e-2)).tangent
    assert tangent is not None
    weight = np.random.default_rng(12).standard_normal(a.shape)
    np.testing.assert_allclose(np.sum(tangent.numpy() * weight, axis=(-2, -1)),
                               _oracle_directional(a, 2, 1e-2, weight, direction), rtol=1e-6)


def test_a_non_finite_matrix_leaves_the_others_gradients_alone():
    """With ``check_finite=False`` one NaN matrix made torch's backward pass raise
    ``linalg.eigh: (Batch element 1): The algorithm failed to converge`` for the
    whole batch; its gradient is NaN now and its neighbours' are what they are alone."""
    a = _gram_stack(13, b=3)
    a[1, 0, 0] = np.nan
    at = torch.tensor(a, requires_grad=True)
    root = matroot.inv_root_info(at, 2, method="newton_db", check_finite=False).root
    (grad,) = torch.autograd.grad(torch.nan_to_num(root).sum(), at)
    assert torch.isnan(grad[1]).all()
    alone = torch.tensor(a[[0, 2]], requires_grad=True)
    (expected,) = torch.autograd.grad(matroot.inv_root(alone, 2, method="newton_db").sum(), alone)
    # Same formula on the same matrices; batched LAPACK calls per matrix, so equal
    # to rounding (not bitwise: the batch differs).
    torch.testing.assert_close(grad[[0, 2]], expected, rtol=1e-12, atol=0)


def _polar_directional(g, weight, direction, h=1e-6):
    """d/dt Σ W ∘ polar(G + tE) at t = 0 by central differences of the SVD oracle."""
    from matroot.testing import oracle_polar

    def value(t):
        return np.sum(weight * oracle_polar(g + t * direction), axis=(-2, -1))
    return (value(h) - value(-h)) / (2 * h)


@pytest.mark.parametrize("method", ["svd", "eigh", "polar_express"])
@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (4, 4)])
def test_polar_gradient_at_repeated_singular_values(method, shape):
    """The gradient of ``polar(g, method="svd")`` was NaN for an orthonormal g (all
    σ = 1), and ``"eigh"``'s for a multiple of the identity: the decompositions'
    own backward passes divide by singular-value gaps. They get the exact
    derivative now (matroot.polar_factor.gradient); polar_express differentiates its
    steps, which agree with it where the factor converged."""
    rng = np.random.default_rng(14)
    m, n = shape
    frame, _ = np.linalg.qr(rng.standard_normal((max(m, n), min(m, n))))
    g = np.stack([2.0 * (frame if m >= n else frame.T),
                  rng.standard_normal(shape)])
    weight, direction = rng.standard_normal(g.shape), rng.standard_normal(g.shape)
    gt = torch.tensor(g, requires_grad=True)
    factor = matroot.polar(gt, method=method)
    (grad,) = torch.autograd.grad((factor * torch.tensor(weight)).sum(), gt)
    ad = np.sum(grad.numpy() * direction, axis=(-2, -1))
    # polar_express stops at its float64 rtol (1e-10): its steps' derivative is that
    # close to the exact one; the finite differences add O(h²) ≈ 1e-12.
    np.testing.assert_allclose(ad, _polar_directional(g, weight, direction), rtol=1e-6)
