"""Every state of the state machines is named once, in `daemon/core/states.py`, and nowhere else.

The test reads every module of the packages and of `examples/` with `ast` and fails, naming
file:line, on a string equal to a state's value that is used as a state:

- an operand of a comparison (`==`, `!=`, `in`, `not in`), or a string of a tuple, list or set
  literal that is one;
- the value given to a name that holds a state (`HOLDERS`): assigned to it (`status = ...`,
  `row["state"] = ...`, `state |= {...}`), passed as its keyword or, by position, as that parameter
  of a function the packages define (`move(adapter_id, "live", ...)` is `to_state`), a dict
  entry under it (`{"status": ...}`), a for loop over strings into it, its default;
- a `case` pattern;
- a tuple, list or set literal of nothing but states, whatever it is called.

A conditional (`"a" if x else "b"`), a default (`x or "a"`, `d.get(k, "a")`) and a literal
collection count as the strings they hold. SQL text inside `daemon/store/` is not read (a string
holding a whole statement is never equal to a state), nor are the tests, which pin the stored values.
"""

from __future__ import annotations

import ast
import enum
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import orjson

from tracefix.daemon.core import states
from tracefix.daemon.core.states import (
    ADAPTER_TRANSITIONS, CAPABILITY_STATES, NEEDS_REASON, PIPELINE_STATES, RUN_FINISHED, SERVING_STATES, AdapterState,
    CapabilityState, EnvironmentStatus, GateStatus, RequestStatus, RunStatus, ServingRole, TrainingVerdict,
)  # fmt: skip

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("daemon", "router", "trainer", "collectors", "dashboard", "examples")
STATES_MODULE = REPO / "daemon" / "core" / "states.py"
MACHINES: tuple[type[enum.StrEnum], ...] = tuple(
    value for value in vars(states).values()
    if isinstance(value, type) and issubclass(value, enum.StrEnum) and value.__module__ == states.__name__
)  # fmt: skip
VALUES = frozenset(member.value for machine in MACHINES for member in machine)
# The names a state is kept under: columns and JSON keys (state, status, role, verdict, from_state,
# to_state), parameters (from_status, states, the trigger's `to`).
HOLDERS = frozenset({"state", "status", "states", "from_state", "to_state", "from_status", "to", "role", "verdict"})
# Strings equal to a state's value that mean something else: (file, what they are compared with or
# given to, the string), each with why it is not a state.
ALLOWED = {
    ("examples/demo/run.py", "period", "canary"):
        "a period of the demo's tally (examples/demo/panel.py: before, canary, after, numbered ones), named after the"
        " adapter state it spans: a label of the demo's report, not a state",
    ("dashboard/views/pipeline.py", "verdict", "rejected"):
        "the validation report's outcome as the dashboard words it (passed or rejected): prose, not a state",
    ("trainer/families/error_recovery.py", "status", "done"):
        "what a simulated write tool of a training environment answers (its verb's past tense, else done): the"
        " environment's data, not a stored state",
}


