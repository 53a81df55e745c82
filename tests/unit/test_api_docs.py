"""docs/api.md, the API reference of the docs site, documents every public name: each name
of ``__all__`` of the package, of ``celery_flowcontrol.admission`` and of
``celery_flowcontrol.testing`` is the target of an autodoc directive there (the docs build,
``tox -e docs``, then fails on a name that does not import or a docstring that does not parse).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import celery_flowcontrol
import celery_flowcontrol.admission
import celery_flowcontrol.testing

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TARGETS = set(re.findall(r"^\.\. auto\w+:: (\S+)", API.read_text(), re.MULTILINE))
PUBLIC = [(module.__name__, name) for module in (
    celery_flowcontrol, celery_flowcontrol.admission, celery_flowcontrol.testing)
    for name in module.__all__]


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_every_public_name_is_in_the_api_reference(module: str, name: str) -> None:
    assert f"{module}.{name}" in TARGETS, f"add `.. autoX:: {module}.{name}` to docs/api.md"

