"""How `tracefix dashboard` starts Streamlit: `streamlit run dashboard/app.py` on the [dashboard]
host and port, headless, without usage statistics, with the configuration passed through."""

from __future__ import annotations

import sys
from pathlib import Path

from tracefix.daemon.core.settings import DashboardSettings

APP = Path(__file__).resolve().with_name("app.py")


def streamlit_argv(settings: DashboardSettings, config_path: Path | None) -> list[str]:
    """The full command line, starting with this interpreter (so the dashboard runs in tracefix's environment)."""
    argv = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", settings.host,
        "--server.port", str(settings.port),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        # Installed code does not change under a running dashboard: no file watcher, no rerun on save.
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip
    if config_path is not None:
        argv += ["--", "--config", str(Path(config_path).resolve())]
    return argv
