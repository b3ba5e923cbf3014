"""The scaling experiment: iterations against κ for power-iteration vs Frobenius scaling."""

from __future__ import annotations

from matroot.cli.contenders import contender, summarise
from matroot.cli.timing import timed_call

from .config import methods_for
from .prepared import load_problem

__all__ = ["scaling_iterations", "scaling_methods"]


def scaling_methods(config, p):
    """The iterative methods, whose step count the λmax scaling decides."""
    return [m for m in methods_for(config, p) if m not in ("evd", "chebyshev")]


def scaling_iterations(config, backend, problems, progress):
    rows = []
    for entry in problems:
        host, exact = load_problem(entry, config.ps)
        a = backend.asarray(host)
        here = []
        for p in config.ps:
            for method in scaling_methods(config, p):
                for scaling in ("power", "frobenius"):
                    seconds, result = timed_call(
                        contender(a, method, p, scaling=scaling), backend.synchronize)
                    here.append(dict(
                        backend=backend.name, n=entry["n"], batch=entry["batch"], p=p,
                        kappa=entry["kappa"], spectrum=entry["spectrum"], seed=entry["seed"],
                        method=method, scaling=scaling,
                        frobenius_over_lambda_max=entry["frobenius_over_lambda_max"],
                        time_s=seconds, **summarise(backend, result, exact[p])))
        rows += here
        progress.step(f"scaling {backend.name} {entry['spectrum']} κ={entry['kappa']:g} "
                      f"(‖A‖_F/λmax {entry['frobenius_over_lambda_max']:.1f}): iterations "
                      + ", ".join(f"{r['method']}/p{r['p']}/{r['scaling'][:4]} "
                                  f"{r['iterations']}" for r in here))
    return rows

