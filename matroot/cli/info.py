"""``matroot info``: backends, devices, versions, and what works where.

Support is not read from a table: every (backend, device, method, precision)
combination is tried on a small well-conditioned stack and checked against a
float64 oracle, so the answer is what this installation actually does. By default
the probe covers NumPy and every accelerator device found (a few seconds; about one
where the machine has no GPU or TPU device file, as torch and JAX are then not even
imported: :func:`matroot.testing.backends.accelerator_possible`); ``--all``
adds the CPU devices of torch, JAX and array_api_strict, where JAX compiles each
combination anew (about a minute on a CPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import textwrap

import array_api_compat
import numpy as np

import matroot
from matroot.solvers.registry import get_solver
from matroot.testing.backends import Target, discover

from .common import add_target_options, add_thread_option, at_least, targets_from, writable_file
from .contenders import all_methods, method_supports
from .progress import Progress
from .threads import describe_threads, thread_policy

DESCRIPTION = ("List the backends and devices found, their versions, and try every method "
               "in every precision on each to show what is supported.")

#: (label, input dtype, matmul_dtype, worst relative error accepted).
PRECISIONS = (
    ("float64", "float64", None, 1e-8),
    ("float32", "float32", None, 1e-4),
    ("float16 matmuls", "float32", "float16", 3e-2),
    ("bfloat16 matmuls", "float32", "bfloat16", 1e-1),
)
#: Root orders listed in the p-support table.
P_VALUES = (0.5, 1, 2, 3, 4, 8)
_PROBE_P = 4
_PROBE_KAPPA = 100.0
#: A ridge, as the solvers see in practice (some use it as their lower bound).
_PROBE_EPS = 1e-3


def _probe_stack(n: int = 16, batch: int = 3):
    """A float64 SPD stack with κ(A + eps I) = 100 and its exact inverse 4th root."""
    rng = np.random.default_rng(7)
    q, _ = np.linalg.qr(rng.standard_normal((batch, n, n)))
    lam = np.geomspace(1.0, 1.0 / _PROBE_KAPPA, n)  # of A + eps I
    a = (q * (lam - _PROBE_EPS)[None, None, :]) @ np.swapaxes(q, -1, -2)
    oracle = (q * lam[None, None, :] ** (-1.0 / _PROBE_P)) @ np.swapaxes(q, -1, -2)
    return (a + np.swapaxes(a, -1, -2)) / 2, oracle


def _op_by_op(target: Target):
    """On JAX, the op-by-op path: an eager call would compile each of the probe's
    twenty tiny combinations into its own program (about a second each on a CPU);
    op by op they share their operations' compilations, with the same steps and roots
    (tests/backends/test_jax.py holds the two paths equal)."""
    if target.backend != "jax":
        return contextlib.nullcontext()
    import jax

    return jax.disable_jit()


def probe(target: Target, method: str, precision) -> dict:
    """Try one combination; return its status and a detail line."""
    label, dtype, matmul_dtype, accept = precision
    a64, oracle = _probe_stack()
    entry = {"backend": target.backend, "device": target.device, "method": method,
             "precision": label}
    try:
        a = target.asarray(a64.astype(dtype))
        with _op_by_op(target):
            result = matroot.inv_root_info(a, _PROBE_P, method=method, eps=_PROBE_EPS,
                                           matmul_dtype=matmul_dtype)
    except (ValueError, TypeError) as err:
        return {**entry, "status": "unsupported", "detail": str(err)}
    except Exception as err:  # a solver bug: say so rather than stop the listing
        return {**entry, "status": "error",
                "detail": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    root = target.to_host(result.root).astype(np.float64)
    errors = np.linalg.norm(root - oracle, axis=(-2, -1)) / np.linalg.norm(
        oracle, axis=(-2, -1))
    worst = float(np.max(errors))
    detail = f"worst relative error {worst:.1e}"
    if matmul_dtype is not None and not np.any(target.to_host(result.matmuls)):
        return {**entry, "status": "no effect",
                "detail": f"{method} forms no matmuls, so matmul_dtype is ignored; {detail}"}
    if not bool(np.all(target.to_host(result.converged))):
        return {**entry, "status": "not converged", "detail": detail}
    if not worst <= accept:
        return {**entry, "status": "inaccurate", "detail": f"{detail} > {accept:g}"}
    return {**entry, "status": "yes", "detail": detail}


def default_targets(infos) -> list[Target]:
    """What ``matroot info`` probes without ``--all``: NumPy, and every device that is
    not a CPU (the answer a GPU user runs it for); the other CPU backends repeat NumPy's
    answer at the cost of their compilations."""
    return [Target(i.name, d) for i in infos if i.available for d in i.devices
            if i.name == "numpy" or d != "cpu"]


def collect(targets=None, methods=None, progress=None, infos=None) -> dict:
    """Everything ``info`` prints, as a JSON-able dict.

    ``targets`` limits the support probe (default: every device of every
    available backend); the backend list always covers all known backends.
    """
    methods = all_methods() if methods is None else list(methods)
    infos = discover() if infos is None else infos
    if targets is None:
        targets = [Target(i.name, d) for i in infos if i.available for d in i.devices]
    support = []
    for target in targets:
        support += [probe(target, method, precision) for method in methods
                    for precision in PRECISIONS]
        if progress is not None:
            progress.step(f"{target.label}: {len(methods)} methods probed")
    return {
        "matroot": matroot.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "array_api_compat": array_api_compat.__version__,
        "backends": [
            {"name": i.name, "version": i.version, "devices": list(i.devices),
             "device_names": i.device_names, "missing": i.missing} for i in infos],
        "p_support": {m: [p for p in P_VALUES if method_supports(m, _as_p(p))]
                      for m in methods},
        "summaries": {m: get_solver(m).summary for m in methods},
        "probe": f"a stack of 3 SPD 16x16 matrices, eps = {_PROBE_EPS:g}, condition "
                 f"number {_PROBE_KAPPA:g}, p = {_PROBE_P}; 'yes' means it ran, "
                 "converged and met the "
                 "precision's error bound against a float64 oracle",
        "precisions": [{"label": p[0], "dtype": p[1], "matmul_dtype": p[2],
                        "max_rel_err": p[3]} for p in PRECISIONS],
        "support": support,
    }


def _as_p(p):
    return int(p) if float(p).is_integer() else p


def format_info(data: dict) -> str:
    lines = [
        f"matroot {data['matroot']}  (python {data['python']}, array-api-compat "
        f"{data['array_api_compat']}, {data['cpu_count']} CPU cores)",
        f"platform: {data['platform']}",
        *([describe_threads(data["threads"])] if "threads" in data else []),
        "",
        "backends:",
    ]
    width = max(len(b["name"]) for b in data["backends"])
    for b in data["backends"]:
        version = b["version"] or "-"
        if b["missing"]:
            lines.append(f"  {b['name']:<{width}}  {version:<12}  not available: {b['missing']}")
            continue
        devices = ", ".join(
            f"{d} ({b['device_names'][d]})" if d in b["device_names"] else d
            for d in b["devices"])
        lines.append(f"  {b['name']:<{width}}  {version:<12}  devices: {devices}")

    mwidth = max(len(m) for m in data["p_support"])
    lines += ["", "methods:"]
    lines += [f"  {m.ljust(mwidth)}  {summary}" for m, summary in data["summaries"].items()]
    lines += ["", "root orders p each method accepts:"]
    lines.append("  " + "method".ljust(mwidth) + "  "
                 + "  ".join(f"p={p:g}".rjust(5) for p in P_VALUES))
    for method, accepted in data["p_support"].items():
        cells = ["yes" if p in accepted else "-" for p in P_VALUES]
        lines.append("  " + method.ljust(mwidth) + "  "
                     + "  ".join(c.rjust(5) for c in cells))

    lines += ["", "support:"]
    lines += textwrap.wrap(f"tried here on {data['probe']}.", width=88,
                           initial_indent="  ", subsequent_indent="  ")
    labels = [p["label"] for p in data["precisions"]]
    targets = list(dict.fromkeys((s["backend"], s["device"]) for s in data["support"]))
    notes: list[str] = []
    twidth = max([len(Target(*t).label) for t in targets] + [len("backend")])
    cwidth = max(len(x) for x in labels + ["not converged [99]"])
    lines.append("  " + "backend".ljust(twidth) + "  " + "method".ljust(mwidth) + "  "
                 + "  ".join(label.ljust(cwidth) for label in labels))
    cells_of = {(s["backend"], s["device"], s["method"], s["precision"]): s
                for s in data["support"]}
    for target in targets:
        for method in data["p_support"]:
            cells = []
            for label in labels:
                entry = cells_of[(target[0], target[1], method, label)]
                cell = entry["status"]
                if cell != "yes":
                    if entry["detail"] not in notes:
                        notes.append(entry["detail"])
                    cell += f" [{notes.index(entry['detail']) + 1}]"
                cells.append(cell.ljust(cwidth))
            lines.append("  " + Target(*target).label.ljust(twidth) + "  "
                         + method.ljust(mwidth) + "  " + "  ".join(cells))
    if notes:
        lines.append("")
        lines += [f"  [{i + 1}] {note}" for i, note in enumerate(notes)]
    return "\n".join(lines)


def configure(parser) -> None:
    add_target_options(parser, "probe every installed backend")
    add_thread_option(parser)
    parser.add_argument("--all", action="store_true",
                        help="probe every device of every installed backend (JAX compiles "
                             "each combination: about a minute on a CPU); default: NumPy "
                             "and the accelerator devices")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON to PATH")
    parser.set_defaults(run=run, prog=parser.prog)


def run(args) -> int:
    at_least(args.threads, 0, "--threads")
    if args.save:
        writable_file(args.save, "--save")
    infos = discover(import_all=bool(args.all or args.backend or args.device))
    if args.backend or args.device:
        targets = targets_from(args)
    elif args.all:
        targets = [Target(i.name, d) for i in infos if i.available for d in i.devices]
    else:
        targets = default_targets(infos)
    progress = Progress(len(targets))
    with thread_policy(args.threads) as threads:
        data = collect(targets=targets, progress=progress, infos=infos)
    progress.close()
    data["threads"] = threads
    print(json.dumps(data, indent=2) if args.json else format_info(data))
    if not (args.json or args.all or args.backend or args.device):
        print("\n  (the CPU devices of torch, JAX and array_api_strict are probed with --all)")
    if args.save:
        with open(args.save, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
    return 0
