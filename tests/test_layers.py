"""The code's structure stays its design: layers import one way, read from the source with `ast`.

Inside `daemon/`, each stage imports only the stages below it:
core → store → analysis → promotion → pipeline → app. The other top-level packages reach the
daemon through its shared bottom (core, store) and the API client; the trainer through core only
(its settings, and the contract of its requests and results). Among
themselves, only the router imports another one (the trainer's adapter and gate code it serves
with); none imports the dashboard or the collectors. Imports inside functions count too: a late import is still a dependency, so no two modules of the daemon import
each other, not even late.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("collectors", "daemon", "trainer", "router", "dashboard")
NAMESPACE = "tracefix"  # installed, the packages are tracefix.daemon and so on (tracefix/__init__.py)
ROOMS = ("core", "store", "analysis", "promotion", "pipeline", "app")
# What each top-level package may import from daemon/ (module prefixes).
DAEMON_ALLOWED = {
    "collectors": ("daemon.core", "daemon.store"),
    "router": ("daemon.core", "daemon.store", "daemon.app.client"),
    "dashboard": ("daemon.core", "daemon.store", "daemon.app.client"),
    "trainer": ("daemon.core",),
}
# Which top-level packages other than daemon/ each of the others may import.
PEERS_ALLOWED: dict[str, tuple[str, ...]] = {"collectors": (), "trainer": (), "router": ("trainer",), "dashboard": ()}
# Which other top-level packages a daemon stage may import: the app composes the process, the
# pipeline drives the trainer; the rest stay inside daemon/.
OUTSIDE_ALLOWED = {"pipeline": ("trainer",), "app": PACKAGES}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Blocks whose imports never run when the module is imported: for type checkers only, or the
# module's own script (`python -m` runs it as __main__, a module of its own).
_NOT_ON_IMPORT = ("TYPE_CHECKING", "typing.TYPE_CHECKING", "__name__ == '__main__'")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
Run = Literal["anywhere", "module", "late"]


def _nodes(node: ast.AST, late: bool) -> Iterator[ast.AST]:
    """The nodes under `node` whose imports run when the module is imported (with `late`, or when
    its functions are called)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _FUNCTIONS) and not late:
            continue
        if isinstance(child, ast.If) and ast.unparse(child.test) in _NOT_ON_IMPORT:
            for branch in child.orelse:
                yield branch
                yield from _nodes(branch, late)
            continue
        yield child
        yield from _nodes(child, late)


def _imports(path: Path, run: Run = "anywhere") -> Iterator[tuple[int, str]]:
    """Every module `path` imports, with its line: `anywhere` in the file, or only the imports that
    run at `module` level or also `late` (in functions). The packages are named as their folders
    (`daemon.core`, not `tracefix.daemon.core`)."""
    for line, name in _named_imports(path, run):
        yield line, name.removeprefix(f"{NAMESPACE}.")


