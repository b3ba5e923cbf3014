"""Measuring matroot: the tools' backend registry and thread policy, test problems and the
float64 oracle, timing, the solver and optimizer benchmarks, and the demo built from them.

Run through the command line (``matroot demo``, ``matroot bench ...``);
docs/architecture.rst says what each module holds.
"""
