"""Sphinx configuration for the matroot docs.

Build (warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The figures and measured tables are rendered from the JSON in ``docs/data/`` by
``docs/make_plots.py`` at the start of every build.
"""

import importlib.util
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
# The `docs` extra installs no array framework (an unpinned torch is a multi-GB CUDA
# build): the torch and optax shells are documented against stand-ins where their
# framework is missing.
autodoc_mock_imports = [m for m in ("torch", "jax", "optax") if importlib.util.find_spec(m) is None]
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

exclude_patterns = ["_build", "_generated", "data"]
templates_path = []
html_theme = "alabaster"
# A wider page than alabaster's 940 px, so the 90-column code blocks fit; wider ones scroll.
html_theme_options = {"page_width": "1100px", "sidebar_width": "220px"}
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_title = f"matroot {release}"

make_plots.render()
