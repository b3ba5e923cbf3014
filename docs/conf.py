"""Sphinx configuration for the matroot docs.

Build (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The figures and measured tables are rendered from the JSON in ``docs/data/`` by
``docs/make_plots.py`` at the start of every build.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the matroot of this checkout
sys.path.insert(0, str(HERE))

import make_plots  # noqa: E402
import matroot  # noqa: E402

project = "matroot"
author = "the matroot developers"
copyright = "2026, the matroot developers"
release = matroot.__version__
version = release

extensions = ["sphinx.ext.autodoc", "numpydoc"]
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

exclude_patterns = ["_build", "_generated", "data"]
templates_path = []
html_theme = "alabaster"
html_static_path = []
html_title = f"matroot {release}"

#: Pages other branches write; each joins the index's toctree once its file exists.
OPTIONAL_PAGES = ("optimizer", "distributed", "benchmarks")
_OPTIONAL_MARKER = "   optional-pages\n"

make_plots.render()


def _add_optional_pages(app, docname, source):
    if docname == "index":
        present = "".join(f"   {page}\n" for page in OPTIONAL_PAGES
                          if (HERE / f"{page}.rst").exists())
        source[0] = source[0].replace(_OPTIONAL_MARKER, present)


def setup(app):
    app.connect("source-read", _add_optional_pages)
