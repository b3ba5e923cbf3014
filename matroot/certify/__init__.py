"""What ``converged`` promises and how a returned root is checked: the accuracy tables
(:mod:`.accuracy`, :mod:`.polar_accuracy`), Gaussian-probe bounds (:mod:`.probes`) and
the a-posteriori check (:mod:`.verify`)."""
