"""The layering of docs/architecture.rst, checked on the source: every module has a
layer and imports only its own layer or those below (lazy imports included), no import
cycles, the tools (cli, bench) reach the library only through its public or shared
API, and every module or file the page names exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "matroot"
ROOT = PACKAGE.parent
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.rst"
TOOLS = ("matroot.cli", "matroot.bench")
#: What the tools may import from the library besides its public packages.
SHARED_INTERNALS = {"matroot.solvers.registry"}

#: The layers of docs/architecture.rst, bottom first. A name stands for the module
#: and, except the bare ``matroot`` (the public facade, its ``__init__``), every
#: module below it. matroot.testing sits above the whole library, so no library
#: module imports it; the tools sit above everything, so nothing imports them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("matroot._xp", "matroot._typing"),
    ("matroot._checks",),
    ("matroot.accuracy",),
    ("matroot.krylov", "matroot.lambda_max_bounds", "matroot.scaling"),
    ("matroot.solvers",),
    ("matroot.probes", "matroot.result", "matroot.root_gradient"),
    ("matroot.verify",),
    ("matroot.call",),
    ("matroot.stack_solve",),
    ("matroot.roots",),
    ("matroot.polar_factor", "matroot.polar_accuracy", "matroot.polar_coefficients",
     "matroot.polar_solvers", "matroot.polar_gradient", "matroot.eigenbasis"),
    ("matroot",),
    ("matroot.optim",),
    ("matroot.testing",),
    ("matroot.bench",),
    ("matroot.cli", "matroot.__main__"),
)

#: The modules of the matroot._xp package, bottom first: each imports only modules
#: listed before it (and never the package itself, whose __init__ re-exports them).
XP_MODULES = ("namespace", "transfer", "precision", "tracing", "linalg", "matmul",
              "torch_autodiff", "autodiff")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the matroot modules it imports (anywhere in its body).

    ``from package import name`` is an edge to ``package`` only where some name is
    not one of its submodules: ``from matroot import _xp`` reaches ``matroot._xp``,
    not the facade ``matroot`` and everything it imports.
    """
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
                named = {f"{base}.{alias.name}" for alias in node.names}
                found |= named
                if not named <= modules.keys():
                    found.add(base)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of the layer ``module`` belongs to (the deepest match)."""
    found = None
    for index, layer in enumerate(LAYERS):
        for name in layer:
            if module == name or (name != "matroot" and module.startswith(name + ".")):
                found = index
    return found


def test_every_module_has_a_layer():
    missing = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not missing, f"add these modules to LAYERS and docs/architecture.rst: {missing}"


def test_modules_import_only_their_layer_or_below():
    """Package edges included (a package is the layer of all its modules) and lazy
    imports too: the import graph walks whole module bodies."""
    for module, deps in import_graph().items():
        for dep in deps:
            assert layer_of(dep) <= layer_of(module), \
                f"{module} (layer {layer_of(module)}) imports {dep} (layer {layer_of(dep)})"


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


def _names_something(dotted: str) -> bool:
    """Whether ``dotted`` is a matroot module, or a name a matroot module defines or
    imports (``matroot.testing.scaled_spd_stack``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = PACKAGE.parent.joinpath(*parts[:cut])
        source = next((p for p in (base.with_suffix(".py"), base / "__init__.py")
                       if p.is_file()), None)
        if source is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and re.search(
                rf"\b{re.escape(rest[0])}\b", source.read_text(encoding="utf-8")) is not None)
    return False


def _files_named_under_folders(page: str) -> dict[str, set[str]]:
    """For each definition-list term that is a folder (``matroot/optim/``), the
    ``name.py`` files its indented description names."""
    named: dict[str, set[str]] = {}
    folder = None
    for line in page.splitlines():
        term = re.fullmatch(r"``([\w/]+/)``", line)
        if term:
            folder = term.group(1)
            named[folder] = set()
        elif folder and line.startswith("   "):
            named[folder] |= set(re.findall(r"``(\w+\.py)``", line))
        else:
            folder = None
    return named


def test_architecture_page_names_only_what_exists():
    page = ARCHITECTURE_PAGE.read_text(encoding="utf-8")
    dotted = set(re.findall(r"\bmatroot(?:\.\w+)+", page))
    paths = set(re.findall(r"\b(?:matroot|bench|tests|docs|examples)/[\w./-]*", page))
    in_folders = _files_named_under_folders(page)
    # The patterns do find the code the page names (the test could not fail otherwise).
    assert len(dotted) > 20 and len(paths) > 30 and sum(map(len, in_folders.values())) > 60
    assert not sorted(d for d in dotted if not _names_something(d))
    assert not sorted(p for p in paths if not (ROOT / p).exists())
    assert not sorted(f"{folder}{name}" for folder, names in in_folders.items()
                      for name in names if not (ROOT / folder / name).is_file())
    layered = {name for layer in LAYERS for name in layer} - {"matroot"}
    assert not sorted(layered - dotted), "the page's layer diagram misses these"
    for folder, names in in_folders.items():
        modules = {p.name for p in (ROOT / folder).glob("*.py")} - {"__init__.py"}
        assert not sorted(modules - names), f"modules of {folder} the page omits"
