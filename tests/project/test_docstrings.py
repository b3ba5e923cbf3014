"""Run the Examples sections of every public matroot module's docstrings, and of the
benchmarks' modules (the checkout's ``bench`` package, not installed)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import matroot

OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def public_module_names():
    import bench
    from bench.__main__ import SCRIPTS

    names = ["matroot"]
    for package in (matroot, bench):
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    # bench's experiment scripts run through ``python -m bench NAME``, not as imports.
    return sorted(n for n in names if n.removeprefix("bench.") not in SCRIPTS)


def collect_doctests():
    cases, skipped = [], []
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in public_module_names():
        try:
            module = importlib.import_module(name)
        except ImportError as err:  # an optional dependency (torch, matplotlib) is missing
            skipped.append(pytest.param(name, None, id=name, marks=pytest.mark.skip(
                reason=f"{name} needs {err.name}")))
            continue
        for test in finder.find(module):
            if test.examples:
                cases.append(pytest.param(name, test, id=test.name))
    return cases + skipped


CASES = collect_doctests()


def test_every_public_function_has_an_example():
    missing = [name for name in matroot.__all__
               if inspect.isfunction(getattr(matroot, name))
               and "Examples\n" not in (getattr(matroot, name).__doc__ or "")]
    assert not missing, f"public functions without an Examples section: {missing}"
    found = {c.values[1].name for c in CASES if c.values[1] is not None}
    for name in matroot.__all__:
        obj = getattr(matroot, name)
        if inspect.isfunction(obj):
            assert f"{obj.__module__}.{obj.__qualname__}" in found, name


@pytest.mark.parametrize("module_name, test", CASES)
def test_docstring_examples(module_name, test):
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    output = []
    runner.run(test, out=output.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(output)
