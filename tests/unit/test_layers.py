"""The package's imports keep the layers of docs/architecture.md.

Every import of every module is read from its source (``ast``: function-level imports count
too, so a cycle can't hide behind a lazy import) and checked against rules 1 to 5; rules 6 and 7
read the files' names and text:

1. no import cycle between modules;
2. a module imports only its own layer or the layers below it (:data:`LAYERS`, lowest first);
3. the engines (``admission``, ``parking``) import neither Celery, kombu nor billiard, nor
   each other; inside ``admission`` the backends don't import each other;
4. operators (``cli``, ``dashboard``, ``metrics``) reach the engines only through the facade
   (``flowcontrol``) or the read models (``views``), and the dashboard and the metrics don't
   reach into the CLI;
5. no module imports a private (``_name``) name from another module, ours or a dependency's,
   except the one module that owns each reach (:data:`REACHES`);
6. no two modules share a file name (``__init__.py`` aside);
7. no comment or docstring cites an issue number of this project;
8. every error class of the package is defined in ``errors.py`` and exported from
   ``celery_flowcontrol`` (:data:`SIGNALS` aside);
9. the worker's parts are reached one way (:data:`ONLY_THROUGH`): the consumer step imports
   nothing of ours but the worker's runtime; and a part does not reach the parts that use it
   (:data:`NOT_BACK`): they talk through a narrow interface of its own, not back up the path;
10. docs/architecture.md's data path names each module once, and only modules of ours;
11. the gate only decides (:data:`BUILT_IN`): the parts it decides with are built by the
    worker's runtime alone, and ``worker/gate.py`` imports none of their classes but for types.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_flowcontrol"
ROOT = "celery_flowcontrol"

#: Lowest first. A module's layer is that of the longest prefix listed.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("data", ("errors", "config", "settings", "protocol", "reasons", "collapse.keys", "lua_loader")),
    ("engines", ("admission", "parking", "collapse.claims", "collapse.latest", "collapse.batchstats")),
    ("assembly", ("engines", "compat", "kombu_redis", "collapse.wiring", "parked_state")),
    ("producer", ("task", "call_checks", "group", "collapse", "room")),
    ("worker", ("worker", "beat", "collapse.landing", "collapse.batchrun", "collapse.latestrun")),
    ("glue", ("beat", "autoscale", "autoscaling", "testing")),
    ("facade", ("flowcontrol", "slots", "quota_signals", "tenants")),
    ("views", ("views",)),
    ("operators", ("cli", "dashboard", "metrics", "metrics_tenants")),
    # the pytest plugin: a user's test suite drives the whole package through it
    ("package", ("", "pytest")),
]
ENGINES = ("admission", "parking")
OPERATORS = ("cli", "dashboard", "metrics", "metrics_tenants")
FOREIGN_TO_ENGINES = ("celery", "kombu", "billiard", "vine")
#: admission backends: none imports another.
BACKENDS = ("admission.memory", "admission.redis")
#: Private names of a dependency that one module of ours may reach for, and why it must.
#: FlowControlError subclasses that are signals, not errors, and live where they are raised.
SIGNALS = {"task.FlowBackoff"}
REACHES: dict[str, set[str]] = {
    # the hot path's replies fail as redis-py's do: its error table (BaseParser.parse_error)
    "admission.redis.redispy": {"redis._parsers.base"},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


MODULES = modules()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports(name: str) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in module *name*;
    our own modules without the ``celery_flowcontrol.`` prefix, others as written."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    here = name.split(".") if is_package(name) else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join([ROOT, *base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name, node.lineno


def ours(target: str, name: str | None) -> str | None:
    """Our module an import refers to (a submodule imported by name counts as itself)."""
    if target != ROOT and not target.startswith(ROOT + "."):
        return None
    mod = target[len(ROOT) + 1:] if target != ROOT else ""
    if name is not None:
        sub = f"{mod}.{name}" if mod else name
        if sub in MODULES:
            return sub
    return mod if mod in MODULES else None


def layer_of(mod: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix == "" and mod == "":
                return i
            if prefix and (mod == prefix or mod.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"module {mod!r} is in no layer of LAYERS: add it"
    return rank


def top(mod: str) -> str:
    return mod.split(".")[0]


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod in MODULES:
        for target, name, _ in imports(mod):
            dep = ours(target, name)
            if dep is not None and dep != mod:
                graph[mod].add(dep)
    return graph


#: Modules that may import nothing of ours but these: the one way they reach the package.
ONLY_THROUGH: dict[str, set[str]] = {
    # attaches to and detaches from the consumer through WorkerRuntime, and nothing else
    "worker.bootstep": {"worker.runtime"},
}

#: Parts that must not import the parts named: each is told through an interface it declares
#: (a ``Protocol``) or answers with a return value, so a call never goes back up the path.
NOT_BACK: dict[str, set[str]] = {
    "worker.park": {"worker.waker", "worker.gate"},
    "worker.release": {"worker.waker", "worker.gate", "worker.request", "worker.asking"},
    "worker.asking": {"worker.gate"},
    "worker.refusal": {"worker.gate"},
    "worker.costs": {"worker.gate"},
    "worker.linger": {"worker.waker", "worker.wake_ahead"},
    "worker.wake_ahead": {"worker.waker"},
    "worker.chores": {"worker.waker"},
}


#: Classes of the worker's parts, and the only modules that build them (call the class).
BUILT_IN: dict[str, set[str]] = {
    **{part: {"worker.runtime"} for part in ("Gate", "Parker", "LoopAsks", "Releaser", "ParkBatch",
                                            "Refusals", "Admitter", "ConsumerLoop", "Twins", "Outage")},
    # the worker's one (runtime), a waker's own outside a worker, one per call of beat's wake_due
    "Quarantine": {"worker.runtime", "worker.waker", "worker.republish"},
}


def type_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:`` in *tree* (read by the type checker alone)."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.If)
            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}


def test_the_parts_are_built_by_the_runtime_and_the_gate_only_decides() -> None:
    built = []
    for mod in sorted(MODULES):
        for node in ast.walk(ast.parse(MODULES[mod].read_text(), str(MODULES[mod]))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and mod not in BUILT_IN.get(node.func.id, {mod}):
                built.append(f"{mod}:{node.lineno} builds {node.func.id}")
    assert not built, "parts built outside the runtime:\n" + "\n".join(built)
    tree = ast.parse(MODULES["worker.gate"].read_text())
    later = type_only(tree)
    reached = sorted(f"{alias.name} (line {node.lineno})" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node not in later
                     for alias in node.names if alias.name in BUILT_IN or alias.name == "Waker")
    assert not reached, f"worker/gate.py imports the parts it is handed: {reached}"


def test_every_module_has_a_layer() -> None:
    for mod in MODULES:
        layer_of(mod)


def test_no_import_cycles() -> None:
    graph = edges()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def violations() -> list[str]:
    out = []
    for mod in sorted(MODULES):
        for target, name, line in imports(mod):
            where = f"{mod or ROOT}:{line}"
            dep = ours(target, name)
            if dep is None:
                if top(mod) in ENGINES and target.split(".")[0] in FOREIGN_TO_ENGINES:
                    out.append(f"{where}: an engine imports {target}")
                continue
            if dep == mod or dep == "" and mod == "":
                continue
            if layer_of(dep) > layer_of(mod):
                out.append(f"{where}: imports {dep}, a layer above ({LAYERS[layer_of(dep)][0]} over "
                           f"{LAYERS[layer_of(mod)][0]})")
            if top(mod) in ENGINES and top(dep) in ENGINES and top(dep) != top(mod):
                out.append(f"{where}: engine {top(mod)} imports engine {dep}")
            for a in BACKENDS:
                for b in BACKENDS:
                    if a != b and (mod == a or mod.startswith(a + ".") or mod.startswith(a + "_")) and (
                            dep == b or dep.startswith(b + ".") or dep.startswith(b + "_")):
                        out.append(f"{where}: backend {mod} imports backend {dep}")
            if top(mod) in OPERATORS and top(dep) in ENGINES:
                out.append(f"{where}: operator module imports engine {dep} (use the facade or views)")
            if top(mod) in ("dashboard", "metrics") and top(dep) == "cli":
                out.append(f"{where}: {top(mod)} imports the CLI's {dep} (share it through views)")
    return out


def test_imports_keep_the_layers() -> None:
    found = violations()
    assert not found, "imports that break the layers:\n" + "\n".join(found)


def test_parts_reached_one_way() -> None:
    graph = edges()
    found = {mod: sorted(graph[mod] - allowed) for mod, allowed in ONLY_THROUGH.items()
             if graph[mod] - allowed}
    assert not found, f"modules reaching past the one part they may import: {found}"
    back = {mod: sorted(graph[mod] & never) for mod, never in NOT_BACK.items() if graph[mod] & never}
    assert not back, f"parts calling back up the path: {back}"


def test_no_private_name_is_imported_across_modules() -> None:
    found = []
    for mod in sorted(MODULES):
        for target, name, line in imports(mod):
            private_module = any(part.startswith("_") and part != "__future__" for part in target.split("."))
            private_name = name is not None and name.startswith("_") and name != "__version__"
            if (private_module or private_name) and target != "__future__":
                if f"{target}:{name}" in REACHES.get(mod, set()) or target in REACHES.get(mod, set()):
                    continue
                found.append(f"{mod}:{line}: from {target} import {name}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


@pytest.mark.parametrize("limit", [400])
def test_no_module_over_400_lines(limit: int) -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > limit}
    assert not long, f"modules over {limit} lines: {long}"


def test_no_class_over_250_lines() -> None:
    long = {}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 250:
                    long[f"{mod}.{node.name}"] = size
    assert not long, f"classes over 250 lines: {long}"


def test_no_two_modules_share_a_basename() -> None:
    """A file name says which module is meant (``windows.py``, not a third ``rate.py``)."""
    by_name: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules sharing a file name: {shared}"


def test_no_comment_cites_an_issue_of_ours() -> None:
    """Comments and docstrings say why in place: an issue number is history, and a reader of the
    code can't follow it. Another project's issue (``Celery issue #4526``) may be cited."""
    cited = re.compile(r"(?i)(?<!celery )(?<!kombu )\bissues? #?\d+")
    roots = (PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks", PACKAGE.parent / "examples")
    hits = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
            for root in roots for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text("utf-8").splitlines(), 1) if cited.search(line)]
    assert not hits, "issue numbers in the code:\n" + "\n".join(hits)


