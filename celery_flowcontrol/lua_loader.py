"""The one loader of the package's Lua scripts: a script is composed of named parts.

A package keeps its scripts in a ``lua/`` folder, one file per atomic operation
(``lua/<name>.lua``, opening with the header that names its KEYS, ARGV and reply) beside the
modules they share (``lua/<module>.lua``: local functions, no text markers). :func:`compose`
sends an operation as: a header of the constants the caller shares with Python
(``local C_A, C_B = a, b``, so no figure is copied by hand), then each module the operation
declares, in the declared order, then the operation itself. A ``local`` is seen only by the
text after it, so each module comes after those it uses; only the declared modules are sent.

The admission backend declares its scripts in :mod:`.admission.redis.scripts`; the collapse
claims (:mod:`.collapse.claims`) send theirs whole. Nothing here imports redis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources

#: A constant's value in a header: a number or a string (written as Lua reads it back).
Constant = int | float | str


def lua_file(package: str, name: str) -> str:
    """The text of ``lua/<name>.lua`` in *package*."""
    return resources.files(package).joinpath(f"lua/{name}.lua").read_text("utf-8")


def constants_header(constants: Mapping[str, Constant]) -> str:
    """``local C_A, C_B = a, b``, one local per constant: numbers as ``repr`` (the same double
    in Lua), strings as JSON (plain ASCII, so a valid Lua literal). Locals, not a table: a
    table would be built on every call of the script."""
    names, literals = [], []
    for name, value in sorted(constants.items()):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(f"constant {name}: {value!r} is not a number or a string")
        names.append(f"C_{name}")
        literals.append(json.dumps(value) if isinstance(value, str) else repr(value))
    return f"local {', '.join(names)} = {', '.join(literals)}  -- from Python (lua_loader.py)"


def compose(package: str, name: str, modules: Sequence[str] = (),
            constants: Mapping[str, Constant] | None = None) -> str:
    """The script sent for operation *name* of *package*: the constants header (if any),
    then each of *modules*, then ``lua/<name>.lua``."""
    parts = [] if constants is None else [constants_header(constants)]
    parts += [lua_file(package, m) for m in modules]
    parts.append(lua_file(package, name))
    return "\n".join(parts)
