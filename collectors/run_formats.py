"""The run formats `tracefix import` reads (two benchmarks' and plain chat transcripts), each by its own module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tracefix.collectors.agent_runs import AgentRun, RunFormatError, load_tools
from tracefix.collectors.messages_format import read_messages
from tracefix.collectors.tau2_bench import read_tau2_bench
from tracefix.collectors.tau_bench import read_tau_bench

READERS = {"tau-bench": read_tau_bench, "tau2-bench": read_tau2_bench, "messages": read_messages}
FORMATS = tuple(READERS)


def read_runs(path: Path, run_format: str, tools_path: Path | None = None) -> Iterator[AgentRun]:
    """The runs of `path` in `run_format` (one of FORMATS), with tool definitions from `tools_path`
    when the file does not carry them."""
    if run_format not in READERS:
        raise RunFormatError(f"unknown format {run_format!r}; one of: {', '.join(FORMATS)}")
    tools = load_tools(tools_path) if tools_path is not None else None
    return READERS[run_format](path, tools)
