"""A per-parameter SOAP in float64 NumPy: the tests' oracle for matroot's stacked SOAP.

Written from the definitions (docs/soap.rst, arXiv 2409.11321), one block at a time,
with ``numpy.linalg.eigh`` for every eigenbasis: Adam on ``Q_LᵀGQ_R``; the direction
``Q_L·D̃·Q_Rᵀ``; ``−lr·(D + wd·param)``; then factors ``L ← βL + (1−β)GGᵀ`` and on a
refresh the eigenvectors of L and R, the first moment rotated by ``P = Q_newᵀQ_old``
and the second by ``P∘P``, for the next step. Parameters without factors take AdamW.

With ``grafting`` (Distributed Shampoo's ``grafting_config``), each block's direction
(each parameter's, without factors) is rescaled to the Frobenius norm of its grafting
direction from ``start_preconditioning_step`` on, and is that direction before: the
bias-corrected EMA ``m̂`` of the gradient (sgd) or ``m̂/(√v̂ + eps')``, all kept here
in the parameter's basis with moments of their own.
"""

from __future__ import annotations

import math

import numpy as np

from matroot.optim.shampoo_core.blocking import plan_blocks


class ReferenceSOAP:
    def __init__(self, params, *, lr, betas, eps, weight_decay, shampoo_beta=None,
                 precondition_frequency=10, start_preconditioning_step=1, block_size=1024,
                 max_preconditioned_dim=10000, bias_correction=True, grafting="none",
                 grafting_beta2=None, grafting_eps=None):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.beta = betas[1] if shampoo_beta is None else shampoo_beta
        self.freq, self.start, self.correct = (precondition_frequency,
                                               start_preconditioning_step, bias_correction)
        self.grafting = grafting
        self.graft_b2 = self.b2 if grafting_beta2 is None else grafting_beta2
        self.graft_eps = eps if grafting_eps is None else grafting_eps
        from matroot.optim.soap import SOAPConfig
        policy = SOAPConfig(max_preconditioned_dim=max_preconditioned_dim).factor_policy
        self.plan = plan_blocks([p.shape for p in params], ["float64"] * len(params),
                                block_size=block_size, policy=policy, stacked=False)
        self.blocks: list = []     # (param, index, state dict)
        for group in self.plan.groups:
            for b in group.blocks:
                r, c = b.rows[1] - b.rows[0], b.cols[1] - b.cols[0]
                self.blocks.append((b.param, b.index, {
                    "L": np.zeros((r, r)) if group.left else None,
                    "R": np.zeros((c, c)) if group.right else None,
                    "QL": np.eye(r), "QR": np.eye(c),
                    "m": np.zeros((r, c)), "v": np.zeros((r, c)),
                    "gm": np.zeros((r, c)), "gv": np.zeros((r, c))}))
        self.flat = {i: [np.zeros(p.shape) for _ in range(4)]
                     for i, (p, lay) in enumerate(zip(params, self.plan.params))
                     if lay.kind == "elementwise"}
        self.t = 0
        self.param_t = [0] * len(params)

    def _adam(self, m, v, g, t):
        m[...] = self.b1 * m + (1 - self.b1) * g
        v[...] = self.b2 * v + (1 - self.b2) * g * g
        c1 = 1 - self.b1 ** t if self.correct else 1.0
        c2 = 1 - self.b2 ** t if self.correct else 1.0
        return (m / c1) / (np.sqrt(v) / math.sqrt(c2) + self.eps)

    def _graft(self, d, gm, gv, g, t):
        """``d`` grafted (or replaced) by the grafting direction of the moments ``gm``,
        ``gv``, advanced here with the gradient ``g``."""
        if self.grafting == "none":
            return d
        gm[...] = self.b1 * gm + (1 - self.b1) * g
        a = gm / (1 - self.b1 ** t if self.correct else 1.0)
        if self.grafting != "sgd":
            if self.grafting == "adagrad":
                gv += g * g
            else:
                gv[...] = self.graft_b2 * gv + (1 - self.graft_b2) * g * g
            root = np.sqrt(gv)
            if self.grafting == "adam" and self.correct and self.graft_b2 < 1:
                root = root / math.sqrt(1 - self.graft_b2 ** t)
            a = a / (root + self.graft_eps)
        if self.t < self.start:
            return a
        norm = np.linalg.norm(d)
        return d * (np.linalg.norm(a) / norm) if norm > 0 else d

    def step(self, params, grads):
        """One step; a None gradient leaves its parameter and its state as they are
        (its own step count drives its bias corrections)."""
        self.t += 1
        for i, g in enumerate(grads):
            self.param_t[i] += g is not None
        since = self.t - self.start
        refresh = since >= 0 and since % self.freq == 0
        directions = [np.zeros(p.shape) for p in params]
        views = [None if g is None else g.reshape(lay.view)
                 for g, lay in zip(grads, self.plan.params)]
        out_views = [d.reshape(lay.view) for d, lay in zip(directions, self.plan.params)]
        for i, (m, v, gm, gv) in self.flat.items():
            if grads[i] is not None:
                t = self.param_t[i]
                directions[i][...] = self._graft(self._adam(m, v, grads[i], t), gm, gv,
                                                 grads[i], t)
        for param, index, s in self.blocks:
            # A block without a gradient keeps its moments and factors; its basis is
            # still refreshed on schedule (from factors its last gradients changed).
            if views[param] is not None:
                g = views[param][index]
                t = self.param_t[param]
                d = self._adam(s["m"], s["v"], s["QL"].T @ g @ s["QR"], t)
                out_views[param][index] = self._graft(s["QL"] @ d @ s["QR"].T, s["gm"],
                                                      s["gv"], g, t)
                if s["L"] is not None:
                    s["L"] = self.beta * s["L"] + (1 - self.beta) * g @ g.T
                if s["R"] is not None:
                    s["R"] = self.beta * s["R"] + (1 - self.beta) * g.T @ g
            if refresh:
                pl = pr = None
                if s["L"] is not None:
                    new = np.linalg.eigh(s["L"])[1]
                    pl, s["QL"] = new.T @ s["QL"], new
                if s["R"] is not None:
                    new = np.linalg.eigh(s["R"])[1]
                    pr, s["QR"] = new.T @ s["QR"], new
                pl = np.eye(s["m"].shape[0]) if pl is None else pl
                pr = np.eye(s["m"].shape[1]) if pr is None else pr
                s["m"] = pl @ s["m"] @ pr.T
                s["v"] = (pl * pl) @ s["v"] @ (pr * pr).T
        return [p if g is None else p - self.lr * (d + self.wd * p)
                for p, d, g in zip(params, directions, grads)]
