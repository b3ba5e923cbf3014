"""Counting what a call launches: issue 35's definition, through torch's dispatcher.

Every ATen operation torch dispatches is counted except views (which launch no kernel),
and among them the host syncs, the operations that read a tensor's value on the host.
On a GPU each counted operation is about one kernel launch; on a CPU the count is the
same and deterministic, so a test or a benchmark can hold a budget on it (the tests in
``tests/launches/test_launch_budgets.py``, ``python -m bench launches``). Needs torch.

Examples
--------
>>> import torch, matroot
>>> from matroot.testing.launch_count import LaunchCount
>>> with LaunchCount() as count:
...     _ = torch.eye(3) @ torch.ones(3, 3)
>>> count.syncs, count.ops >= 2
(0, True)
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HOST_SYNCS", "VIEWS", "LaunchCount"]

#: Operations that read a value on the host (they wait for the device).
HOST_SYNCS = frozenset({"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item",
                        "masked_select", "unique", "_unique2"})
#: Operations that only make a view: no kernel, not counted.
VIEWS = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
    "select", "slice", "as_strided", "alias", "detach", "lift_fresh", "diagonal",
    "_reshape_alias", "reshape", "unbind", "split", "split_with_sizes", "mT", "_conj",
    "conj", "resolve_conj", "resolve_neg", "numpy_T", "view_as_real"})


class LaunchCount(TorchDispatchMode):
    """Within ``with LaunchCount() as c:``, ``c.ops`` counts the non-view operations
    (host syncs included), ``c.syncs`` the host syncs, ``c.names`` each by name."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs = 0
        self.names: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in HOST_SYNCS:
            self.syncs += 1
        if name not in VIEWS:
            self.ops += 1
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def top(self, k: int = 10) -> list[tuple[str, int]]:
        """The ``k`` most frequent operations, most frequent first."""
        return sorted(self.names.items(), key=lambda item: -item[1])[:k]
