"""What the environment-family tests share: the fixture tool sets and a fresh interpreter to check
that an instance is the same in another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainer.environment import Tool, load_tools

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "tools"


def load_tool_set(name: str) -> list[Tool]:
    """The fixture tool set `name` (``airline``, ``retail``)."""
    return load_tools(json.loads((FIXTURES / f"{name}.json").read_text()))


TOOL_SETS = {name: load_tool_set(name) for name in ("airline", "retail")}


def run_in_another_process(script: str) -> str:
    """The stdout of `script` run by a fresh interpreter with another hash seed (``hash()`` must not leak in)."""
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
