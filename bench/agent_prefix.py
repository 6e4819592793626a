"""The example airline agent's conversations through a real `tracefix router` (embedded backend),
with the router's prefix cache ([router] prefix_cache_mib) on vs off: the same seeded customers,
the model-driven policy, no spans exported.

    python bench/agent_prefix.py                                # 8 conversations, 4 at once, 1 thread
    python bench/agent_prefix.py --conversations 12 --repeats 3 --threads 1

Prints per setting the median seconds of the run, conversations per minute, and the ratio. That the
cache changes no answer is checked token for token by tests/test_prefix_cache.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.router import RouterProcess, free_port  # noqa: E402
from examples.airline.runner import RunConfig, run_conversations  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=".tracefix/models")
    arguments = parser.parse_args()

    seconds: dict[int, list[float]] = {0: [], 1024: []}
    with tempfile.TemporaryDirectory() as temporary:
        for repeat in range(arguments.repeats):
            for mib in (0, 1024):
                directory = Path(temporary) / f"{mib}-{repeat}"
                directory.mkdir()
                port = free_port()
                config = directory / "tracefix.toml"
                config.write_text(
                    f'[store]\npath = "{directory / "tracefix.duckdb"}"\n'
                    f'[model]\nname = "{arguments.model}"\ncache_dir = "{Path(arguments.cache).resolve()}"\nthreads = {arguments.threads}\n'
                    f'[router]\nhost = "127.0.0.1"\nport = {port}\nrouting = "off"\nexport_spans = false\nprefix_cache_mib = {mib}\n'
                )
                router = RouterProcess(directory, config, port)
                router.start(timeout_s=300)
                try:
                    run = run_conversations(
                        RunConfig(
                            router=f"{router.url}/v1", collector="", conversations=arguments.conversations, rate=0.0,
                            seed=11 + repeat, policy="llm", max_tokens=arguments.max_tokens, concurrency=arguments.concurrency,
                        )
                    )  # fmt: skip
                finally:
                    router.stop()
                seconds[mib].append(run.seconds)
                print(f"repeat {repeat}, prefix cache {mib} MiB: {run.summary()}", flush=True)
    plain, cached = statistics.median(seconds[0]), statistics.median(seconds[1024])
    print(f"{arguments.conversations} conversations, {arguments.concurrency} at once, {arguments.model}, {arguments.threads} thread(s), {arguments.repeats} repeats")
    print("| prefix cache | s per run (median) | conversations per minute | ratio |")
    print("|---|---|---|---|")
    print(f"| off | {plain:.1f} | {60 * arguments.conversations / plain:.2f} | |")
    print(f"| on (1024 MiB) | {cached:.1f} | {60 * arguments.conversations / cached:.2f} | {plain / cached:.2f}× |")


if __name__ == "__main__":
    main()
