"""The example airline agent's conversations through a real `tracefix router` (embedded backend),
two router settings side by side: the prefix cache ([router] prefix_cache_mib) off vs on, or
(``--compare batching``) static vs continuous batching ([router] continuous_batching). The same
seeded customers, the model-driven policy, no spans exported; the two settings alternate within
each repeat, so both see the same machine.

    python bench/agent_prefix.py                                # 8 conversations, 4 at once, 1 thread
    python bench/agent_prefix.py --conversations 12 --repeats 3 --threads 1
    python bench/agent_prefix.py --compare batching --conversations 8 --concurrency 2 --repeats 3

Prints per setting the median seconds of the run, conversations per minute, and the ratio. That
neither setting changes an answer is checked token for token by tests/test_prefix_cache.py and
tests/test_continuous_batching.py.
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


# What is compared: (label, [router] setting) for the baseline, then for the other.
COMPARISONS = {
    "prefix_cache": (("prefix cache off", "prefix_cache_mib = 0"), ("prefix cache on (1024 MiB)", "prefix_cache_mib = 1024")),
    "batching": (("static batches", "continuous_batching = false"), ("continuous batching", "continuous_batching = true")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="prefix_cache")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cache", default=".tracefix/models")
    arguments = parser.parse_args()

    settings = COMPARISONS[arguments.compare]
    seconds: dict[str, list[float]] = {label: [] for label, _ in settings}
    with tempfile.TemporaryDirectory() as temporary:
        for repeat in range(arguments.repeats):
            for index, (label, setting) in enumerate(settings):
                directory = Path(temporary) / f"{index}-{repeat}"
                directory.mkdir()
                port = free_port()
                config = directory / "tracefix.toml"
                config.write_text(
                    f'[store]\npath = "{directory / "tracefix.duckdb"}"\n'
                    f'[model]\nname = "{arguments.model}"\ncache_dir = "{Path(arguments.cache).resolve()}"\nthreads = {arguments.threads}\n'
                    f'[router]\nhost = "127.0.0.1"\nport = {port}\nrouting = "off"\nexport_spans = false\n{setting}\n'
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
                seconds[label].append(run.seconds)
                print(f"repeat {repeat}, {label}: {run.summary()}", flush=True)
    (baseline, _), (other, _) = settings
    before, after = statistics.median(seconds[baseline]), statistics.median(seconds[other])
    print(f"{arguments.conversations} conversations, {arguments.concurrency} at once, {arguments.model}, {arguments.threads} thread(s), {arguments.repeats} repeats")
    print("| router | s per run (median) | conversations per minute | ratio |")
    print("|---|---|---|---|")
    print(f"| {baseline} | {before:.1f} | {60 * arguments.conversations / before:.2f} | |")
    print(f"| {other} | {after:.1f} | {60 * arguments.conversations / after:.2f} | {before / after:.2f}× |")


if __name__ == "__main__":
    main()
