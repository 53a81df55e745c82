"""The Lua scripts are composed of named parts, declared in one place (scripts.py).

Read from the files and from what :func:`script_source` sends, no Redis needed: no text marker
in any Lua file; every declared module exists and every module is declared; each module comes
after the modules whose names it uses; the constants come from Python; the window maths is
written once; the operator reads are sent with no decision; the collapse scripts live with
``collapse/`` and go through the one loader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_flowcontrol import lua_loader
from celery_flowcontrol.admission import lines, quota, values, windows
from celery_flowcontrol.admission.redis import codec
from celery_flowcontrol.admission.redis.scripts import CONSTANTS, SCRIPTS, script_source
from celery_flowcontrol.collapse import claims
from celery_flowcontrol.config import fields

PACKAGE = Path(__file__).resolve().parents[2] / "celery_flowcontrol"
ADMISSION_LUA = PACKAGE / "admission" / "redis" / "lua"
COLLAPSE_LUA = PACKAGE / "collapse" / "lua"
MODULES = sorted({m for mods in SCRIPTS.values() for m in mods})
#: The scripts an operator's read is made of; every other script decides or changes state.
READS = {"waiters", "place"}


def lua_files() -> list[Path]:
    return sorted([*ADMISSION_LUA.glob("*.lua"), *COLLAPSE_LUA.glob("*.lua")])


def code_of(text: str) -> str:
    """*text* without comments and string literals (the Lua here has no long strings)."""
    text = re.sub(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"", "''", text)
    return re.sub(r"--[^\n]*", "", text)


def top_level_names(text: str) -> list[str]:
    """The names a Lua file declares at its top level (``local function f``, ``local a, b``)."""
    names = []
    for line in text.splitlines():
        if m := re.match(r"local function (\w+)", line):
            names.append(m.group(1))
        elif m := re.match(r"local ([\w, ]+?)\s*(=|$)", line):
            names += [n.strip() for n in m.group(1).split(",")]
    return names


def test_no_text_marker_in_any_lua_file() -> None:
    marked = [p.name for p in lua_files() if "--@" in p.read_text()]
    assert not marked, f"text markers in {marked}: declare modules in scripts.py instead"


def test_every_declared_module_exists_and_every_module_is_declared() -> None:
    files = {p.stem for p in ADMISSION_LUA.glob("*.lua")}
    assert not set(MODULES) - files, "declared modules with no file"
    assert set(SCRIPTS) <= files, "operations with no file"
    assert not set(MODULES) & set(SCRIPTS), "a file is both a module and an operation"
    assert files == set(MODULES) | set(SCRIPTS), f"unused Lua files: {files - set(MODULES) - set(SCRIPTS)}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_script_declares_every_module_it_uses_before_it_is_used(name: str) -> None:
    # Redis only fails on a missing local when the path that reads it runs: check them all.
    declared_by = {n: m for m in MODULES for n in top_level_names((ADMISSION_LUA / f"{m}.lua").read_text())}
    seen: set[str] = set()
    missing = []
    for part in [*SCRIPTS[name], name]:
        text = (ADMISSION_LUA / f"{part}.lua").read_text()
        for line in code_of(text).splitlines():
            mine = top_level_names(line)
            seen.update(mine)
            for ident in re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", line):
                if ident in declared_by and ident not in seen and ident not in mine:
                    missing.append(f"{part}.lua uses {ident} of {declared_by[ident]}.lua")
    assert not missing, f"{name}: " + "; ".join(sorted(set(missing)))


def test_the_modules_names_are_unique() -> None:
    owners: dict[str, str] = {}
    clashes = []
    for m in MODULES:
        for n in top_level_names((ADMISSION_LUA / f"{m}.lua").read_text()):
            if n in owners:
                clashes.append(f"{n} in {owners[n]}.lua and {m}.lua")
            owners[n] = m
    assert not clashes, clashes


@pytest.mark.parametrize("path", [p for p in lua_files() if p.stem not in MODULES], ids=lambda p: p.name)
def test_each_operation_opens_with_its_keys_argv_and_reply(path: Path) -> None:
    head = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        head.append(line)
    text = "\n".join(head)
    assert head and head[0].startswith(f"-- {path.name}: ")
    assert "KEYS[1]" in text and re.search(r"Returns?\b", text), f"{path.name}: no KEYS/Returns header"


@pytest.mark.parametrize("name", MODULES)
def test_each_module_says_what_it_is(name: str) -> None:
    assert (ADMISSION_LUA / f"{name}.lua").read_text().startswith(f"-- {name}.lua: ")


@pytest.mark.parametrize(("name", "value"), [
    ("UNKNOWN", codec.UNKNOWN), ("COST_REFUSED", codec.COST_REFUSED), ("SETTLED", codec.SETTLED),
    ("GRANT_BATCH", values.GRANT_BATCH), ("KEY_SCAN", values.KEY_SCAN),
    ("TURN_SAMPLE", lines.TURN_SAMPLE), ("TURN_EARLY", quota.TURN_EARLY),
    ("EPSILON", windows.EPSILON), ("KEY_MARGIN_MS", codec.KEY_MARGIN_MS),
    ("MAX_RATE_LIMITS", fields.MAX_RATE_LIMITS), ("RATE_EPOCH_MS", codec.RATE_EPOCH_MS),
    ("RATE_UNIT", codec.RATE_UNIT), ("RATE_KEEP_MS", codec.RATE_KEEP_MS),
    ("RATE", values.RATE), ("CONCURRENCY", values.CONCURRENCY), ("PER_KEY", values.PER_KEY),
    ("BACKOFF", values.BACKOFF),
])
def test_each_constant_comes_from_python(name: str, value: object) -> None:
    header = script_source("admit").splitlines()[0]
    m = re.fullmatch(r"local ([\w, ]+) = (.+)  -- from Python \(lua_loader.py\)", header)
    assert m is not None, header
    sent_as = dict(zip(m.group(1).split(", "), re.findall(r'"[^"]*"|[-\w.]+', m.group(2)),
                       strict=True))
    assert f"C_{name}" in sent_as, f"C_{name} is not sent"
    literal = sent_as[f"C_{name}"]
    sent = literal.strip('"') if isinstance(value, str) else float(literal)
    assert sent == value and CONSTANTS[name] == value


def test_every_constant_is_used_and_every_use_is_sent() -> None:
    used = set()
    for p in ADMISSION_LUA.glob("*.lua"):
        used |= set(re.findall(r"\bC_(\w+)", code_of(p.read_text())))
    assert used == set(CONSTANTS), f"used, not sent: {used - set(CONSTANTS)}; " \
                                   f"sent, not used: {set(CONSTANTS) - used}"


def test_a_header_takes_numbers_and_strings_only() -> None:
    assert lua_loader.constants_header({"A": 1, "B": 0.5, "C": "x"}) == \
        'local C_A, C_B, C_C = 1, 0.5, "x"  -- from Python (lua_loader.py)'
    with pytest.raises(TypeError):
        lua_loader.constants_header({"A": True})


@pytest.mark.parametrize("mark", [
    "math.floor(NOW * 1e6",        # the fixed window
    "ZREMRANGEBYSCORE",            # the sliding window's trim
    "st.tat - c.p / limit",        # GCRA
])
def test_the_window_maths_is_written_once(mark: str) -> None:
    where = [p.name for p in ADMISSION_LUA.glob("*.lua") if mark in p.read_text()]
    assert where == ["windows.lua"], where


def test_the_decision_scripts_carry_no_operator_read() -> None:
    for name in SCRIPTS:
        if name not in READS:
            assert "reads" not in SCRIPTS[name]
            assert "ordered_waiters" not in script_source(name), name
    assert "ordered_waiters" in script_source("waiters")


def test_sent_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = {name: len(script_source(name).splitlines()) for name in SCRIPTS}
    functions = {name: script_source(name).count("local function ") for name in SCRIPTS}
    with capsys.disabled():
        print("\nLua sent per script: lines, local functions")
        for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
            print(f"  {name:16} {sizes[name]:5} {functions[name]:4}  {' '.join(SCRIPTS[name])}")
    # Each script its own modules only: admit was sent with the operator reads and a second
    # copy of the window maths in 1,539 lines, set_max_hold with every module in 1,301 (before
    # the decision took in per-key settings, pauses and refusals: 1,650 lines, no reads, no
    # key_settings).
    assert sizes["admit"] < 1700 and sizes["heartbeat"] < 350 and sizes["set_max_hold"] < 200
    assert "key_settings" not in SCRIPTS["admit"]


@pytest.mark.parametrize(("name", "later"), [
    ("admit", {"key_table", "state", "slot_records", "key_rules", "busy", "key_windows", "quota",
               "lines", "grants", "tenants", "queue_state"}),
    ("release", {"keys", "key_table", "state", "windows", "slot_records", "key_rules", "busy", "key_windows",
                 "quota", "lines", "grants", "tenants", "queue_state"}),
])
def test_a_fast_path_runs_before_the_modules_only_the_full_decision_needs(
        name: str, later: set[str]) -> None:
    modules = SCRIPTS[name]
    fast = modules.index(f"{name}_fast")
    assert set(modules[fast + 1:]) == later


def test_the_collapse_scripts_live_with_collapse_and_go_through_the_one_loader() -> None:
    assert not list(ADMISSION_LUA.glob("unique_*.lua"))
    assert not list(ADMISSION_LUA.glob("latest_*.lua"))
    names = {p.stem for p in COLLAPSE_LUA.glob("*.lua")}
    assert names == {"unique_claim", "unique_extend", "unique_release",
                     "latest_claim", "latest_start", "latest_extend", "latest_finish"}
    for name in names:
        assert claims._lua(name) == lua_loader.compose("celery_flowcontrol.collapse", name)
    setup = (PACKAGE.parent / "setup.cfg").read_text()
    assert "collapse/lua/*.lua" in setup and "admission/redis/lua/*.lua" in setup