def _named_imports(path: Path, run: Run = "anywhere") -> Iterator[tuple[int, str]]:
    """`_imports` as written in the file."""
    module = _module(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if run == "anywhere" else _nodes(tree, late=run == "late"):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            yield node.lineno, base
            for alias in node.names:  # `from daemon.core import metrics` imports daemon.core.metrics
                yield node.lineno, f"{base}.{alias.name}"


def _sources(packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    for package in packages:
        yield from sorted((REPO / package).rglob("*.py"))


def _violation(importer: str, imported: str) -> str | None:
    top = importer.split(".")[0]
    target = imported.split(".")
    if target[0] not in PACKAGES or target[0] == top and top != "daemon":
        return None
    if top != "daemon":
        if target[0] != "daemon":
            return None if target[0] in PEERS_ALLOWED[top] else f"{top} may not import {target[0]}"
        allowed = DAEMON_ALLOWED.get(top, ())
        if len(target) == 1 or any(imported == prefix or imported.startswith(prefix + ".") for prefix in allowed):
            return None
        if len(target) > 1 and target[1] in ROOMS and any(prefix.startswith(imported + ".") for prefix in allowed):
            return None  # `from daemon.app import client` names the package first
        return f"{top} may import from daemon only {', '.join(allowed)}"
    room = importer.split(".")[1] if importer.count(".") else None
    if room not in ROOMS:
        return None
    if target[0] != "daemon":
        return None if target[0] in OUTSIDE_ALLOWED.get(room, ()) else f"daemon.{room} may not import {target[0]}"
    if len(target) > 1 and target[1] in ROOMS and ROOMS.index(target[1]) > ROOMS.index(room):
        return f"daemon.{room} is below daemon.{target[1]}"
    return None


def test_every_import_of_the_packages_names_them_in_the_tracefix_namespace() -> None:
    # A bare `import daemon...` works in a checkout (its root is on sys.path) and breaks installed,
    # where `daemon` is another distribution's (python-daemon's) or nothing.
    found = []
    for path in [*_sources(), *sorted(REPO.glob("tests/**/*.py")), *sorted(REPO.glob("bench/**/*.py")), *sorted(REPO.glob("examples/**/*.py"))]:
        for line, imported in _named_imports(path):
            if imported.split(".")[0] in PACKAGES:
                found.append(f"{path.relative_to(REPO)}:{line} imports {imported}")
    assert found == [], "imports outside the tracefix namespace:\n" + "\n".join(found)


def test_daemon_holds_only_its_stage_packages() -> None:
    loose = sorted(path.name for path in (REPO / "daemon").glob("*.py") if path.name != "__init__.py")
    assert loose == [], f"modules outside a stage package: {loose}"
    assert sorted(path.name for path in (REPO / "daemon").iterdir() if (path / "__init__.py").exists()) == sorted(ROOMS)


def test_every_import_runs_down_the_layers() -> None:
    found = []
    for path in _sources():
        importer = _module(path)
        for line, imported in _imports(path):
            problem = _violation(importer, imported)
            if problem:
                found.append(f"{path.relative_to(REPO)}:{line} imports {imported}: {problem}")
    assert found == [], "\n".join(sorted(set(found)))


def test_the_layer_check_catches_a_backward_import() -> None:
    # The rules themselves, on imports that must be refused and allowed.
    assert _violation("daemon.store.store", "daemon.analysis.capabilities")
    assert _violation("daemon.core.settings", "daemon.app.cli.main")
    assert _violation("router.server", "daemon.promotion.router_client")
    assert _violation("dashboard.views.pipeline", "daemon.promotion.lifecycle")
    assert _violation("daemon.analysis.trigger", "trainer.environment")
    assert _violation("collectors.trajectories", "daemon.app.client")
    assert _violation("dashboard.views.pipeline", "trainer.environment")
    assert _violation("collectors.importer", "router.server")
    assert _violation("router.server", "dashboard.page")
    assert _violation("router.backend", "collectors.otlp")
    assert _violation("trainer.replay", "router.backend")
    assert _violation("router.backend", "trainer.adapters") is None
    assert _violation("daemon.app.api", "daemon.core.settings") is None
    assert _violation("router.server", "daemon.app.client") is None
    assert _violation("daemon.pipeline.synthesis", "trainer.families") is None
    assert _violation("trainer.replay", "daemon.analysis.capabilities.load_registry")  # the daemon judges replays
    assert _violation("daemon.pipeline.replay_judge", "daemon.analysis.capabilities.load_registry") is None


def _cycles(packages: tuple[str, ...], run: Run) -> list[str]:
    """The import cycles among the modules of `packages`, counting the imports `run` names."""
    modules = {_module(path): path for path in _sources(packages)}
    graph = {
        module: {name for _, name in _imports(path, run) if name in modules and name != module}
        for module, path in modules.items()
    }
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_no_module_level_import_cycle() -> None:
    cycles = _cycles(PACKAGES, "module")
    assert cycles == [], "\n".join(cycles)


def test_no_import_cycle_even_through_late_imports() -> None:
    # A late import (inside a function) breaks a cycle at run time, not in the design: the module
    # that composes two others belongs above both.
    cycles = _cycles(PACKAGES, "late")
    assert cycles == [], "\n".join(cycles)


def test_the_cycle_check_sees_late_imports_and_skips_imports_that_never_run() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from daemon.app.service import Daemon\n"
        "def compose():\n    from daemon.analysis.llm_labeler import llm_capabilities\n"
        "if __name__ == '__main__':\n    from daemon.core.config_file import main\n"
    )
    tree = ast.parse(source)
    late = [node.module for node in _nodes(tree, late=True) if isinstance(node, ast.ImportFrom)]
    assert late == ["typing", "daemon.analysis.llm_labeler"]
    assert [node.module for node in _nodes(tree, late=False) if isinstance(node, ast.ImportFrom)] == ["typing"]


_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP)\s", re.MULTILINE)


def test_only_the_store_holds_sql() -> None:
    found = []
    for path in _sources():
        if path.is_relative_to(REPO / "daemon" / "store"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value.strip()[:60]}")
            elif isinstance(node, ast.JoinedStr):
                text = "".join(part.value for part in node.values if isinstance(part, ast.Constant) and isinstance(part.value, str))
                if _SQL.search(text):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text.strip()[:60]}")
    assert found == [], "SQL outside daemon/store/:\n" + "\n".join(found)
