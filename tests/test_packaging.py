"""The built wheel, installed as pip installs it: its packages live under `tracefix`, so it installs
beside python-daemon (whose top-level module is `daemon`, as the daemon package's folder is here)
and both import, in either order of installation; the `tracefix` command's module and the entry
points resolve inside the wheel's files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CHECK = """
import importlib.metadata, sys
import daemon
assert hasattr(daemon, "DaemonContext"), daemon.__file__
import tracefix.daemon.core.settings as settings
from tracefix.daemon.app import cli
root = sys.argv[1]
assert settings.__file__.startswith(root) and cli.__file__.startswith(root), (settings.__file__, cli.__file__)
assert daemon.__file__.startswith(root), daemon.__file__
assert settings.Settings().store.path  # the packaged defaults (tracefix/daemon/default_config.toml) load
families = [entry.value for entry in importlib.metadata.entry_points(group="tracefix.environments")]
assert families and all(value.startswith("tracefix.trainer.families.") for value in families), families
print("both import")
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tracefix wheel built from this checkout and python-daemon's wheel with its dependency."""
    directory = tmp_path_factory.mktemp("wheels")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(directory), str(REPO)], check=True, capture_output=True, timeout=300)
    subprocess.run([*pip, "download", "-d", str(directory / "python-daemon"), "python-daemon"], check=True, capture_output=True, timeout=300)
    return {"tracefix": next(directory.glob("tracefix-*.whl")), "python-daemon": directory / "python-daemon"}


@pytest.mark.parametrize("first", ["tracefix", "python-daemon"])
def test_the_wheel_installs_beside_python_daemon_and_both_import(wheels: dict[str, Path], tmp_path: Path, first: str) -> None:
    target = tmp_path / "site"
    others = sorted(wheels["python-daemon"].glob("*.whl"))
    order = [[wheels["tracefix"]], others] if first == "tracefix" else [others, [wheels["tracefix"]]]
    for files in order:
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps", "--upgrade", "--target", str(target), *map(str, files)]
        subprocess.run(command, check=True, capture_output=True, timeout=300)
    assert not (target / "daemon" / "app").exists()  # nothing of tracefix's at the top level
    # Outside the checkout, the target first on the path: what `import daemon` finds is python-daemon.
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(target)], cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "both import", done.stderr
