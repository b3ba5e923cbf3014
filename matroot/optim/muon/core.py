"""Stacked Muon, functional core: every same-shape matrix of the model orthogonalized in
one batched :func:`matroot.polar_info` call per shape.

Muon (Keller Jordan, 2024) replaces a matrix parameter's momentum by its polar
factor. The direction for a matrix ``W`` (m×n) with gradient ``G`` is

- momentum ``B ← μ·B + (1 − μ)·G`` and, with Nesterov, ``U = (1 − μ)·G + μ·B``
  (else ``U = B``), the convention of ``torch.optim.Muon``;
- ``D = scale(m, n)·polar(U)`` with the **shape scale** ``"original"``:
  ``√max(1, m/n)`` (torch.optim.Muon's default), or ``"match_rms_adamw"``:
  ``0.2·√max(m, n)`` (Moonlight: the update's RMS matches AdamW's, so AdamW's
  learning rate and weight decay carry over).

The shells apply ``W ← W·(1 − lr·weight_decay) − lr·D`` (decoupled decay).

**Which parameters get Muon** (the shells decide, by this documented rule,
:func:`default_use_muon`): matrices, except embeddings and output heads (known by
name) and matrices with one row or column, which (like all 1-D parameters: biases,
norms) take AdamW, whose direction here is ``m̂/(√v̂ + eps)`` with bias-corrected
moments. A matrix without a name goes to Muon with a warning. A 3-D parameter
``(e, m, n)`` (MoE experts, per-head matrices) is a stack of e matrices; one
with four or more dimensions (a convolution) is viewed as
``(shape[0], prod(shape[1:]))``, as Keller Jordan's Muon does.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ... import _xp
from ...solvers.polar.coefficients import MUON_LOWER
from ...solvers.polar.registry import get_polar_method, polar_method_names
from ...polar_factor.api import polar_info
from ..shampoo_core.config import NONFINITE_POLICIES, check_keywords
from ..shampoo_core.option_groups import check_one_of

__all__ = ["MuonConfig", "MuonState", "SHAPE_SCALES", "muon_init", "muon_directions",
           "matrix_stack_shape", "shape_scale", "default_use_muon", "check_muon_keywords",
           "is_unnamed", "unnamed_matrices_warning", "muon_momentum", "adamw_directions",
           "orthogonalized"]

#: Aspect ratio from which ``polar_method="auto"`` iterates on the Gram side
#: (``gram_newton_schulz``, the same steps): measured against the 5-step quintic on
#: torch CPU, one thread, 4 steps: 0.42-0.53× the time at aspect ratio 8-16,
#: 0.46-0.66× at 4, 1.2× square (docs/polar.rst).
GRAM_SIDE_ASPECT = 4
#: The shape-scale conventions, by name.
SHAPE_SCALES = ("original", "match_rms_adamw")
#: Name parts (of a dotted parameter name or pytree path) that mark an output head.
HEAD_NAMES = ("head", "lm_head", "classifier")
#: First name parts that mark an output head: a model's own top-level ``output``
#: (Meta's Llama and torchtitan: ``output.weight``). Deeper, ``output`` is a hidden
#: layer (Hugging Face BERT's ``attention.output.dense``).
TOP_HEAD_NAMES = ("output",)
#: Name parts that mark an embedding without saying "emb": GPT-2's token and
#: position tables (``transformer.wte.weight`` in nanoGPT and Hugging Face's GPT-2).
EMBEDDING_NAMES = ("wte", "wpe")


def _name_parts(name: str | None) -> list[str]:
    """A dotted parameter name's or pytree path's parts (``/`` counts as ``.``)."""
    return [] if name is None else name.replace("/", ".").split(".")


def is_unnamed(name: str | None) -> bool:
    """Whether ``name`` says nothing the rule can read: None (``model.parameters()``)
    or only positions (the path ``"2"`` of a leaf in a list of arrays).

    Examples
    --------
    >>> from matroot.optim.muon.core import is_unnamed
    >>> is_unnamed(None), is_unnamed("1.0"), is_unnamed("layers.0.weight"), is_unnamed("w3")
    (True, True, False, False)
    """
    return all(part.isdigit() or not part for part in _name_parts(name))


def default_use_muon(name: str | None, shape: Sequence[int]) -> bool:
    """The documented rule: Muon for matrices except embeddings and heads.

    A parameter with fewer than two dimensions, or whose matrices (as
    :func:`matrix_stack_shape` views them) have one row or one column, is a
    vector: its polar factor would be its normalised gradient, so it takes AdamW
    (a ``Linear(256, 1)`` output layer, JAX's ``(256, 1)`` kernel). A name part
    (split at ``.`` or ``/``) that contains ``emb`` in any case
    (``embed_tokens``, ``tok_embeddings``, flax's ``Embed_0``, minGPT's ``tok_emb``)
    or equals one of :data:`EMBEDDING_NAMES` marks an embedding, one that equals one
    of :data:`HEAD_NAMES` (or, as the first part, :data:`TOP_HEAD_NAMES`) a head;
    without a name only the shape counts (the shells warn:
    :func:`unnamed_matrices_warning`).

    Examples
    --------
    >>> from matroot.optim.muon.core import default_use_muon
    >>> [default_use_muon(n, s) for n, s in [("layers.0.weight", (8, 8)),
    ...  ("embed_tokens.weight", (100, 8)), ("transformer.wte.weight", (100, 8)),
    ...  ("lm_head.weight", (100, 8)), ("norm.weight", (8,)), ("w3", (256, 1)),
    ...  ("tok_emb.weight", (100, 8)), ("output.weight", (100, 8)),
    ...  ("layer.0.attention.output.dense.weight", (8, 8))]]
    [True, False, False, False, False, False, False, False, True]
    """
    if len(shape) < 2 or min(matrix_stack_shape(shape)[1:]) == 1:
        return False
    parts = _name_parts(name)
    if parts and parts[0] in TOP_HEAD_NAMES:
        return False
    return not any("emb" in part.lower() or part in EMBEDDING_NAMES or part in HEAD_NAMES
                   for part in parts)


def unnamed_matrices_warning(shapes: Sequence[Sequence[int]], where: str,
                             fix: str) -> None:
    """Warn (``UserWarning``) that the rule sent matrices it could not name to Muon.

    Without names the rule cannot tell an embedding or an output head from a
    hidden matrix, and Muon on those trains worse (issue 37: 4 parameters of a
    model given by ``model.parameters()`` went to Muon, its embedding and head
    among them). ``fix`` says how to name them in the shell at hand.
    """
    if not shapes:
        return
    listed = ", ".join(str(tuple(s)) for s in shapes[:4]) + (", ..." if len(shapes) > 4 else "")
    warnings.warn(
        f"{where} gives {len(shapes)} parameter(s) of two or more dimensions without a "
        f"name to Muon (shapes {listed}): an embedding or output head among them would "
        f"train worse under Muon than under AdamW. {fix}", UserWarning, stacklevel=4)


@dataclass(frozen=True)
class MuonConfig:
    """Muon's and AdamW's hyperparameters, apart from the learning rate and decay.

    Attributes
    ----------
    momentum : float
        μ of the Muon momentum (0.95, as torch.optim.Muon).
    nesterov : bool
        Use ``(1 − μ)·G + μ·B`` instead of ``B``.
    shape_scale : {"original", "match_rms_adamw"}
        The per-matrix scale of the polar factor (module docstring).
    polar_method : str
        A :func:`matroot.polar` method. ``"auto"`` (the default): Polar Express's
        steps, iterated on the n×n Gram side (``"gram_newton_schulz"``) for
        matrices whose aspect ratio is at least :data:`GRAM_SIDE_ASPECT`, where it
        takes about half the time, on the matrix itself otherwise.
    polar_lower : float
        The lower bound on σmin/σmax the schedule is built for:
        :data:`~matroot.solvers.polar.coefficients.MUON_LOWER` (3.3e-3), the widest
        ``[ℓ, 1]`` that 4 steps bring into ``[0.8, 1.2]`` (Polar Express uses
        1e-3 with 5 steps).
    polar_steps : int or None
        Polynomial steps. None (the default): the method's own count for Muon
        (``PolarMethod.muon_steps``): 4 for ``polar_express`` (12 products), 5 for
        ``quintic`` (15, as torch.optim.Muon's ``ns_steps``). A count at least
        the schedule's length runs Polar Express to the precision's ``rtol``.
    matmul_dtype : {None, "float16", "bfloat16"}
        Operand dtype of the polar iteration's products.
    betas, eps : tuple of float, float
        AdamW's moments and denominator floor, for the non-Muon parameters.
    nonfinite_grads : {"raise", "skip"}
        What a step whose gradients hold NaN or Inf does, as Shampoo's and SOAP's
        (:func:`~matroot.optim.shampoo_core.gradients.apply_nonfinite_policy`):
        ``"raise"`` (the default) raises ``NonFiniteGradientError`` naming the
        parameters, ``"skip"`` leaves parameters and state untouched. Either costs
        the step one host read (torch.optim.Muon reads none and writes the NaN into
        the parameters).
    """

    momentum: float = 0.95
    nesterov: bool = True
    shape_scale: str = "original"
    polar_method: str = "auto"
    polar_lower: float = MUON_LOWER
    polar_steps: int | None = None
    matmul_dtype: str | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    nonfinite_grads: str = "raise"

    def __post_init__(self):
        if self.shape_scale not in SHAPE_SCALES:
            raise ValueError(f"shape_scale={self.shape_scale!r} is not one of "
                             + ", ".join(repr(s) for s in SHAPE_SCALES))
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        check_one_of(self.nonfinite_grads, "nonfinite_grads", NONFINITE_POLICIES)
        if self.polar_method not in polar_method_names():
            get_polar_method(self.polar_method)  # a ValueError naming the choices

    @property
    def steps(self) -> int | None:
        """The polynomial steps each polar factor runs (``polar_steps`` resolved)."""
        if self.polar_steps is not None:
            return self.polar_steps
        # "auto" runs Polar Express's steps (on either side of the matrix).
        method = "polar_express" if self.polar_method == "auto" else self.polar_method
        return get_polar_method(method).muon_steps


#: Other Muons' option names (torch.optim.Muon, optax.contrib.muon, MuonWithAuxAdam)
#: and what to pass here instead.
RENAMED_OPTIONS = {
    "ns_steps": "use polar_steps, with polar_method='quintic' for the quintic's steps",
    **dict.fromkeys(("ns_coefficients", "ns_coeffs"),
                    "polar_method='quintic' is Muon's fixed (3.4445, -4.7750, 2.0315); "
                    "other coefficient sets are not supported"),
    "adjust_lr_fn": "use shape_scale: 'original' or 'match_rms_adamw'",
    "beta": "use momentum",
    **dict.fromkeys(("adamw_betas", "adam_b1", "adam_b2"), "use betas=(b1, b2)"),
    **dict.fromkeys(("adamw_eps", "adam_eps"), "use eps"),
}


def check_muon_keywords(names, where: str = "Muon") -> None:
    """Raise a TypeError naming each of ``names`` that is not a :class:`MuonConfig`
    field, with the fix (another Muon's name for an option: :data:`RENAMED_OPTIONS`).

    Examples
    --------
    >>> from matroot.optim.muon.core import check_muon_keywords
    >>> check_muon_keywords(["momentum", "polar_steps"])
    >>> check_muon_keywords(["adjust_lr_fn"])
    Traceback (most recent call last):
    ...
    TypeError: Muon has no option 'adjust_lr_fn' (use shape_scale: 'original' or 'match_rms_adamw')
    """
    check_keywords(names, where, config=MuonConfig, renamed=RENAMED_OPTIONS)


class MuonState(NamedTuple):
    """Per parameter: the momentum (Muon) or first moment (AdamW), the AdamW second
    moment (None for Muon parameters), and the steps taken so far."""

    momentum: list
    exp_avg_sq: list
    steps: list


def matrix_stack_shape(shape: Sequence[int], split: int = 1) -> tuple[int, int, int]:
    """The ``(count, m, n)`` stack a Muon parameter of ``shape`` is orthogonalized as.

    A 2-D parameter is one matrix, a 3-D one ``(e, m, n)`` a stack of e (MoE experts),
    one with four or more dimensions (a convolution ``(out, in, kh, kw)``) the matrix
    ``(out, in·kh·kw)``: every output channel's filter is one row, as Keller Jordan's
    Muon views it, and the update is orthogonal across output channels. ``split``
    cuts every matrix into that many equal blocks of rows (output features),
    orthogonalized separately: 3 for a fused QKV projection ``(3·d, d)``, ``3·heads``
    for one factor per head, g for a convolution's g output-channel groups.

    Examples
    --------
    >>> from matroot.optim.muon.core import matrix_stack_shape
    >>> matrix_stack_shape((8, 4)), matrix_stack_shape((3, 8, 4)), matrix_stack_shape((16, 2, 3, 3))
    ((1, 8, 4), (3, 8, 4), (1, 16, 18))
    >>> matrix_stack_shape((96, 32), split=3), matrix_stack_shape((96, 32), split=12)
    ((3, 32, 32), (12, 8, 32))
    """
    if len(shape) < 2:
        raise ValueError(f"a Muon parameter needs two or more dimensions, got shape {shape}")
    if len(shape) == 2:
        count, m, n = 1, shape[0], shape[1]
    elif len(shape) == 3:
        count, m, n = shape[0], shape[1], shape[2]
    else:
        count, m, n = 1, shape[0], math.prod(shape[1:])
    if split < 1 or m % split:
        raise ValueError(f"split={split} does not cut the {m} rows of a parameter of shape "
                         f"{tuple(shape)} into equal blocks: pass a divisor of {m} (3 for a "
                         "fused QKV, 3 × heads for one factor per head)")
    return (count * split, m // split, n)


def shape_scale(m: int, n: int, convention: str) -> float:
    """The scale of an m×n polar factor under ``convention`` (module docstring).

    Examples
    --------
    >>> from matroot.optim.muon.core import shape_scale
    >>> shape_scale(512, 128, "original"), round(shape_scale(512, 128, "match_rms_adamw"), 6)
    (2.0, 4.525483)
    """
    if convention == "original":
        return math.sqrt(max(1.0, m / n))
    return 0.2 * math.sqrt(max(m, n))


def muon_init(params: Sequence[Any], use_muon: Sequence[bool]) -> MuonState:
    """Zero moments for ``params`` (any array-API arrays); AdamW ones get a second moment."""
    zeros = [_xp.array_namespace(p).zeros_like(p) for p in params]
    second = [None if muon else _xp.array_namespace(p).zeros_like(p)
              for p, muon in zip(params, use_muon)]
    return MuonState(zeros, second, [0] * len(params))


def orthogonalized(inputs: dict[Any, Any], config: MuonConfig, splits: dict[Any, int],
                   place: Callable[[Any], Any] | None = None) -> dict[Any, Any]:
    """``scale·polar(U)`` for every Muon input (keyed by any id; ``splits`` by the same
    ids, 1 where absent), one polar call per matrix shape and dtype. ``place``, when
    given, is applied to each ``(count, m, n)`` stack before and after its polar call
    (the optax shell's ``stack_sharding``: the stack axis split over devices)."""
    groups: dict[tuple, list[int]] = {}
    shapes = {i: matrix_stack_shape(u.shape, splits.get(i, 1)) for i, u in inputs.items()}
    for i, u in inputs.items():
        groups.setdefault((*shapes[i][1:], u.dtype), []).append(i)
    out = {}
    for (m, n, _), members in groups.items():
        xp = _xp.array_namespace(inputs[members[0]])
        if m * n == 0:      # an empty matrix (a zero-width layer) has an empty factor
            out.update({i: xp.zeros_like(inputs[i]) for i in members})
            continue
        stacks = [xp.reshape(inputs[i], shapes[i]) for i in members]
        stack = stacks[0] if len(stacks) == 1 else xp.concat(stacks, axis=0)
        if place is not None:
            stack = place(stack)
        method = config.polar_method
        if method == "auto":
            method = ("gram_newton_schulz" if max(m, n) >= GRAM_SIDE_ASPECT * min(m, n)
                      else "polar_express")
        factor = polar_info(stack, method=method, lower=config.polar_lower,
                            max_iter=config.steps, matmul_dtype=config.matmul_dtype,
                            check_finite=False).root
        factor = factor * shape_scale(m, n, config.shape_scale)
        if place is not None:
            factor = place(factor)
        start = 0
        for i, piece in zip(members, stacks):
            out[i] = xp.reshape(factor[start:start + piece.shape[0]], inputs[i].shape)
            start += piece.shape[0]
    return out


def muon_directions(grads: Sequence[Any], state: MuonState, use_muon: Sequence[bool],
                    config: MuonConfig, *, momentum: Sequence[float] | None = None,
                    betas: Sequence[tuple[float, float]] | None = None,
                    split: Sequence[int] | None = None,
                    place: Callable[[Any], Any] | None = None) -> tuple[list, MuonState]:
    """The unit-learning-rate directions ``D`` and the new state, for every parameter.

    ``grads[i]`` None leaves parameter i and its state as they are (its
    direction is None). Pure: nothing is modified in place. ``momentum`` (μ of
    the Muon parameters) and ``betas`` (of the AdamW ones), one entry per
    parameter, replace ``config``'s: the torch shell's per-group values, which
    schedulers such as ``OneCycleLR`` change. ``split`` (one entry per parameter,
    1 by default) cuts a Muon parameter's matrices into blocks of rows
    (:func:`matrix_stack_shape`); ``place`` goes to :func:`orthogonalized`.

    Examples
    --------
    >>> import numpy as np
    >>> from matroot.optim.muon.core import MuonConfig, muon_directions, muon_init
    >>> params = [np.ones((4, 3)), np.ones(3)]
    >>> state = muon_init(params, use_muon=[True, False])
    >>> grads = [np.arange(12.0).reshape(4, 3), np.ones(3)]
    >>> d, state = muon_directions(grads, state, [True, False], MuonConfig())
    >>> d[0].shape, np.round(d[1], 6).tolist(), state.steps
    ((4, 3), [1.0, 1.0, 1.0], [1, 1])
    """
    mus = [config.momentum] * len(grads) if momentum is None else list(momentum)
    all_betas = [config.betas] * len(grads) if betas is None else list(betas)
    buffers, second, steps = list(state.momentum), list(state.exp_avg_sq), list(state.steps)
    directions: list = [None] * len(grads)
    live = [i for i, g in enumerate(grads) if g is not None]
    for i in live:
        steps[i] += 1
    muon = [i for i in live if use_muon[i]]
    if muon:
        new, inputs = muon_momentum([grads[i] for i in muon], [buffers[i] for i in muon],
                                    [mus[i] for i in muon], config.nesterov)
        splits = {} if split is None else {i: split[i] for i in muon}
        factors = orthogonalized(dict(zip(muon, inputs)), config, splits, place)
        for i, b in zip(muon, new):
            buffers[i], directions[i] = b, factors[i]
    adamw = [i for i in live if not use_muon[i]]
    if adamw:
        first, squares, steps_taken = adamw_directions(
            [grads[i] for i in adamw], [buffers[i] for i in adamw],
            [second[i] for i in adamw], [steps[i] for i in adamw],
            [all_betas[i] for i in adamw], config.eps)
        for i, m, v, d in zip(adamw, first, squares, steps_taken):
            buffers[i], second[i], directions[i] = m, v, d
    return directions, MuonState(buffers, second, steps)


# Each moment update below is one operation over all parameters of a half
# (_xp.each: torch's foreach kernels), not one per parameter. Elementwise, so a rank
# may run them on its rows of the parameters (matroot.optim.distributed.muon_step).
def muon_momentum(grads: Sequence[Any], buffers: Sequence[Any], mus: Sequence[float],
                  nesterov: bool) -> tuple[list, list]:
    """The new momentum buffers ``B ← μ·B + (1 − μ)·G`` and the polar inputs ``U``
    (``(1 − μ)·G + μ·B`` with Nesterov, else ``B``), one per gradient."""
    new = _xp.each("lerp", list(buffers), list(grads), [1 - m for m in mus])
    inputs = _xp.each("lerp", list(grads), new, list(mus)) if nesterov else new
    return new, inputs


def adamw_directions(grads: Sequence[Any], first: Sequence[Any], second: Sequence[Any],
                     steps: Sequence[int], betas: Sequence[tuple[float, float]],
                     eps: float) -> tuple[list, list, list]:
    """AdamW's new moments and directions ``m̂/(√v̂ + eps)``; ``steps`` counts this one."""
    beta1 = [b[0] for b in betas]
    beta2 = [b[1] for b in betas]
    grads = list(grads)
    new_first = _xp.each("lerp", list(first), grads, [1 - b for b in beta1])
    squares = _xp.each("lerp", list(second), _xp.each("mul", grads, grads),
                       [1 - b for b in beta2])
    first_hat = _xp.each("div", new_first,
                         [1 - _xp.power_of_count(b, t) for b, t in zip(beta1, steps)])
    second_hat = _xp.each("div", squares,
                          [1 - _xp.power_of_count(b, t) for b, t in zip(beta2, steps)])
    denominators = _xp.each("add", _xp.each("sqrt", second_hat), eps)
    return new_first, squares, _xp.each("div", first_hat, denominators)
