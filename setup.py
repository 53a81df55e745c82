"""Build shim: ship the top-level ``migrations/`` directory as ``celery_flowcontrol._migrations``.

Everything declarative (metadata, dependencies, extras, package data, tool settings) lives in
setup.cfg. setup.cfg cannot combine ``packages = find:`` with a package whose directory lies
outside the package tree, so the package list is computed here instead.

Alembic's env.py and versions stay where Alembic users expect them (``migrations/`` at the top
of the repository), and an installed copy finds them with
``importlib.resources.files("celery_flowcontrol._migrations")``, in normal and editable installs.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

MIGRATIONS_DIR = "migrations"
MIGRATIONS_PACKAGE = "celery_flowcontrol._migrations"


def migration_packages() -> list[str]:
    """Return the dotted names of ``migrations/`` and each of its subdirectories."""
    names: list[str] = []
    for root, dirs, _files in os.walk(MIGRATIONS_DIR):
        # Bytecode caches and hidden folders are not part of the package.
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(root, MIGRATIONS_DIR)
        names.append(MIGRATIONS_PACKAGE if rel == "." else f"{MIGRATIONS_PACKAGE}.{rel.replace(os.sep, '.')}")
    return names


setup(
    packages=find_packages(include=["celery_flowcontrol", "celery_flowcontrol.*"]) + migration_packages(),
    # Subpackages resolve through this entry: ..._migrations.versions -> migrations/versions.
    package_dir={MIGRATIONS_PACKAGE: MIGRATIONS_DIR},
)
