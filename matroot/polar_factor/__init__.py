"""The polar factor: its entry points (:mod:`.api`) and its derivative
(:mod:`.gradient`); its methods are in :mod:`matroot.solvers.polar`."""
