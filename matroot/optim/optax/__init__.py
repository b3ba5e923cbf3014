"""The optax shells: ``shampoo`` (:mod:`.shampoo_transform`), ``muon``
(:mod:`.muon_transform`) and ``soap`` (:mod:`.soap_transform`), as
``optax.GradientTransformation`` factories.

``from matroot.optim.optax import shampoo, muon`` gives the factories. The modules are
not named ``shampoo.py`` and ``muon.py``: a submodule would shadow, or be shadowed
by, the function of its name.
"""

from .muon_transform import MuonOptaxState, muon, scale_by_muon
from .shampoo_transform import ShampooOptaxState, scale_by_shampoo, shampoo
from .soap_transform import SOAPOptaxState, scale_by_soap, soap

__all__ = ["shampoo", "scale_by_shampoo", "ShampooOptaxState", "muon", "scale_by_muon",
           "MuonOptaxState", "soap", "scale_by_soap", "SOAPOptaxState"]
