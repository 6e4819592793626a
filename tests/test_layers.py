"""The code's structure stays its design: layers import one way, read from the source with `ast`.

Inside `daemon/`, each stage imports only the stages below it:
core → store → analysis → promotion → pipeline → app. The other top-level packages reach the
daemon through its shared bottom (core, store) and the API client; the trainer also uses the
capability model, because its replay judges adapter answers with the same labelers. Imports inside
functions count too: a late import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("collectors", "daemon", "trainer", "router", "dashboard")
ROOMS = ("core", "store", "analysis", "promotion", "pipeline", "app")
# What each top-level package may import from daemon/ (module prefixes).
DAEMON_ALLOWED = {
    "collectors": ("daemon.core", "daemon.store"),
    "router": ("daemon.core", "daemon.store", "daemon.app.client"),
    "dashboard": ("daemon.core", "daemon.store", "daemon.app.client"),
    "trainer": ("daemon.core", "daemon.analysis.capabilities"),
}
# Which other top-level packages a daemon stage may import: the app composes the process, the
# pipeline drives the trainer; the rest stay inside daemon/.
OUTSIDE_ALLOWED = {"pipeline": ("trainer",), "app": PACKAGES}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module `path` imports, anywhere in the file, with its line."""
    module = _module(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((REPO / package).rglob("*.py"))


def _violation(importer: str, imported: str) -> str | None:
    top = importer.split(".")[0]
    target = imported.split(".")
    if target[0] not in PACKAGES or target[0] == top and top != "daemon":
        return None
    if top != "daemon":
        if target[0] != "daemon":
            return None
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
    assert _violation("daemon.app.api", "daemon.core.settings") is None
    assert _violation("router.server", "daemon.app.client") is None
    assert _violation("daemon.pipeline.synthesis", "trainer.families") is None
    assert _violation("trainer.replay", "daemon.analysis.capabilities.load_registry") is None


def test_no_module_level_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    modules = {_module(path): path for path in _sources()}
    for module, path in modules.items():
        edges = set()
        for node in ast.parse(path.read_text()).body:  # module level only: late imports break cycles at run time
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            edges.update(name for name in names if name in modules and name != module)
        graph[module] = edges
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
    assert cycles == [], "\n".join(cycles)


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
