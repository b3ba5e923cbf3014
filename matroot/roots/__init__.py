"""The inverse p-th root: its entry points (:mod:`.api`), the call resolved once
(:mod:`.call`), one stack solved (:mod:`.stack_solve`), the result (:mod:`.result`)
and the exact derivative of a root (:mod:`.gradient`)."""
