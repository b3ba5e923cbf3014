"""Hypothesis strategies for SPD stacks that keep their float64 oracle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from oracle import random_orthogonal


@dataclass
class SPDCase:
    """A stack ``a = Q diag(lam) Qᵀ`` (float64) with its eigendecomposition."""

    a: np.ndarray
    q: np.ndarray
    lam: np.ndarray

    @property
    def kappa(self) -> float:
        return float(np.max(self.lam.max(-1) / self.lam.min(-1)))

    def inv_root(self, p, eps=0.0):
        w = (self.lam + eps) ** (-1.0 / p)
        return (self.q * w[..., None, :]) @ np.swapaxes(self.q, -1, -2)


@st.composite
def spd_stacks(draw, *, max_n=16, max_log_kappa=4.0, batch_shapes=None):
    """Draw an SPD stack with λmax in [1e-3, 1e3] and κ up to ``10**max_log_kappa``."""
    n = draw(st.integers(1, max_n))
    if batch_shapes is None:
        batch_shapes = st.sampled_from([(), (1,), (3,), (2, 2)])
    batch = draw(batch_shapes)
    log_kappa = draw(st.floats(0.0, max_log_kappa))
    log_top = draw(st.floats(-3.0, 3.0))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    top = 10.0 ** log_top
    if n == 1:
        lam = np.full((*batch, 1), top)
    else:
        # Random interior eigenvalues, with both ends pinned so κ is exact.
        inner = 10.0 ** rng.uniform(-log_kappa, 0.0, (*batch, n - 2))
        ends = np.broadcast_to(np.array([10.0 ** -log_kappa, 1.0]), (*batch, 2))
        lam = top * np.sort(np.concatenate([ends, inner], axis=-1), axis=-1)
    q = random_orthogonal(rng, batch, n)
    a = (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)
    return SPDCase((a + np.swapaxes(a, -1, -2)) / 2, q, lam)


#: The spectra on which a λmax estimate or a coupled residual is most easily fooled.
ADVERSARIAL_KINDS = ("isolated_top", "clustered", "gram_ridge")


@st.composite
def adversarial_spd_stacks(draw, *, sizes=(8, 32, 96), kinds=ADVERSARIAL_KINDS):
    """Draw ``(case, eps)``: a PSD stack of 2 matrices and a ridge, from an adversarial family.

    - ``isolated_top``: λmax = 1 over a bulk repeated at 0.5–0.95 (power iteration
      falls short most here), plus a tail down to 10**-log_kappa;
    - ``clustered``: 2–4 tight clusters spread over up to 1e6;
    - ``gram_ridge``: a Shampoo factor, the Gram matrix of a rank-k gradient
      block (k < n), with a ridge eps = λmax·10**-log_kappa.
    """
    n = draw(st.sampled_from(sizes))
    kind = draw(st.sampled_from(kinds))
    log_kappa = draw(st.floats(1.0, 6.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q = random_orthogonal(rng, (2,), n)
    eps = 0.0
    if kind == "isolated_top":
        bulk = draw(st.floats(0.5, 0.95))
        lam = np.full((2, n), bulk)
        tail = max(1, n // 8)
        lam[:, :tail] = np.geomspace(10.0 ** -log_kappa, bulk, tail)
        lam[:, -1] = 1.0
    elif kind == "clustered":
        centres = 10.0 ** -rng.uniform(0.0, log_kappa, draw(st.integers(2, 4)))
        centres[0] = 1.0
        picks = rng.integers(0, centres.size, (2, n))
        lam = centres[picks] * (1 + 1e-3 * rng.standard_normal((2, n)))
        lam[:, 0] = 1.0
    else:
        k = draw(st.integers(1, max(1, n - 1)))
        g = rng.standard_normal((2, n, k))
        gram = g @ np.swapaxes(g, -1, -2)
        lam, q = np.linalg.eigh((gram + np.swapaxes(gram, -1, -2)) / 2)
        lam = np.maximum(lam, 0.0)
        eps = float(lam.max()) * 10.0 ** -log_kappa
    lam = np.sort(lam, axis=-1)
    a = (q * lam[..., None, :]) @ np.swapaxes(q, -1, -2)
    return SPDCase((a + np.swapaxes(a, -1, -2)) / 2, q, lam), eps
