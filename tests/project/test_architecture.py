"""The layering of docs/architecture.rst, checked on the source: every module has a
layer and imports only its own layer or those below (lazy imports included), no import
cycles, the tools (cli) reach the library only through its public or shared
API, and every module or file the page names exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "matroot"
ROOT = PACKAGE.parent
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.rst"
TOOLS = ("matroot.cli",)
#: What the tools may import from the library besides its public packages.
SHARED_INTERNALS = {"matroot.solvers.registry", "matroot.solvers.polar.coefficients"}

#: The layers of docs/architecture.rst, bottom first: one folder each (the root's
#: ``_xp``/``_typing`` and the tools' ``cli``/``__main__`` pair up). A name stands for
#: the module and, except the bare ``matroot`` (the public facade, its ``__init__``),
#: every module below it; a module belongs to the longest name that covers it, so
#: ``matroot.optim`` is the optim facade above its subfolders. matroot.testing sits
#: above the whole library, so no library module imports it; the tools sit above
#: everything, so nothing imports them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("matroot._xp", "matroot._typing"),
    ("matroot._checks",),
    ("matroot.spectrum",),
    ("matroot.certify",),
    ("matroot.solvers",),
    ("matroot.solvers.polar",),
    ("matroot.roots",),
    ("matroot.polar_factor", "matroot.eigenbasis"),
    ("matroot",),
    ("matroot.optim.shampoo_core",),
    ("matroot.optim.muon", "matroot.optim.soap"),
    ("matroot.optim.distributed",),
    ("matroot.optim.torch",),
    ("matroot.optim.optax",),
    ("matroot.optim",),
    ("matroot.testing",),
    ("matroot.cli", "matroot.__main__"),
)

#: The modules of the matroot._xp package, bottom first: each imports only modules
#: listed before it (and never the package itself, whose __init__ re-exports them).
XP_MODULES = ("namespace", "transfer", "precision", "tracing", "linalg", "matmul",
              "launches", "torch_autodiff", "autodiff", "foreach")


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
    """Index in :data:`LAYERS` of the layer ``module`` belongs to (the longest name
    that covers it)."""
    found, length = None, -1
    for index, layer in enumerate(LAYERS):
        for name in layer:
            covers = module == name or (name != "matroot" and module.startswith(name + "."))
            if covers and len(name) > length:
                found, length = index, len(name)
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


def folder_of(module: str) -> str:
    """The folder a module lives in: its package (a package's ``__init__``, the package
    itself); a module at the package root stands for itself, as a folder of one."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    if path.is_dir() or module.count(".") == 1:
        return module
    return module.rsplit(".", 1)[0]


def folder_graph() -> dict[str, set[str]]:
    """folder -> the folders its modules import (lazy imports included)."""
    folders: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        found = folders.setdefault(folder_of(module), set())
        found |= {folder_of(dep) for dep in deps} - {folder_of(module)}
    return folders


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the list of its nodes (the first repeated), or None."""
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                return path + [node, dep]
            if dep not in state and (cycle := visit(dep, path + [node])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_no_import_cycles_between_folders():
    """No folder imports a folder that imports it back, directly or through others."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    graph = folder_graph()
    assert {"matroot.spectrum", "matroot.certify", "matroot.optim.shampoo_core"} <= graph.keys()
    assert "matroot.certify" in graph["matroot.solvers"]  # the graph does hold edges
    cycle = find_cycle(graph)
    assert cycle is None, "folder import cycle: " + " -> ".join(cycle or [])


def test_each_layer_is_one_folder():
    """Every folder of the package is one entry of LAYERS (or within one)."""
    for folder in folder_graph():
        if folder.count(".") == 1 and not (PACKAGE / folder.split(".")[1]).is_dir():
            continue  # a module at the root: _checks, _typing, __main__
        assert any(folder in layer for layer in LAYERS), f"{folder} has no entry in LAYERS"


def test_no_module_shadows_a_public_name_of_its_package():
    """``matroot.polar`` and ``matroot.optim.shampoo`` are functions: a submodule of that
    name would replace the attribute on import, or be unreachable as one
    (``import matroot.polar.api as m`` fails when ``matroot.polar`` is the function)."""
    checked = 0
    for init in PACKAGE.rglob("__init__.py"):
        dotted = ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        public = set(getattr(importlib.import_module(dotted), "__all__", ()))
        clashes = sorted(name for name in public if (init.parent / f"{name}.py").exists()
                         or (init.parent / name / "__init__.py").exists())
        assert not clashes, f"{init.parent.name}/ has modules named after its public {clashes}"
        checked += len(public)
    assert checked > 50


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
