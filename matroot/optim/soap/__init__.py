"""Stacked SOAP (Adam in the eigenbasis of Shampoo's factors), functional core.

:func:`init` and :func:`update` (:mod:`.core`) on any array library; the shells are
:class:`matroot.optim.SOAP` (torch) and :func:`matroot.optim.optax.soap`.
"""

from .config import SOAPConfig
from .core import all_finite, soap, update
from .state import SOAPState, copy_state, init, make_plan, state_bytes

__all__ = ["SOAPConfig", "SOAPState", "init", "update", "soap", "make_plan", "copy_state",
           "state_bytes", "all_finite"]
