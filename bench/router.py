"""Hot-swap benchmark of the router: a real `tracefix router` process, ≥ 50 concurrent streaming
chat completions, and a new adapter version loaded through ``POST /admin/adapters`` while they stream.

Setup: a temporary directory with a TOML config ([store] path there, [model] the tiny random Llama
with SmolLM2's tokenizer or the embedded SmolLM2-135M, [router] on a free 127.0.0.1 port, routing
``fixed`` on one capability so every request goes to its live version, spans not exported), and
``--swaps`` + 1 versions of that capability made with ``tests/lora_support.make_adapter``. v1 is
loaded, a few requests warm the model up, then each round:

1. ``--streams`` streaming completions (the official ``openai`` client, AsyncOpenAI) start on the
   live version vN; the round waits until every one has its first chunk (its version is leased)
   and a full batch is ``--swap-after-tokens`` tokens in;
2. ``POST /admin/adapters`` loads vN+1 (from a thread, timed there), while probe requests start
   every ``--probe-interval`` seconds until one is answered by vN+1;
3. everything is awaited; ``GET /admin/routing`` is polled until vN is unloaded.

Measured per round (medians over the rounds are the results):
- admin call: how long ``POST /admin/adapters`` took, as the client saw it;
- swap → first served: from sending the admin call to the first SSE chunk whose ``model`` is the
  new version (the router names the version in the first chunk, as soon as the request is routed);
- swap → first new token: to the first content token written by the new version; with the
  embedded backend's static batches this includes the wait behind the requests queued before it;
- in flight at the swap: requests routed before the admin call and not finished when it was sent,
  and how many of them finished on the old version (every chunk's ``model``); "streaming" counts
  those that already had tokens;
- failed: an exception, a non-200, an error event, a stream without ``finish_reason`` or usage,
  or a ``model`` that changed within a stream (target 0);
- old version unloaded: from the admin call until the old version leaves ``/admin/routing``;
- per-token latency: gaps between consecutive content chunks of the load streams, split into gaps
  overlapping the admin call ("during the swap") and the rest; chunks held up during a swap arrive
  in a burst, so the mean and the longest gap say more than the median there.

The router is killed at the end, whatever happens. ``--gate-latency`` afterwards runs
``bench/gate_latency.py`` (the gate's per-token cost against the base and a merged adapter) on the
same model and adds its JSON to the report.

    python bench/router.py --model tiny --threads 1
    python bench/router.py --model smollm2-135m --cache .tracefix/models --threads 1 --swaps 3 --max-tokens 32 --json

On a CPU shared with other work, use ``--threads 1``: with torch's default of every core, a decode
step waits for a descheduled thread and becomes 10-30x slower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import openai  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from tracefix.trainer import model as models  # noqa: E402

CAPABILITY = "swap_bench"
TARGET_SWAP_S = 2.0  # issue 6: admin call to first request served by the new version
TARGET_FAILED = 0
TABLE_WIDTH = 150  # the swap table's columns, unwrapped, also when the output is a file
LONG_PROMPT = [
    {
        "role": "user",
        "content": "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
        "Describe the weather, the sea and every room of the lighthouse. Use at least 400 words.",
    }
]
PROBE_PROMPT = [{"role": "user", "content": "Say hello."}]

stderr = Console(stderr=True)


def log(message: str) -> None:
    stderr.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)


# -- setup ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_model(name: str, cache: Path, directory: Path) -> tuple[str, Path]:
    """(the [model] name for the router's config, the model directory adapters are made for)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    if name == "tiny":
        from transformers import AutoTokenizer

        gguf = models.embedded_gguf()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        path = models.tiny_random_model(directory / "base", tokenizer)
        return str(path), path
    return name, models.resolve(name, cache)


def make_adapters(base_dir: Path, directory: Path, versions: int) -> list[Path]:
    """Versions 1..`versions` of the benchmark's capability, each with its own random LoRA weights."""
    from tests.lora_support import make_adapter

    return [
        make_adapter(base_dir, directory / f"v{version}", CAPABILITY, version, seed=version)
        for version in range(1, versions + 1)
    ]


def write_config(directory: Path, model_name: str, cache: Path, port: int, arguments: argparse.Namespace) -> Path:
    config = directory / "tracefix.toml"
    config.write_text(
        f"[store]\npath = {json.dumps(str(directory / 'tracefix.duckdb'))}\n"
        f"[model]\nname = {json.dumps(model_name)}\ncache_dir = {json.dumps(str(cache))}\nthreads = {arguments.threads}\n"
        f'[router]\nhost = "127.0.0.1"\nport = {port}\nrouting = "fixed"\nfixed_adapter = "{CAPABILITY}"\n'
        f"max_batch = {arguments.max_batch}\nmax_context_tokens = 2048\nexport_spans = false\n"
    )
    return config


class RouterProcess:
    """`python -m tracefix.daemon.app.cli router --config …` with its output in a log file."""

    def __init__(self, directory: Path, config: Path, port: int) -> None:
        self.directory, self.config, self.port = directory, config, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = directory / "router.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> None:
        with self.log_path.open("wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tracefix.daemon.app.cli", "router", "--config", str(self.config)],
                cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the router exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the router did not answer /healthz within {timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def token(self) -> str:
        return (self.directory / "router.token").read_text().strip()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 30 s; the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


# -- one request ----------------------------------------------------------------------------------


@dataclass
class Stream:
    """One streaming completion as the client saw it; times are `time.perf_counter()` seconds."""

    kind: str  # "load" (the concurrent streams) or "probe" (started during the swap)
    sent: float = 0.0
    first_chunk: float | None = None
    first_model: str | None = None
    models: set[str] = field(default_factory=set)
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    ended: float | None = None
    error: str | None = None

    def failure(self) -> str | None:
        """Why this request counts as failed, or None."""
        if self.error is not None:
            return self.error
        if self.finish_reason is None:
            return "stream ended without a finish_reason"
        if self.completion_tokens is None:
            return "stream ended without its usage chunk"
        if len(self.models) != 1:
            return f"model changed within the stream: {sorted(self.models)}"
        return None


async def stream_completion(client: openai.AsyncOpenAI, record: Stream, body: dict[str, Any], timeout_s: float) -> None:
    record.sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            chunks = await client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
            async for chunk in chunks:
                now = time.perf_counter()
                if record.first_chunk is None:
                    record.first_chunk, record.first_model = now, chunk.model
                record.models.add(chunk.model)
                for choice in chunk.choices:
                    if choice.delta.content:
                        record.token_times.append(now)
                    if choice.finish_reason:
                        record.finish_reason = choice.finish_reason
                if chunk.usage is not None:
                    record.completion_tokens = chunk.usage.completion_tokens
    except TimeoutError:
        record.error = f"no complete answer within {timeout_s:.0f} s"
    except Exception as error:  # every failure is counted, none stops the benchmark
        record.error = describe(error, record)
    finally:
        record.ended = time.perf_counter()


def describe(error: BaseException | None, record: Stream) -> str:
    """The error and its causes, and how far the request got."""
    causes = []
    while error is not None and len(causes) < 4:
        causes.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    stage = "before the first chunk" if record.first_chunk is None else f"after {len(record.token_times)} tokens"
    return f"{' <- '.join(causes)} ({stage}, {time.perf_counter() - record.sent:.2f} s after sending)"


def request_body(messages: list[dict[str, str]], max_tokens: int, seed: int) -> dict[str, Any]:
    # model "base" with routing fixed: the router picks the capability's live version
    return {"model": "base", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed}


async def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if condition():
            return True
        await asyncio.sleep(poll_s)
    return condition()


# -- one swap -------------------------------------------------------------------------------------


@dataclass
class AdminCall:
    sent: float = 0.0
    done: float = 0.0
    status: int = 0
    body: Any = None


def admin_client(router: RouterProcess) -> httpx.Client:
    """The admin API's client, built once: building one (its SSL context) costs more than the call on
    a busy CPU. No keep-alive, so every call opens its own loopback connection, as the daemon's does."""
    return httpx.Client(
        base_url=router.url, headers={"Authorization": f"Bearer {router.token}"}, timeout=120,
        limits=httpx.Limits(max_keepalive_connections=0),
    )  # fmt: skip


def load_adapter(admin: httpx.Client, version: int, path: Path, call: AdminCall) -> None:
    """POST /admin/adapters, timed on this thread (the event loop is busy with the streams)."""
    body = {"capability": CAPABILITY, "version": version, "path": str(path), "description": "hot-swap benchmark"}
    call.sent = time.perf_counter()
    try:
        response = admin.post("/admin/adapters", json=body)
        call.status = response.status_code
        call.body = response.json() if response.headers.get("content-type", "").startswith("application/json") else response.text
    except httpx.HTTPError as error:
        call.body = f"{type(error).__name__}: {error}"
    finally:
        call.done = time.perf_counter()


async def watch_retirement(url: str, token: str, old: str, call: AdminCall, timeout_s: float) -> dict[str, Any]:
    """The old version's in-flight count just after the swap, and when it leaves /admin/routing."""
    seen: dict[str, Any] = {"in_flight_after_swap": None, "unloaded_after_s": None}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=10) as client:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if call.done:
                try:
                    response = await client.get(f"{url}/admin/routing", headers=headers)
                    adapters = {item["name"]: item for item in response.json()["adapters"]}
                except (httpx.HTTPError, ValueError, KeyError) as error:
                    seen["error"] = f"{type(error).__name__}: {error}"
                    await asyncio.sleep(0.05)
                    continue
                if old not in adapters:
                    seen["unloaded_after_s"] = time.perf_counter() - call.sent
                    seen.setdefault("in_flight_after_swap", 0)
                    return seen
                if seen["in_flight_after_swap"] is None:
                    seen["in_flight_after_swap"] = adapters[old]["in_flight"]
            await asyncio.sleep(0.05)
    return seen


async def swap_round(
    client: openai.AsyncOpenAI, admin_api: httpx.Client, router: RouterProcess, old: int, new: int, adapter: Path,
    arguments: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    old_name, new_name = f"{CAPABILITY}@v{old}", f"{CAPABILITY}@v{new}"
    started = time.perf_counter()
    timeout_s = arguments.request_timeout
    loads = [Stream("load") for _ in range(arguments.streams)]
    tasks = [
        asyncio.create_task(
            stream_completion(client, record, request_body(LONG_PROMPT, arguments.max_tokens, 1000 * new + index), timeout_s)
        )
        for index, record in enumerate(loads)
    ]
    # Swap once every stream holds its version and the first batch is well into its tokens.
    tokens_first = max(1, min(arguments.swap_after_tokens, arguments.max_tokens // 2))
    # The first batch may hold a single request (whatever had arrived when the generation thread
    # woke), so wait for a full batch's worth of streams with tokens.
    batch = min(arguments.max_batch, arguments.streams // 2 or 1)
    streaming = await wait_until(
        lambda: all(record.first_chunk or record.ended for record in loads)
        and sum(len(record.token_times) >= tokens_first for record in loads) >= batch,
        timeout_s,
    )
    if not streaming:
        log("[yellow]the streams did not start in time; swapping anyway[/yellow]")
    call = AdminCall()
    admin = asyncio.create_task(asyncio.to_thread(load_adapter, admin_api, new, adapter, call))
    retirement = asyncio.create_task(watch_retirement(router.url, router.token, old_name, call, timeout_s))
    probes: list[Stream] = []

    def probe() -> None:
        record = Stream("probe")
        probes.append(record)
        body = request_body(PROBE_PROMPT, arguments.probe_tokens, 1000 * new + 500 + len(probes))
        tasks.append(asyncio.create_task(stream_completion(client, record, body, timeout_s)))

    # While the admin call runs, a probe every interval (each one queues for a batch slot, hence the
    # cap); once it has returned, until a probe is routed to the new version.
    while not admin.done():
        if len(probes) < arguments.max_probes:
            probe()
        await asyncio.sleep(arguments.probe_interval)
    probe_deadline = time.perf_counter() + arguments.probe_window
    while time.perf_counter() < probe_deadline and not any(record.first_model == new_name for record in probes):
        if not any(record.first_chunk is None and record.ended is None and record.sent > call.done for record in probes):
            probe()  # one outstanding probe at a time once the swap is done
        await asyncio.sleep(arguments.probe_interval)
    await admin
    await asyncio.gather(*tasks)
    retired = await retirement
    return summarize_round(old_name, new_name, loads, probes, call, retired, time.perf_counter() - started, streaming)


def summarize_round(
    old: str, new: str, loads: list[Stream], probes: list[Stream], call: AdminCall, retired: dict[str, Any],
    seconds: float, streaming: bool,
) -> dict[str, Any]:  # fmt: skip
    records = loads + probes
    failures = [f"{record.kind}: {reason}" for record in records if (reason := record.failure()) is not None]
    on_new = [record for record in records if record.first_model == new]
    in_flight = [
        record for record in records
        if record.first_chunk is not None and record.first_chunk < call.sent and (record.ended or 0) > call.sent
    ]  # fmt: skip
    gaps_during, gaps_outside = [], []
    for record in loads:
        for previous, current in zip(record.token_times, record.token_times[1:]):
            overlaps = previous < call.done and current > call.sent
            (gaps_during if overlaps else gaps_outside).append((current - previous) * 1000)
    tokens = [record.completion_tokens for record in loads if record.completion_tokens is not None]
    probe_ms = [(record.first_chunk - record.sent) * 1000 for record in probes if record.first_chunk is not None]
    first_served = min((record.first_chunk for record in on_new if record.first_chunk is not None), default=None)
    first_token = min((record.token_times[0] for record in on_new if record.token_times), default=None)
    return {
        "from": old,
        "to": new,
        "admin_status": call.status,
        "admin_replaced": call.body.get("replaced") if isinstance(call.body, dict) else call.body,
        "admin_s": call.done - call.sent,
        "swap_to_first_served_s": None if first_served is None else first_served - call.sent,
        "swap_to_first_new_token_s": None if first_token is None else first_token - call.sent,
        "requests": len(records),
        "probes": len(probes),
        "failed": len(failures),
        "failures": failures[:10],
        "in_flight_at_swap": len(in_flight),
        "streaming_at_swap": sum(1 for record in in_flight if record.token_times and record.token_times[0] < call.sent),
        "in_flight_finished_on_old": sum(1 for record in in_flight if record.models == {old} and record.failure() is None),
        "old_in_flight_after_swap": retired["in_flight_after_swap"],
        "old_unloaded_after_s": retired["unloaded_after_s"],
        "served_by_new": len(on_new),
        "probe_first_chunk_ms": statistics.median(probe_ms) if probe_ms else None,
        "longest_gap_during_swap_ms": max(gaps_during, default=None),
        "mean_completion_tokens": statistics.fmean(tokens) if tokens else None,
        "streams_started_before_swap": streaming,
        "round_s": seconds,
        "gaps_ms": {"during": gaps_during, "outside": gaps_outside},
    }


# -- the whole run --------------------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def median(values: list[Any]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


async def run_swaps(
    router: RouterProcess, admin_api: httpx.Client, adapters: list[Path], arguments: argparse.Namespace, deadline: float
) -> list[dict[str, Any]]:
    """Load v1's successors one swap at a time under load; stops early when the time limit is near."""
    client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=arguments.request_timeout)
    try:
        warm = [Stream("warm-up") for _ in range(arguments.max_batch)]
        await asyncio.gather(*(
            stream_completion(client, record, request_body(PROBE_PROMPT, 4, index), arguments.request_timeout)
            for index, record in enumerate(warm)
        ))  # fmt: skip
        if any(record.failure() for record in warm):
            raise RuntimeError(f"warm-up requests failed: {[record.failure() for record in warm]}")
        rounds = []
        for old in range(1, len(adapters)):
            if rounds and time.monotonic() + 1.5 * max(entry["round_s"] for entry in rounds) > deadline:
                log(f"[yellow]--time-limit reached; stopping after {len(rounds)} swaps[/yellow]")
                break
            result = await swap_round(client, admin_api, router, old, old + 1, adapters[old], arguments)
            rounds.append(result)
            log(
                f"swap v{old}→v{old + 1}: admin {result['admin_s']:.3f} s, first served on v{old + 1} after "
                f"{_seconds(result['swap_to_first_served_s'])}, failed {result['failed']}, "
                f"in flight {result['in_flight_at_swap']} (finished on v{old}: {result['in_flight_finished_on_old']}), "
                f"round {result['round_s']:.1f} s"
            )
        return rounds
    finally:
        await client.close()


def report(rounds: list[dict[str, Any]], arguments: argparse.Namespace, machine: dict[str, Any]) -> dict[str, Any]:
    during = [gap for entry in rounds for gap in entry["gaps_ms"]["during"]]
    outside = [gap for entry in rounds for gap in entry["gaps_ms"]["outside"]]
    medians = {
        key: median([entry[key] for entry in rounds])
        for key in (
            "admin_s", "swap_to_first_served_s", "swap_to_first_new_token_s", "in_flight_at_swap", "streaming_at_swap",
            "in_flight_finished_on_old", "old_unloaded_after_s", "failed", "round_s", "mean_completion_tokens",
            "probe_first_chunk_ms", "longest_gap_during_swap_ms",
        )
    }  # fmt: skip
    failed = sum(entry["failed"] for entry in rounds)
    served = medians["swap_to_first_served_s"]
    return {
        "model": arguments.model,
        "streams": arguments.streams,
        "max_tokens": arguments.max_tokens,
        "max_batch": arguments.max_batch,
        "probe_interval_s": arguments.probe_interval,
        "machine": machine,
        "swaps": [{key: value for key, value in entry.items() if key != "gaps_ms"} for entry in rounds],
        "medians": medians,
        "failed_total": failed,
        "requests_total": sum(entry["requests"] for entry in rounds),
        "per_token_ms": {
            name: {
                "p50": percentile(gaps, 0.5), "p95": percentile(gaps, 0.95), "max": max(gaps, default=None),
                "mean": statistics.fmean(gaps) if gaps else None, "gaps": len(gaps),
            }  # fmt: skip
            for name, gaps in (("during_swap", during), ("outside_swap", outside))
        },
        "targets": {
            "swap_to_first_served_s": {"target": TARGET_SWAP_S, "met": served is not None and served <= TARGET_SWAP_S},
            "failed_requests": {"target": TARGET_FAILED, "met": bool(rounds) and failed == TARGET_FAILED},
        },
    }


def _seconds(value: float | None) -> str:
    return "—" if value is None or value < 0 else f"{value:.3f}"


def print_tables(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"Hot swap under {result['streams']} concurrent streams — {result['model']}, "
        f"max_tokens {result['max_tokens']}, max_batch {result['max_batch']}"
    )
    for column in (
        "swap", "admin call s", "→ first served s", "→ first new token s", "in flight", "streaming",
        "finished on old", "failed / requests", "old unloaded s", "round s",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "swap" else "right")
    for entry in result["swaps"]:
        table.add_row(
            f"{entry['from'].split('@')[1]}→{entry['to'].split('@')[1]}",
            _seconds(entry["admin_s"]), _seconds(entry["swap_to_first_served_s"]), _seconds(entry["swap_to_first_new_token_s"]),
            str(entry["in_flight_at_swap"]), str(entry["streaming_at_swap"]), str(entry["in_flight_finished_on_old"]),
            f"{entry['failed']} / {entry['requests']}", _seconds(entry["old_unloaded_after_s"]), f"{entry['round_s']:.1f}",
        )  # fmt: skip
    m = result["medians"]
    table.add_row(
        "[bold]median[/bold]",
        _seconds(m["admin_s"]), f"[bold]{_seconds(m['swap_to_first_served_s'])}[/bold]", _seconds(m["swap_to_first_new_token_s"]),
        f"{m['in_flight_at_swap']:g}" if m["in_flight_at_swap"] is not None else "—",
        f"{m['streaming_at_swap']:g}" if m["streaming_at_swap"] is not None else "—",
        f"{m['in_flight_finished_on_old']:g}" if m["in_flight_finished_on_old"] is not None else "—",
        f"[bold]{result['failed_total']}[/bold] / {result['requests_total']}", _seconds(m["old_unloaded_after_s"]),
        f"{m['round_s']:.1f}" if m["round_s"] is not None else "—",
    )  # fmt: skip
    console.print(table)
    latency = Table(title="Per-token latency of the load streams (gap between content chunks, ms)")
    for column in ("", "p50", "p95", "max", "mean", "gaps"):
        latency.add_column(column, justify="right" if column else "left")
    for name, values in result["per_token_ms"].items():
        row = [_ms(values[key]) for key in ("p50", "p95", "max", "mean")]
        latency.add_row(name.replace("_", " "), *row, str(values["gaps"]))
    console.print(latency)
    notes = m["probe_first_chunk_ms"], m["longest_gap_during_swap_ms"]
    console.print(
        f"median probe latency to its first chunk (the floor under → first served): {_ms(notes[0])} ms; "
        f"longest token gap overlapping an admin call (median over swaps): {_ms(notes[1])} ms"
    )
    for name, target in result["targets"].items():
        verdict = "[green]met[/green]" if target["met"] else "[red]missed[/red]"
        console.print(f"target {name} ≤ {target['target']}: {verdict}")
    if "gate_latency" in result:
        gate = result["gate_latency"]
        console.print(f"gate latency (bench/gate_latency.py): ratio to base {gate.get('ratio_to_base')}")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def gate_latency(arguments: argparse.Namespace) -> dict[str, Any]:
    """bench/gate_latency.py on the same model, run after the router has stopped."""
    command = [sys.executable, str(REPO / "bench" / "gate_latency.py"), "--model", arguments.model]
    command += ["--cache", str(arguments.cache)]
    if arguments.threads:
        command += ["--threads", str(arguments.threads)]
    output = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=arguments.time_limit, check=False)
    if output.returncode != 0:
        return {"error": output.stderr.strip().splitlines()[-1:] or [f"exit {output.returncode}"]}
    return json.loads(output.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    import torch

    return {
        "platform": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_before": [round(value, 2) for value in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help='"tiny" (2-layer random Llama), "smollm2-135m" or a model directory')
    parser.add_argument("--cache", type=Path, default=REPO / ".tracefix" / "models", help="converted-model cache")
    parser.add_argument("--streams", type=int, default=50, help="concurrent streaming requests per swap")
    parser.add_argument("--max-tokens", type=int, default=48, help="max_tokens of each of those streams")
    parser.add_argument("--swaps", type=int, default=5, help="hot swaps, v1→v2, v2→v3, …")
    parser.add_argument("--swap-after-tokens", type=int, default=8, help="swap once a stream has this many tokens")
    parser.add_argument("--max-batch", type=int, default=8, help="[router] max_batch")
    parser.add_argument("--threads", type=int, default=0, help="[model] threads of the router; 0 = all cores")
    parser.add_argument("--probe-interval", type=float, default=0.1, help="seconds between probe requests during a swap")
    parser.add_argument("--probe-tokens", type=int, default=1, help="max_tokens of a probe request")
    parser.add_argument("--probe-window", type=float, default=30.0, help="after the admin call, probe this long at most")
    parser.add_argument("--max-probes", type=int, default=200, help="at most this many probes while the admin call runs")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="a request without its answer by then fails")
    parser.add_argument("--time-limit", type=float, default=900.0, help="no new swap starts after this many seconds")
    parser.add_argument("--gate-latency", action="store_true", help="also run bench/gate_latency.py on the model")
    parser.add_argument("--router-log", type=Path, help="copy the router's log here at the end")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout (the tables go to stderr)")
    arguments = parser.parse_args()
    if arguments.streams < 1 or arguments.swaps < 1:
        parser.error("--streams and --swaps must be at least 1")
    deadline = time.monotonic() + arguments.time_limit
    about = machine()

    with tempfile.TemporaryDirectory(prefix="tracefix-router-bench-") as temporary:
        directory = Path(temporary)
        log(f"model {arguments.model}: preparing the base model and {arguments.swaps + 1} adapter versions")
        model_name, base_dir = base_model(arguments.model, arguments.cache.resolve(), directory)
        adapters = make_adapters(base_dir, directory / "adapters", arguments.swaps + 1)
        port = free_port()
        router = RouterProcess(directory, write_config(directory, model_name, arguments.cache.resolve(), port, arguments), port)
        try:
            log(f"starting tracefix router on 127.0.0.1:{port}")
            router.start(timeout_s=180)
            with admin_client(router) as admin_api:
                first = AdminCall()
                load_adapter(admin_api, 1, adapters[0], first)
                if first.status != 200:
                    raise RuntimeError(f"loading v1 failed ({first.status}): {first.body}")
                log(f"v1 live; {arguments.swaps} swaps under {arguments.streams} concurrent streams")
                rounds = asyncio.run(run_swaps(router, admin_api, adapters, arguments, deadline))
        except RuntimeError as error:
            log(f"[red]{error}[/red]")
            raise SystemExit(1) from None
        finally:
            status = router.stop()
            if status not in (0, None):
                log(f"[yellow]the router exited with {status}[/yellow]")
            traceback = "Traceback" in router.log_tail(400)
            if arguments.router_log is not None:
                shutil.copyfile(router.log_path, arguments.router_log)
            if traceback:
                log(f"[red]the router's log holds a traceback:[/red]\n{router.log_tail(60)}")
    about["load_average_after"] = [round(value, 2) for value in os.getloadavg()]
    result = report(rounds, arguments, about)
    result["router_exit_status"], result["router_log_traceback"] = status, traceback
    if arguments.gate_latency:
        log("running bench/gate_latency.py")
        result["gate_latency"] = gate_latency(arguments)
    if arguments.json:
        print_tables(result, Console(stderr=True, width=max(stderr.width, TABLE_WIDTH)))
        print(json.dumps(result, default=float))
    else:
        console = Console()
        print_tables(result, Console(width=max(console.width, TABLE_WIDTH)))


if __name__ == "__main__":
    main()
