"""A readable index of where each parameter's factors sit, saved with every state dict.

A family record of :meth:`matroot.optim.Shampoo.state_dict` keeps its factors
and roots in size stacks (``factors[k]`` is a ``(count, n, n)`` tensor). Its
``"layout"`` entry says, per parameter, which stack and slot hold each block's
factors, so a user can inspect or edit one parameter's preconditioner without
rebuilding the block plan; the same entry rebuilds the plan when loading, so a
checkpoint does not depend on the optimizer's constructor arguments. Only
plain Python values and tensors: ``torch.load(..., weights_only=True)`` reads it.

A layout entry of one parameter::

    {"param": 3, "shape": [300, 200], "dtype": "float32", "sides": [True, True],
     "blocks": [{"rows": [0, 128], "cols": [0, 128], "left": [4, 0], "right": [4, 7]},
                ...]}

``dtype`` is that of the factors (None for a parameter without any);
``left``/``right`` are ``[stack, slot]`` (None for a side without a factor):
``factors[stack][slot]`` is that block's ``L`` (or ``R``), ``roots[stack][slot]``
its inverse root.
"""

from __future__ import annotations

import math

from .blocking import BlockPlan, FactorPolicy, plan_blocks

__all__ = ["FORMAT", "plan_layout", "plan_from_layout"]

#: Version of the family record; records without ``"format"`` are the first one
#: (no layout), which :meth:`matroot.optim.Shampoo.load_state_dict` still reads.
FORMAT = 2


def plan_layout(plan: BlockPlan, param_numbers) -> list:
    """Per parameter of ``plan``: its shape, dtype, factored sides and block slots.

    Parameters
    ----------
    plan : BlockPlan
    param_numbers : sequence of int
        The state-dict number of each of ``plan.params``.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> plan = plan_blocks([(6, 4)], ["float32"], block_size=4)
    >>> [(b["rows"], b["left"], b["right"]) for b in plan_layout(plan, [0])[0]["blocks"]]
    [([0, 4], [1, 1], [1, 2]), ([4, 6], [0, 0], [1, 0])]
    """
    dtypes: dict[int, str] = {}
    blocks: dict[int, list[dict]] = {i: [] for i in range(len(plan.params))}
    for group in plan.groups:
        for j, block in enumerate(group.blocks):
            dtypes[block.param] = group.dtype
            blocks[block.param].append({
                "rows": list(block.rows),
                "cols": None if block.cols is None else list(block.cols),
                "left": None if group.left is None else [group.left[0], group.left[1] + j],
                "right": None if group.right is None else [group.right[0],
                                                           group.right[1] + j]})
    return [{"param": int(number), "shape": list(layout.shape),
             "dtype": dtypes.get(i), "sides": list(layout.sides),
             "blocks": sorted(blocks[i], key=lambda b: (b["rows"], b["cols"] or []))}
            for i, (number, layout) in enumerate(zip(param_numbers, plan.params))]


def plan_from_layout(layout, *, block_size, stacked: bool) -> BlockPlan:
    """The block plan a saved layout describes (the inverse of :func:`plan_layout`).

    Examples
    --------
    >>> plan = plan_blocks([(6, 4), (5,)], ["float32"] * 2, block_size=4,
    ...                    policy=FactorPolicy(skip_dims=(1,)))
    >>> plan_from_layout(plan_layout(plan, [0, 1]), block_size=4, stacked=True) == plan
    True
    """
    # The saved sides are the plan's: no ratio rule may drop one of them again.
    policies = [FactorPolicy(precondition=any(entry["sides"]), precondition_1d=True,
                             max_factor_ratio=math.inf,
                             skip_dims=tuple(d for d, side in enumerate(entry["sides"])
                                             if not side))
                for entry in layout]
    return plan_blocks([tuple(entry["shape"]) for entry in layout],
                       [entry["dtype"] or "float32" for entry in layout],
                       block_size=block_size,
                       policy=policies, stacked=stacked)