def error_classes() -> dict[str, str]:
    """``{"module.Class": "Class"}`` of every class of the package under FlowControlError, read
    from the source: a class is one when a base is (by name), to the fixed point."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases]
                classes[f"{mod}.{node.name}"] = (node.name, bases)
    errors = {"FlowControlError"}
    while True:
        more = {name for name, bases in classes.values() if errors & set(bases)} - errors
        if not more:
            break
        errors |= more
    return {where: name for where, (name, _) in classes.items() if name in errors}


def test_every_error_lives_in_errors_py_and_is_exported() -> None:
    """A caller catches what a public function raises by a name from the package itself: every
    error is defined in errors.py, under FlowControlError, and listed in ``__all__``."""
    import celery_flowcontrol

    found = error_classes()
    assert "errors.SettleError" in found and "collapse.keys.CollapseError" not in found
    elsewhere = sorted(w for w in found if not w.startswith("errors.") and w not in SIGNALS)
    assert not elsewhere, f"errors defined outside errors.py: {elsewhere}"
    missing = sorted(name for where, name in found.items()
                     if not name.startswith("_") and name not in celery_flowcontrol.__all__)
    assert not missing, f"errors not exported from celery_flowcontrol: {missing}"
    for name in celery_flowcontrol.__all__:
        obj = getattr(celery_flowcontrol, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, celery_flowcontrol.FlowControlError), name


TESTS = Path(__file__).resolve().parents[1]
#: What only tests/support may do, by the name a test module would do it with: start a server
#: (the program's name as a value), build the waker, define a free-port helper, a message
#: builder or a TCP relay of its own.
SUPPORT_ONLY = {"call": {"Waker"}, "def": {"free_port", "free_cluster_port", "message"},
                "value": {"redis-server", "redis-sentinel"}}


def test_only_tests_support_starts_servers_and_builds_test_parts() -> None:
    """tests/support/ is the one place a test starts ``redis-server``, builds a waker or a
    message, picks a free port or relays TCP: a test module outside it that does so by itself
    is a copy (read from the source, so a lazy import or a helper can't hide one)."""
    hits = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS)
        if rel.parts[0] == "support":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in SUPPORT_ONLY["call"]:
                hits.append(f"{rel}:{node.lineno} builds {node.func.id}")
            elif isinstance(node, ast.FunctionDef) and node.name in SUPPORT_ONLY["def"]:
                hits.append(f"{rel}:{node.lineno} defines {node.name}()")
            elif isinstance(node, ast.ClassDef) and node.name.endswith("Proxy"):
                hits.append(f"{rel}:{node.lineno} defines a relay, {node.name}")
            elif isinstance(node, ast.Constant) and node.value in SUPPORT_ONLY["value"] \
                    and path != Path(__file__).resolve():
                hits.append(f"{rel}:{node.lineno} starts {node.value}")
    assert not hits, "belongs in tests/support:\n" + "\n".join(hits)


def test_the_data_path_names_each_module_once() -> None:
    """docs/architecture.md's data path: one row per step, each module of it named once (in
    the module column) and every one of them a module or package of ours."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text("utf-8")
    table = text.split("## The data path", 1)[1].split("\n## ", 1)[0]
    named: list[str] = []
    for row in table.splitlines():
        cells = row.split("|")
        if len(cells) < 3 or cells[1].strip() in ("step", "---"):
            continue
        named += re.findall(r"`([\w/]+(?:\.py|/))`", cells[2])
    assert len(named) > 20, "the data path's table was not found"
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not twice, f"modules named more than once in the data path: {twice}"
    missing = [m for m in named if not (PACKAGE / m).exists()]
    assert not missing, f"the data path names what is not in the package: {missing}"
