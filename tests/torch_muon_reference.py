"""torch.optim.Muon with float32 iterates: its own iteration carries bfloat16 ones, whose
rounding a rank-deficient gradient's null directions amplify through the quintic, so
exact comparisons with matroot's Muon swap this in (pytest's ``monkeypatch``)."""

from __future__ import annotations


def newton_schulz_float32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's orthogonalization with float32 iterates instead of bfloat16."""
    a, b, c = ns_coefficients
    x = grad.T if grad.size(0) > grad.size(1) else grad
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if grad.size(0) > grad.size(1) else x


def use_float32_iterates(monkeypatch) -> None:
    """Make torch.optim.Muon iterate in float32 for the rest of the test."""
    import torch.optim._muon as torch_muon

    monkeypatch.setattr(torch_muon, "_zeropower_via_newtonschulz", newton_schulz_float32)
