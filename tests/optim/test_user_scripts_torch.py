"""matroot's torch optimizers as other people's training scripts use them: AMP with a
GradScaler, ``optimizer.step()`` inside the autocast block, tied weights listed twice,
gradient accumulation, experts without a gradient on some steps, channels_last convs,
and a step traced on meta or fake tensors (torch's memory estimators).

Each scenario runs a tiny model a few steps, with the library's defaults where the
script would use them, and checks that it trains and, where one exists, matches its
reference (the same script without the twist).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from matroot.optim import SOAP, Muon, Shampoo

NAMES = ("shampoo", "soap", "muon")


def _make(name, model, named=True, **options):
    if name == "shampoo":
        return Shampoo(model.parameters() if named else model, lr=1e-2,
                       precondition_frequency=2, start_preconditioning_step=2, **options)
    if name == "soap":
        return SOAP(model.parameters() if named else model, lr=1e-2,
                    precondition_frequency=2, **options)
    return Muon(model.named_parameters() if named else model, lr=0.02, adamw_lr=1e-2,
                **options)


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.out = (torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                                        torch.nn.Linear(16, 4))

    def forward(self, x):
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _data(n=64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def _max_difference(a, b):
    return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _twins():
    torch.manual_seed(0)
    a, b = _MLP(), _MLP()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("name", NAMES)
def test_amp_grad_scaler_with_unscale_and_clipping_trains(name):
    """The AMP recipe: autocast forward, scaled backward, ``unscale_``, clipping,
    ``scaler.step`` (which reads the optimizer's gradients and state), ``update``."""
    torch.manual_seed(0)
    model, (x, y) = _MLP(), _data()
    opt = _make(name, model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    losses = []
    for _ in range(12):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("name", NAMES)
def test_step_inside_the_autocast_block_is_the_step_outside_it(name):
    """``opt.step()`` inside ``torch.autocast`` ran the factor products, root solves and
    polar iterations in bfloat16: Shampoo's parameters differed by 0.06 after 10 steps,
    SOAP's by 0.03. The step now runs with autocast off, as the same script with the
    step after the block."""
    models = _twins()
    x, y = _data()
    opts = [_make(name, m) for m in models]
    for _ in range(6):
        for inside, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                F.mse_loss(model(x).float(), y).backward()
                if inside:
                    opt.step()
            if not inside:
                opt.step()
    assert _max_difference(*models) == 0.0


class _Tied(torch.nn.Module):
    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.mid = torch.nn.Linear(dim, dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, tokens):
        return self.lm_head(torch.tanh(self.mid(self.emb(tokens))))


@pytest.mark.parametrize("name", NAMES)
def test_tied_weight_listed_twice_is_updated_once(name):
    """``named_parameters(remove_duplicate=False)`` lists an embedding tied to the LM
    head twice; torch's optimizers warn and step it twice. It was stepped twice here
    too (0.1-0.2 away from the deduplicated run after 6 steps); now the first listing
    is kept, with a warning, and the run is the deduplicated one."""
    torch.manual_seed(0)
    tied, ref = _Tied(), _Tied()
    ref.load_state_dict(tied.state_dict())
    listed = list(tied.named_parameters(remove_duplicate=False))
    assert len(listed) == len(list(tied.parameters())) + 1
    with pytest.warns(UserWarning, match="listed more than once"):
        opt = _make(name, listed if name == "muon" else [p for _, p in listed], named=False)
    ref_opt = _make(name, ref)
    tokens = torch.randint(0, 11, (16, 5), generator=torch.Generator().manual_seed(2))
    for _ in range(6):
        for model, o in ((tied, opt), (ref, ref_opt)):
            o.zero_grad()
            F.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(1, 1).flatten()).backward()
            o.step()
    assert _max_difference(tied, ref) == 0.0


@pytest.mark.parametrize("name", ("shampoo", "muon"))
def test_accumulated_micro_batches_match_the_whole_batch(name):
    """Four micro-batches of mean losses / 4 accumulated with
    ``zero_grad(set_to_none=False)``: the whole batch's run up to rounding. (SOAP is
    left out: rounding-level gradient differences move its eigenbases, and Adam in
    the rotated coordinates amplifies them to 1e-2 in 6 steps, as it does any 1e-6
    relative perturbation.)"""
    whole, accumulated = _twins()
    x, y = _data()
    opt, acc_opt = _make(name, whole), _make(name, accumulated)
    for _ in range(6):
        opt.zero_grad()
        F.mse_loss(whole(x), y).backward()
        opt.step()
        acc_opt.zero_grad(set_to_none=False)
        for k in range(4):
            rows = slice(16 * k, 16 * k + 16)
            (F.mse_loss(accumulated(x[rows]), y[rows]) / 4).backward()
        acc_opt.step()
    assert _max_difference(whole, accumulated) < 1e-4


class _Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x, used):
        h = torch.relu(self.inp(x))
        for e in used:
            h = h + torch.relu(self.experts[e](h))
        return self.head(h)


