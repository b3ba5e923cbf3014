"""Spectral bounds of a stack: Krylov runs (:mod:`.krylov`), upper bounds on λmax
(:mod:`.lambda_max_bounds`) and the bounds that scale a stack (:mod:`.scaling`)."""
