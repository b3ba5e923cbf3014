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