def _strings(node: ast.AST | None) -> Iterator[ast.Constant]:
    """The string constants `node` stands for: itself, a literal collection's, a conditional's or a default's."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _strings(element)
    elif isinstance(node, ast.Starred):
        yield from _strings(node.value)
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _strings(value)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2:
        yield from _strings(node.args[1])
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple", "list"):
        for argument in node.args:
            yield from _strings(argument)


def _holder(target: ast.AST) -> str | None:
    """The name an assignment target stands for: `x`, `self.x`, `row["x"]`."""
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
        return target.slice.value
    return None


def _called(node: ast.Call) -> str | None:
    return node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(node.func, ast.Name) else None


def _positions(trees: list[ast.AST]) -> dict[str, dict[int, str]]:
    """Per function name defined in `trees`, the positions of its parameters that hold a state (a
    method's without `self`)."""
    found: dict[str, dict[int, str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [argument.arg for argument in [*node.args.posonlyargs, *node.args.args]]
                if names and names[0] in ("self", "cls"):
                    names = names[1:]
                for index, name in enumerate(names):
                    if name in HOLDERS:
                        found.setdefault(node.name, {})[index] = name
    return found


def _uses(tree: ast.AST, positions: dict[str, dict[int, str]]) -> Iterator[tuple[ast.Constant, str]]:
    """Every string used as a state in `tree`, with what it is compared with or given to."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for index, operand in enumerate(operands):
                other = ast.unparse(operands[1] if index == 0 else operands[index - 1])
                yield from ((constant, other) for constant in _strings(operand))
        elif isinstance(node, ast.keyword) and node.arg in HOLDERS:
            yield from ((constant, node.arg) for constant in _strings(node.value))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.iter if isinstance(node, ast.For) else node.value
            for name in {_holder(target) for target in targets} & HOLDERS:
                yield from ((constant, name) for constant in _strings(value))
        elif isinstance(node, ast.Dict):
            yield from _entries(node)
        elif isinstance(node, ast.Call) and _called(node) in positions:
            for index, argument in enumerate(node.args):
                if isinstance(argument, ast.Starred):
                    break
                name = positions[_called(node)].get(index)  # type: ignore[index]
                if name is not None:
                    yield from ((constant, name) for constant in _strings(argument))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = [*node.args.posonlyargs, *node.args.args]
            defaults = list(zip(arguments[len(arguments) - len(node.args.defaults) :], node.args.defaults))
            defaults += [(argument, default) for argument, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default]
            for argument, default in defaults:
                if argument.arg in HOLDERS:
                    yield from ((constant, argument.arg) for constant in _strings(default))
        elif isinstance(node, ast.MatchValue):
            yield from ((constant, "case") for constant in _strings(node.value))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(element, ast.Constant) and element.value in VALUES for element in node.elts
        ):  # a set of states under another name: it belongs in states.py, built from members
            yield from ((constant, "a collection of states") for constant in _strings(node))


def _entries(node: ast.Dict) -> Iterator[tuple[ast.Constant, str]]:
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and key.value in HOLDERS:
            yield from ((constant, key.value) for constant in _strings(value))


def _bare_states(sources: dict[str, str]) -> tuple[list[str], set[tuple[str, str, str]]]:
    """The bare states in `sources` (relative path -> text) as file:line lines, and the allow-list
    entries that excused one."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    positions = _positions(list(trees.values()))
    found: dict[tuple[str, int, int], str] = {}
    excused = set()
    for path, tree in trees.items():
        for constant, used_as in _uses(tree, positions):
            if constant.value not in VALUES:
                continue
            if (path, used_as, constant.value) in ALLOWED:
                excused.add((path, used_as, constant.value))
                continue
            found.setdefault((path, constant.lineno, constant.col_offset), f"{constant.value!r} as {used_as}")
    return [f"{path}:{line}: {what}" for (path, line, _), what in sorted(found.items())], excused


def _sources() -> dict[str, str]:
    paths = [path for package in SCANNED for path in sorted((REPO / package).rglob("*.py")) if path != STATES_MODULE]
    return {str(path.relative_to(REPO)): path.read_text() for path in paths}


def test_no_bare_state_string_outside_the_states_module() -> None:
    found, excused = _bare_states(_sources())
    assert found == [], (
        "states written as bare strings; use the members of daemon/core/states.py (or, for a word that is no state, "
        "ALLOWED in tests/test_states.py with why):\n" + "\n".join(found)
    )
    assert excused == set(ALLOWED), f"allow-list entries that excuse nothing any more: {sorted(set(ALLOWED) - excused)}"


def test_the_scan_finds_a_bare_state() -> None:
    # The scanner itself, on uses it must flag and on uses it must let through.
    source = '''
def move(adapter_id, to_state, actor): ...
def check(adapter, row, runs, states):
    if adapter["state"] == "live": ...
    if row["status"] not in ("queued", "running"): ...
    status = "checked" if row else "failed"
    runs.set(status="rejected_by_eval")
    move(1, "rolled_back", "me")
    state |= {"status": "serving"}
    for state in ("canary", "live"): ...
    match adapter["state"]:
        case "approved": ...
    if adapter["state"] == AdapterState.LIVE or row["role"] == "assistant": ...
    move(1, AdapterState.REJECTED, "candidate")
    label = "live"
    SERVED = ("canary", "live")
'''
    found, _ = _bare_states({"daemon/example.py": source})
    assert [line.split(": ", 1)[1] for line in found] == [
        "'live' as adapter['state']",
        "'queued' as row['status']",
        "'running' as row['status']",
        "'checked' as status",
        "'failed' as status",
        "'rejected_by_eval' as status",
        "'rolled_back' as to_state",
        "'serving' as status",
        "'canary' as state",
        "'live' as state",
        "'approved' as case",
        "'canary' as a collection of states",
        "'live' as a collection of states",
    ]
    # An allow-listed word is let through in its own file only.
    assert _bare_states({"examples/demo/run.py": 'if period not in ("before", "canary"): ...'})[0] == []
    assert _bare_states({"examples/other.py": 'if period not in ("before", "canary"): ...'})[0] == [
        "examples/other.py:1: 'canary' as period"
    ]


def test_the_states_module_builds_its_sets_from_members() -> None:
    # Outside the enums' own bodies, states.py names no state by its string either.
    tree = ast.parse(STATES_MODULE.read_text())
    strings = [
        f"line {node.lineno}: {node.value!r}"
        for statement in tree.body if not isinstance(statement, ast.ClassDef)
        for node in ast.walk(statement) if isinstance(node, ast.Constant) and node.value in VALUES
    ]  # fmt: skip
    assert strings == []
    assert all(isinstance(state, CapabilityState) for state in (*CAPABILITY_STATES, *PIPELINE_STATES))
    assert all(isinstance(state, RunStatus) for state in RUN_FINISHED)
    assert all(isinstance(state, AdapterState) for state in (*NEEDS_REASON, *SERVING_STATES))
    assert set(ADAPTER_TRANSITIONS) == set(AdapterState)
    assert all(isinstance(state, AdapterState) for moves in ADAPTER_TRANSITIONS.values() for state in moves)
    assert {verdict.value for verdict in TrainingVerdict} <= {status.value for status in RunStatus}


def test_each_machine_names_each_state_once() -> None:
    # A repeated value would make its member an alias of the first, silently.
    for machine in MACHINES:
        assert len(machine.__members__) == len(machine), machine.__name__


def test_the_values_are_the_strings_stored_today() -> None:
    # The database, result.json, the gate's current.json and the router's table hold these strings:
    # a changed value would strand every row written before it.
    assert list(CapabilityState) == [
        "healthy", "watching", "gap_detected", "environment", "training", "evaluating", "candidate", "live", "cooldown",
    ]  # fmt: skip
    assert list(RequestStatus) == ["open", "taken", "done"]
    assert list(EnvironmentStatus) == ["checked", "failed", "validating", "validated", "rejected"]
    assert list(RunStatus) == ["queued", "running", "candidate", "rejected_by_eval", "failed"]
    assert list(TrainingVerdict) == ["candidate", "rejected_by_eval"]
    assert list(AdapterState) == ["candidate", "approved", "canary", "live", "retired", "rejected", "rolled_back"]
    assert list(ServingRole) == ["canary", "live", "retiring"]
    assert list(GateStatus) == ["trained", "serving", "failed"]
    assert {machine.__name__ for machine in MACHINES} == {
        "CapabilityState", "RequestStatus", "EnvironmentStatus", "RunStatus", "TrainingVerdict", "AdapterState", "ServingRole",
        "GateStatus",
    }  # fmt: skip


def test_a_member_is_written_as_its_string() -> None:
    live = AdapterState.LIVE
    assert live == "live" and hash(live) == hash("live") and "live" in SERVING_STATES
    assert (str(live), f"{live}", "%s" % live) == ("live", "live", "live")
    assert json.dumps({"state": live}) == '{"state": "live"}'
    assert orjson.dumps({"state": live}) == b'{"state":"live"}'
    connection = duckdb.connect()
    assert connection.execute("SELECT ?, ? = 'live'", [live, live]).fetchall() == [("live", True)]
    connection.close()
