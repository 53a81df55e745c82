"""Sphinx configuration of the docs site: the Markdown of docs/ (MyST) and an API reference
generated from the docstrings (autodoc). Build it with ``tox -e docs``, or::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # autodoc imports the package from this tree

project = "celery-flowcontrol"
author = "celery-flowcontrol maintainers"
copyright = "celery-flowcontrol maintainers"  # noqa: A001 - Sphinx's own name for it
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Links to a heading of another page (settings.md#redis-sentinel-and-redis-cluster) resolve to
# the anchors GitHub makes of headings, down to this level.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# The public API as users import it: celery_flowcontrol.FlowControl, not .flowcontrol.FlowControl.
add_module_names = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options: dict[str, object] = {}  # each directive of api.md says which members

html_theme = "alabaster"
html_title = "celery-flowcontrol"
