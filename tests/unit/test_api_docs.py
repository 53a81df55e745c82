"""The docs site (docs/conf.py) holds together: docs/api.md documents every public name (each
name of ``__all__`` of the package, of ``celery_flowcontrol.admission`` and of
``celery_flowcontrol.testing`` is the target of an autodoc directive there), every page of
docs/ is in the site's index, and every link between pages names a page that exists. The
build itself (``tox -e docs``, and .ci/run) fails on any of these too, and on a docstring that
does not parse; these tests say it in the ordinary test run, before CI does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import celery_flowcontrol
import celery_flowcontrol.admission
import celery_flowcontrol.testing

DOCS = Path(__file__).resolve().parents[2] / "docs"
API = DOCS / "api.md"
PAGES = sorted(p.stem for p in DOCS.glob("*.md"))
TARGETS = set(re.findall(r"^\.\. auto\w+:: (\S+)", API.read_text(), re.MULTILINE))
PUBLIC = [(module.__name__, name) for module in (
    celery_flowcontrol, celery_flowcontrol.admission, celery_flowcontrol.testing)
    for name in module.__all__]


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_every_public_name_is_in_the_api_reference(module: str, name: str) -> None:
    assert f"{module}.{name}" in TARGETS, f"add `.. autoX:: {module}.{name}` to docs/api.md"



def test_every_page_is_in_the_site_index() -> None:
    index = (DOCS / "index.md").read_text()
    listed = set(re.findall(r"^([\w-]+)$", index, re.MULTILINE))
    missing = [p for p in PAGES if p != "index" and p not in listed]
    assert not missing, f"add {missing} to a toctree of docs/index.md"


@pytest.mark.parametrize("page", PAGES)
def test_links_between_pages_name_pages_that_exist(page: str) -> None:
    text = (DOCS / f"{page}.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or a heading of this page
        path = target.partition("#")[0]
        assert "/" not in path and (DOCS / path).is_file(), (
            f"docs/{page}.md links {target!r}: a page of docs/ only (the site holds nothing "
            "else); name a file of the repository as text, or link its URL")


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    """What tox -e docs and .ci/run build: any warning fails (a docstring that does not parse,
    a page outside every toctree, a dead link)."""
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
         str(tmp_path / "html")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-6000:]
