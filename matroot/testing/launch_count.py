"""Operations and host syncs counted through torch's dispatcher (issue 35's definition).

Every ATen operation torch dispatches counts, except views (which launch no kernel);
among them the host syncs, the operations that read a tensor's value on the host.
On a GPU each counted operation is about one kernel launch; on a CPU the count is
the same and deterministic, so a test can assert it.

Examples
--------
>>> import torch
>>> from matroot.testing.launch_count import Count
>>> x = torch.ones(3)
>>> with Count() as c:
...     y = (x + 1).sum()
...     flag = bool(y > 0)
>>> c.ops, c.syncs
(4, 1)
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNCS", "VIEWS", "Count"]

#: Operations that read a tensor's value on the host.
SYNCS = frozenset({"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item",
                   "masked_select", "unique", "_unique2"})
#: Operations that make a view and launch nothing.
VIEWS = frozenset({"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze",
                   "squeeze", "select", "slice", "as_strided", "alias", "detach", "lift_fresh",
                   "diagonal", "_reshape_alias", "reshape", "unbind", "split",
                   "split_with_sizes", "mT", "_conj", "conj", "resolve_conj", "resolve_neg",
                   "numpy_T", "view_as_real"})


class Count(TorchDispatchMode):
    """Counts non-view operations (``ops``, syncs included) and host syncs (``syncs``)
    dispatched inside it; ``names`` per operation."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.names: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in SYNCS:
            self.syncs += 1
        if name not in VIEWS:
            self.ops += 1
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def top(self, k: int = 10) -> list:
        """The ``k`` most frequent operations, most frequent first."""
        return sorted(self.names.items(), key=lambda kv: -kv[1])[:k]
