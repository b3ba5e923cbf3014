"""Measuring matroot: what the ``matroot demo`` and ``matroot bench`` verbs run.

Thread policy, timing, the solver, optimizer and polar
benchmarks with their reports and plots, and the demo built from them. The backend
registry, the stacks and the float64 oracle are matroot.testing's; one-off experiments
(overheads, the DASH reference) are scripts in the repository's ``bench/`` folder.
docs/architecture.rst says what each module holds.
"""
