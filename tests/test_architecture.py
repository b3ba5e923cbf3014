"""The layering of docs/architecture.rst, checked on the source: no import cycles, and
the tools (cli, bench) reach the library only through its public or shared API."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "matroot"
TOOLS = ("matroot.cli", "matroot.bench")
#: What the tools may import from the library besides its public packages.
SHARED_INTERNALS = {"matroot.solvers.registry"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the matroot modules it imports (anywhere in its body)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 \
                        else package
                    base = f"{anchor}.{base}" if base else anchor
                found.add(base)
                found |= {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_cycles_between_modules():
    graph = import_graph()
    # A package's __init__ importing its own children is not a cycle of logic.
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    state = {}

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(edges[module]):
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [module, dep]))
            if dep not in state:
                visit(dep, path + [module])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [])


def test_tools_use_public_or_shared_api_only():
    for module, deps in import_graph().items():
        if not module.startswith(TOOLS):
            continue
        private = {d for d in deps if not d.startswith(TOOLS) and d not in SHARED_INTERNALS
                   and any(part.startswith("_") for part in d.split("."))}
        assert not private, f"{module} imports private {sorted(private)}"
        solvers = {d for d in deps if d.startswith("matroot.solvers.")} - SHARED_INTERNALS
        assert not solvers, f"{module} reaches into solver modules {sorted(solvers)}"


def test_library_never_imports_the_tools():
    for module, deps in import_graph().items():
        if not module.startswith(TOOLS) and module != "matroot.__main__":
            assert not {d for d in deps if d.startswith(TOOLS)}, module


#: The lower layers of docs/architecture.rst, bottom first: a module of one layer
#: never imports (at the top or lazily inside a function) a module of a layer above.
LOWER_LAYERS = (
    ("matroot._xp", "matroot._typing"),
    ("matroot._checks",),
    ("matroot.accuracy",),
    ("matroot.krylov", "matroot.lambda_max_bounds", "matroot.scaling"),
    ("matroot.solvers",),
)
#: What the lower layers may never reach, whatever their own order.
UPPER = ("matroot.verify", "matroot.roots", "matroot.call", "matroot.stack_solve",
         "matroot.result", "matroot.optim", "matroot.testing",
         "matroot.polar", "matroot.cli", "matroot.bench")


def _layer_of(module: str) -> int | None:
    for index, layer in enumerate(LOWER_LAYERS):
        if any(module == name or module.startswith(name + ".") for name in layer):
            return index
    return None


def test_lower_layers_import_only_downwards():
    """Package edges included (matroot.solvers.* as one layer) and lazy imports too:
    the import graph walks whole module bodies."""
    for module, deps in import_graph().items():
        layer = _layer_of(module)
        if layer is None:
            continue
        for dep in deps:
            assert not dep.startswith(UPPER), f"{module} imports {dep} (a higher layer)"
            dep_layer = _layer_of(dep)
            assert dep_layer is None or dep_layer <= layer, \
                f"{module} (layer {layer}) imports {dep} (layer {dep_layer})"


def test_testing_is_never_imported_by_the_library():
    for module, deps in import_graph().items():
        if module.startswith(("matroot.testing", "matroot.cli", "matroot.bench")):
            continue
        assert not {d for d in deps if d.startswith("matroot.testing")}, module


#: The modules of the matroot._xp package, bottom first: each imports only modules
#: listed before it (and never the package itself, whose __init__ re-exports them).
XP_MODULES = ("namespace", "transfer", "precision", "tracing", "linalg", "matmul")


def test_xp_modules_import_only_earlier_ones():
    graph = import_graph()
    assert {m for m in graph if m.startswith("matroot._xp.")} == {
        f"matroot._xp.{name}" for name in XP_MODULES}
    for index, name in enumerate(XP_MODULES):
        allowed = {f"matroot._xp.{earlier}" for earlier in XP_MODULES[:index]}
        extra = graph[f"matroot._xp.{name}"] - allowed
        assert not extra, f"matroot._xp.{name} imports {sorted(extra)}"


def test_the_library_reaches_xp_through_the_package_only():
    """Every helper is re-exported by matroot._xp, so one can move between its
    modules without touching an importer."""
    import importlib

    import matroot._xp as xp_package

    for name in XP_MODULES:
        module = importlib.import_module(f"matroot._xp.{name}")
        missing = set(module.__all__) - set(xp_package.__all__)
        assert not missing, f"matroot._xp does not re-export {sorted(missing)} of {name}"
        assert len((PACKAGE / "_xp" / f"{name}.py").read_text().splitlines()) < 300, name
    for module, deps in import_graph().items():
        if not module.startswith("matroot._xp"):
            inner = {d for d in deps if d.startswith("matroot._xp.")}
            assert not inner, f"{module} imports {sorted(inner)}: import matroot._xp"
