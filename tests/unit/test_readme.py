"""The README is the package index's page: its links must work there, and its Quick start must
run as pasted (.ci/wheel-smoke runs it against a built wheel; these are the cheap checks)."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BASE = "https://github.com/celery-flowcontrol/celery-flowcontrol/"
#: Markdown links and images, and HTML href/src attributes.
LINKS = re.compile(r"\]\(([^)\s]+)\)|(?:href|src)=[\"']([^\"']+)[\"']")


def _links() -> list[str]:
    return [a or b for a, b in LINKS.findall(README)]


def _quick_start() -> str:
    section = README[README.index("## Quick start"):]
    return section[: section.index("\n## ", 1)]


def test_readme_has_no_relative_links() -> None:
    relative = [link for link in _links() if not re.match(r"https?://|mailto:", link)]
    assert relative == [], f"relative links are dead on the package index: {relative}"


def test_readme_links_into_the_repository_name_files_that_exist() -> None:
    ours = [link for link in _links() if link.startswith(BASE)]
    assert ours, "the README links no docs"
    for link in ours:
        path = re.sub(r"^(blob|tree)/main/", "", link[len(BASE):]).split("#")[0]
        if path in ("", "issues"):
            continue
        assert (REPO / path).exists(), f"{link} names {path}, which is not in the repository"


def test_setup_cfg_names_the_repository_the_readme_links() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    urls = cfg["metadata"]["project_urls"]
    assert BASE.rstrip("/") in urls and "Documentation" in urls


def test_quick_start_sends_nothing_when_imported() -> None:
    code = next(body for lang, body in re.findall(r"```(\w+)\n(.*?)```", _quick_start(), re.S)
                if lang == "python")
    tree = ast.parse(code)
    sends = [node for node in tree.body if any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr in {"delay", "apply_async", "send_task"} for call in ast.walk(node))
        and not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))]
    assert sends == [], "the Quick start sends tasks at import: every worker start would send them"


def test_quick_start_install_line_names_extras_that_exist() -> None:
    extras = re.search(r"pip install 'celery-flowcontrol\[([^\]]*)\]'", _quick_start())
    assert extras is not None
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    declared = set(cfg["options.extras_require"])
    assert set(extras.group(1).split(",")) <= declared
    # A Redis broker needs kombu's own redis extra (its transport imports what that extra brings).
    redis_extra = cfg["options.extras_require"]["redis"]
    assert "kombu[redis]" in redis_extra and "celery[redis]" in redis_extra