@pytest.mark.parametrize("name", NAMES)
def test_an_expert_without_gradient_stays_put_and_trains_once_routed(name):
    """An MoE expert that gets no gradient for its first steps (``grad is None``) is not
    moved, then trains once it is used; the others train throughout."""
    torch.manual_seed(0)
    model, (x, y) = _Experts(), _data()
    opt = _make(name, model)
    unused = model.experts[2].weight.detach().clone()
    losses = []
    for step, used in enumerate([[0], [0, 1], [1], [0, 1]] + [[0, 1, 2], [2], [1, 2]] * 2):
        opt.zero_grad()
        loss = F.mse_loss(model(x, used), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if step == 3:
            assert torch.equal(model.experts[2].weight, unused)
    assert not torch.equal(model.experts[2].weight, unused)
    assert losses[-1] < losses[0]


class _ConvBlock(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.stem, self.bn0 = torch.nn.Conv2d(3, c, 3, padding=1, bias=False), \
            torch.nn.BatchNorm2d(c)
        self.depthwise = torch.nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.pointwise, self.bn1 = torch.nn.Conv2d(c, c, 1, bias=False), torch.nn.BatchNorm2d(c)
        self.fc = torch.nn.Linear(c, 5)

    def forward(self, x):
        h = F.relu(self.bn0(self.stem(x)))
        h = h + F.relu(self.bn1(self.pointwise(self.depthwise(h))))
        return self.fc(h.mean((2, 3)))


@pytest.mark.parametrize("name", NAMES)
def test_channels_last_convs_step_as_contiguous_ones_and_keep_their_layout(name):
    """A ResNet-style block (BatchNorm, 3×3, depthwise and 1×1 convs) in channels_last
    takes the contiguous model's steps from the same gradients (its own backward
    rounds differently, which SOAP's eigenbases amplify), and stays channels_last."""
    torch.manual_seed(0)
    plain = _ConvBlock()
    last = _ConvBlock()
    last.load_state_dict(plain.state_dict())
    last = last.to(memory_format=torch.channels_last)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 3, 6, 6, generator=g), torch.randint(0, 5, (8,), generator=g)
    opts = [_make(name, plain), _make(name, last)]
    losses = []
    for _ in range(4):
        opts[0].zero_grad()
        loss = F.cross_entropy(plain(x), y)
        loss.backward()
        losses.append(float(loss))
        for p, q in zip(plain.parameters(), last.parameters()):
            q.grad = torch.empty_like(q).copy_(p.grad)      # in q's memory format
        for opt in opts:
            opt.step()
    assert last.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert _max_difference(plain, last) == 0.0
    assert losses[-1] < losses[0]


def _state_layout(opt):
    return sorted((tuple(v.shape), v.dtype) for entry in opt.state.values()
                  for v in entry.values() if torch.is_tensor(v) and v.ndim)


@pytest.mark.parametrize("name", ("shampoo", "muon"))
def test_a_step_on_meta_parameters_makes_the_state_a_real_step_makes(name):
    """The NaN screen read ``.item()`` of meta gradients (RuntimeError) and the solvers
    refused meta stacks: a step now runs with host reads off, and the state it makes
    has the shapes and dtypes of a real step's, root refresh included."""
    torch.manual_seed(0)
    real = _MLP()
    with torch.device("meta"):
        meta = _MLP()
    opts = [_make(name, real), _make(name, meta)]
    for model, opt in zip((real, meta), opts):
        x = torch.randn(4, 8, device=next(model.parameters()).device)
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    assert _state_layout(opts[1]) == _state_layout(opts[0])
    assert {v.device.type for e in opts[1].state.values() for v in e.values()
            if torch.is_tensor(v)} == {"meta"}
    if name == "shampoo":
        family = opts[1]._families[0]
        assert [r.device.type for r in family.state.roots if r is not None] == \
            ["meta"] * sum(r is not None for r in opts[0]._families[0].state.roots)


@pytest.mark.parametrize("name", NAMES)
def test_a_step_under_fake_tensor_mode_between_real_ones(name):
    """``FakeTensorMode`` (torch's memory and FLOP estimators trace a training step in
    it) raised ``DataDependentOutputException`` at the NaN screen, and Shampoo's cached
    packing indices mixed real tensors into the fake step (and would have left fake
    ones for the next real step). Shampoo and Muon now step, between real steps of
    the same shapes; SOAP, whose eigenbasis refresh reads values, says why it cannot."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def train(model, opt, x):
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

    torch.manual_seed(0)
    train(model := _MLP(), _make(name, model), torch.randn(4, 8))
    with FakeTensorMode():
        fake = _MLP()
        opt = _make(name, fake)
        if name == "soap":
            fake(torch.randn(4, 8)).sum().backward()
            with pytest.raises(ValueError, match="hold no values"):
                opt.step()
            return
        train(fake, opt, torch.randn(4, 8))
    assert len(opt.state) == len(list(fake.parameters()))
    train(model, opt := _make(name, model), torch.randn(4, 8))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_real_step_after_the_valueless_ones_reads_the_host_again():
    """The host reads are off only inside a valueless step: a real model's NaN screen
    still raises afterwards."""
    with torch.device("meta"):
        meta = _MLP()
    opt = _make("shampoo", meta)
    meta(torch.randn(2, 8, device="meta")).sum().backward()
    opt.step()
    model = _MLP()
    opt = _make("shampoo", model)
    model(torch.randn(2, 8)).sum().backward()
    model.fc1.weight.grad[0, 0] = float("nan")
    with warnings.catch_warnings(), pytest.raises(Exception, match="NaN or Inf"):
        opt.step()


@pytest.mark.parametrize("name", NAMES)
def test_groups_may_carry_the_scripts_own_keys(name):
    """Scripts label their groups (``"name"``, a resumed scheduler's ``"initial_lr"``), as
    torch allows; SOAP refused them as unknown options. A misspelled option raises,
    with the nearest name (Shampoo ignored it)."""
    torch.manual_seed(0)
    model, (x, y) = _MLP(), _data()
    matrices = [p for p in model.parameters() if p.ndim == 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": matrices, "name": "decay", "weight_decay": 0.01},
              {"params": vectors, "name": "no_decay", "weight_decay": 0.0, "initial_lr": 0.01}]
    if name == "muon":
        groups = [dict(groups[0], use_muon=True), dict(groups[1], use_muon=False)]
    opt = _make(name, groups, named=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9 ** step)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        schedule.step()
    opt.load_state_dict(opt.state_dict())
    assert [g["name"] for g in opt.param_groups] == ["decay", "no_decay"]
    if name != "muon":
        with pytest.raises(TypeError, match="did you mean 'weight_decay'"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))],
                                 "weight_decy": 0.1})
