"""matroot.optim: stacked-block Shampoo whose inverse roots come from one solver call per size.

The functional core (:func:`init`, :func:`update`, :func:`shampoo`) runs on any
array-API library; :class:`Shampoo` is a ``torch.optim.Optimizer`` around it,
imported only when asked for, so NumPy users need no torch.
"""

from .shampoo_core.blocking import (
    BlockGroup,
    BlockPlan,
    FactorPolicy,
    FactorStackShape,
    matrix_view_shape,
    plan_blocks,
)
from .shampoo_core.core import (
    GradientTransformation,
    NonFiniteGradientError,
    ShampooConfig,
    ShampooState,
    apply_updates,
    copy_state,
    init,
    shampoo,
    state_bytes,
    update,
)
from .shampoo_core.root_options import RootOptions

__all__ = [
    "Shampoo",
    "Muon",
    "SOAP",
    "shampoo",
    "init",
    "update",
    "apply_updates",
    "copy_state",
    "state_bytes",
    "ShampooConfig",
    "RootOptions",
    "ShampooState",
    "GradientTransformation",
    "NonFiniteGradientError",
    "BlockPlan",
    "BlockGroup",
    "FactorPolicy",
    "FactorStackShape",
    "plan_blocks",
    "matrix_view_shape",
]


def __getattr__(name):
    if name == "SOAP":
        from .torch.soap import SOAP
        return SOAP
    if name == "Muon":
        from .torch.muon import Muon
        return Muon
    if name == "Shampoo":
        try:
            from .torch.shampoo import Shampoo
        except ModuleNotFoundError as err:
            if err.name != "torch":
                raise
            raise ImportError(
                "matroot.optim.Shampoo is a torch.optim.Optimizer and needs PyTorch: "
                'pip install "matroot[torch]" (CPU-only wheel: pip install torch '
                "--index-url https://download.pytorch.org/whl/cpu); the functional "
                "core (matroot.optim.init / update) works without it") from err
        return Shampoo
    raise AttributeError(f"module 'matroot.optim' has no attribute {name!r}")
