"""matroot's benchmarks and experiments, run from a checkout: ``python -m bench --help``.

Not part of the installed package (``pip install .`` ships ``matroot`` only). The
verbs (``solvers``, ``optim``, ``polar``, ``launches``, ``plots``, ``report``) are
:mod:`bench.cli`'s; the one-off experiments (``muon_char``, ``soap_char``, the DASH
reference, overheads, ...) are scripts in this folder that ``python -m bench NAME``
runs. What they share with ``matroot demo`` (thread policy, timing, the eigh
contenders, progress) is installed, in :mod:`matroot.cli`; the backend registry, the
stacks and the float64 oracle are :mod:`matroot.testing`'s. docs/benchmarks.rst
lists every benchmark and its committed results.
"""
