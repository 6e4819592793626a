"""Targeted adapters against the blunt instrument, on the demo's own panel of seeded goals.

After a `bench/demo_loop.py` run (its output directory, with the daemon stopped), this trains one
adapter by imitation on the deployment's successful conversations, whole (`trainer/imitation.py`),
at the budget the approved capability-targeted adapters had: as many conversations as their episodes
(warm-start demonstrations plus GRPO rollouts), over the warm start's epochs, batch, learning rate
and LoRA shape. It then starts a router of its own on the demo's settings and runs the model-driven
agent over the demo's panel (the same seeded goals, the same sampling), once per arm:

- ``base``: routing off, the base model alone;
- ``targeted``: the demo's approved adapters (live, or in canary or approved when its time ran
  out), all live here, routed by the classifier as in the demo;
- ``imitation``: the imitation adapter, asked for by name.

and prints task success per arm with 95 % Wilson intervals, plus per goal how far the
conversations got, as markdown (and JSON with ``--json``).

    python bench/imitation_baseline.py --demo .tracefix/bench-demo
    python bench/imitation_baseline.py --demo .tracefix/bench-demo --arms imitation --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.demo_loop import free_port, goal_steps_table  # noqa: E402
from examples.demo.panel import MODEL_DRIVEN, PANEL_BATCHES, model_driven  # noqa: E402
from examples.demo.settings import layered_settings  # noqa: E402
from tracefix.daemon.app.supervisor import Supervisor, children  # noqa: E402
from tracefix.daemon.core.intervals import wilson  # noqa: E402
from tracefix.daemon.core.settings import Settings, load_settings  # noqa: E402
from tracefix.daemon.promotion.router_client import RouterAdmin  # noqa: E402
from tracefix.daemon.store.runs import RunStore  # noqa: E402
from tracefix.daemon.store.store import Store, StoreError  # noqa: E402
from tracefix.daemon.store.traces import TrajectoryStore  # noqa: E402
from tracefix.router.protocol import stored_prompt_messages  # noqa: E402
from tracefix.router.routing import adapter_name  # noqa: E402

CAPABILITY = "imitation_baseline"  # the imitation adapter's name in the router: imitation_baseline@v1
ARMS = ("base", "targeted", "imitation")


def demo_settings(demo: Path) -> tuple[Settings, dict[str, str]]:
    """The demo run's settings (its config file under the demo's own defaults) and the variables
    that carry them to a child process."""
    return layered_settings(demo / "demo.toml", fast=False)


def open_demo(parser: argparse.ArgumentParser, demo: Path) -> tuple[Settings, Store]:
    """A finished demo run's settings and its store (the demo's daemon must have stopped: DuckDB
    has one writer); a usage error or a one-line exit when `demo` is not one."""
    if not (demo / "demo.toml").is_file():
        parser.error(f"{demo} holds no demo.toml: pass a bench/demo_loop.py run's --output")
    settings, _ = demo_settings(demo)
    if not settings.store.path.exists():
        raise SystemExit(f"no store at {settings.store.path}: pass a finished bench/demo_loop.py run's --output")
    try:
        return settings, Store(settings.store)
    except StoreError as error:
        raise SystemExit(str(error)) from None


APPROVED = ("live", "canary", "approved")  # an approved adapter not yet live when the demo's time ran out is served live here


def targeted_adapters(store: Store) -> list[dict[str, Any]]:
    """The demo's approved adapters, oldest first: live, or still on their way there."""
    runs = RunStore(store)
    return sorted((item for state in APPROVED for item in runs.adapters(state=state)), key=lambda item: item["adapter_id"])


def episodes_of(adapter: dict[str, Any]) -> int:
    """What one targeted adapter trained on: its warm-start demonstrations plus its GRPO rollouts."""
    from tracefix.trainer.adapters import read_manifest

    metrics = read_manifest(Path(adapter["path"])).get("metrics") or {}
    return int((metrics.get("warm_start") or {}).get("examples", 0)) + int(metrics.get("rollouts") or 0)


def successful_conversations(store: Store, service: str | None, count: int, seed: int) -> tuple[list[list[dict[str, str]]], dict[str, int]]:
    """`count` successful conversations (a seeded sample; repeated in turn when there are fewer),
    rendered as the router renders them, and how many were found, usable and used."""
    trajectories = TrajectoryStore(store)
    items, total = trajectories.list_trajectories(None, None, "success", service, limit=100_000, offset=0)
    usable: list[list[dict[str, str]]] = []
    for item in items:
        record = trajectories.trajectory(item["trajectory_id"])
        try:
            messages = stored_prompt_messages(record["messages"], record["tools"]) if record else []
        except ValueError:
            continue
        if any(message["role"] == "assistant" for message in messages) and messages[0]["role"] == "system":
            usable.append(messages)
    if not usable:
        raise SystemExit(f"no usable successful conversations in the store ({total} successful trajectories)")
    random.Random(seed).shuffle(usable)
    chosen = [usable[index % len(usable)] for index in range(count)]
    return chosen, {"successful": total, "usable": len(usable), "used": count, "distinct": min(count, len(usable))}


def train(settings: Settings, conversations: list[list[dict[str, str]]], output: Path) -> dict[str, Any]:
    """The imitation adapter under `output/adapter` (trained once; a rerun reuses it)."""
    from tracefix.trainer.adapters import verify_adapter
    from tracefix.trainer.imitation import train_imitation
    from tracefix.trainer.model import resolve

    if (output / "adapter").exists():
        return verify_adapter(output / "adapter")
    model_dir = resolve(settings.model.name, settings.model_cache_dir)
    config = settings.training.model_copy(update={"threads": settings.training.threads or settings.model.threads})
    return train_imitation(conversations, model_dir, output, config, CAPABILITY, settings.model.name, progress=_print_progress)


def _print_progress(record: dict[str, Any]) -> None:
    print(f"  imitation update {record['step']}/{record['max_steps']}: loss {record['loss']:.3f} at {record['elapsed_s']:.0f} s", file=sys.stderr, flush=True)


class Router:
    """A router of its own on the demo's settings (fresh port and token, no span export), started
    and stopped by the supervisor `tracefix up` uses; its log is the demo's logs/router.log."""

    def __init__(self, demo: Path, threads: int, variables: dict[str, str] | None = None) -> None:
        """`variables`: further TRACEFIX_* settings of this router (they override the demo's)."""
        _, added = demo_settings(demo)
        port = free_port()
        os.environ.update({
            **added, "TRACEFIX_ROUTER_PORT": str(port), "TRACEFIX_ROUTER_TOKEN": secrets.token_hex(16),
            "TRACEFIX_ROUTER_EXPORT_SPANS": "false", "TRACEFIX_MODEL_THREADS": str(threads), "TRACEFIX_ROUTER_ROUTING": "off",
            **(variables or {}),
        })  # fmt: skip
        self.config = demo / "demo.toml"
        self.settings = load_settings(self.config, dict(os.environ))
        self.url = f"http://127.0.0.1:{port}"
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        self.supervisor = Supervisor(children(self.settings, self.config, ["router"]), say=say)

    def __enter__(self) -> Router:
        self.supervisor.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.supervisor.stop()


def load_adapter(admin: RouterAdmin, adapter: dict[str, Any]) -> str:
    """Load one of the demo's adapters (a row of `targeted_adapters`) live; its served name."""
    name = adapter_name(adapter["capability"], adapter["version"])
    admin.load(name, adapter["capability"], adapter["version"], adapter["path"], adapter["capability"].replace("_", " "))
    return name


def run_arm(router: Router, arm: str, adapters: list[dict[str, Any]], imitation: Path, repeats: int, batches: int) -> dict[str, Any]:
    """The model-driven agent over the panel's first `batches` batches (`repeats` times) with this
    arm serving it."""
    admin = RouterAdmin(router.settings)
    model = "base"
    if arm == "base":
        admin.set_routing("off")
    elif arm == "targeted":
        for adapter in adapters:
            load_adapter(admin, adapter)
        admin.set_routing("classifier")
    else:
        admin.load(f"{CAPABILITY}@v1", CAPABILITY, 1, str(imitation), "imitation of the agent's successful conversations")
        model = f"{CAPABILITY}@v1"
    result = run_panel(router, arm, model, repeats, batches)
    if arm == "imitation":
        admin.unload(model)
    return result


def run_panel(router: Router, arm: str, model: str, repeats: int, batches: int) -> dict[str, Any]:
    """The model-driven agent over the panel's first `batches` batches (`repeats` times), asking
    the router for `model` (the base name lets its routing choose): the arm's task success with its
    95 % Wilson interval, how far each goal got, and each conversation's goal and outcome (with the
    check's explanation and where it stopped, and why: ``examples.airline.progress``)."""
    from examples.airline.progress import step_table
    from examples.airline.runner import run_conversations

    outcomes = []
    started = time.monotonic()
    for repeat in range(repeats):
        for seed in range(batches):
            config = {**model_driven(f"{router.url}/v1", None, router.settings.model.max_new_tokens), "run_id": f"{arm}-{repeat}-{seed}"}
            outcomes += run_conversations(seed=seed, model=model, **config)
            done = sum(outcome.success for outcome in outcomes)
            print(f"  {arm}: {done}/{len(outcomes)} succeeded after panel batch {seed} (pass {repeat + 1})", file=sys.stderr, flush=True)
    successes = sum(outcome.success for outcome in outcomes)
    low, high = wilson(successes, len(outcomes))
    return {
        "arm": arm, "model": model, "conversations": len(outcomes), "successes": successes,
        "rate": successes / len(outcomes) if outcomes else 0.0, "interval": [round(low, 4), round(high, 4)],
        "seconds": round(time.monotonic() - started, 1),
        "goal_steps": step_table(outcome.progress for outcome in outcomes if outcome.progress),
        "outcomes": [
            {"conversation": outcome.conversation_id, "goal": outcome.task_id, "success": outcome.success, "explanation": outcome.explanation,
             "progress": outcome.progress, "served_by": outcome.served_by}
            for outcome in outcomes
        ],
    }  # fmt: skip


def render(report: dict[str, Any]) -> str:
    data, budget = report["data"], report["budget"]
    lines = [
        "| arm | what serves the model-driven agent | task success on the panel |",
        "|---|---|---|",
    ]
    what = {
        "base": "the base model alone (routing off)",
        "targeted": "the demo's capability-targeted adapters: "
        + ", ".join(f"`{name}` ({report['states'][name]} in the demo)" for name in report["targeted"]) + ", all live here (classifier routing)",
        "imitation": f"one adapter trained by imitation on {data['used']} successful conversations ({data['distinct']} distinct)",
    }
    for arm in report["arms"]:
        low, high = arm["interval"]
        lines.append(f"| {arm['arm']} | {what[arm['arm']]} | {arm['rate']:.2f} [{low:.2f}, {high:.2f}] ({arm['successes']}/{arm['conversations']}) |")
    lines += [
        "",
        f"Budget: the targeted adapters trained on {budget['episodes']} episodes ({', '.join(f'{k}: {v}' for k, v in budget['per_adapter'].items())}); "
        f"the imitation adapter on {data['used']} conversations × {report['imitation'].get('epochs')} epochs "
        f"({report['imitation'].get('updates')} updates, {report['imitation'].get('policy_tokens')} policy tokens, "
        f"{report['imitation_seconds'] / 60:.1f} min). Store: {data['successful']} successful trajectories, {data['usable']} usable.",
    ]
    lines += goal_steps_table({arm["arm"]: arm["goal_steps"] for arm in report["arms"]})
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", type=Path, default=Path(".tracefix/bench-demo"), help="a finished bench/demo_loop.py run's output directory")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--examples", type=int, help="conversations to imitate (default: the targeted adapters' episodes)")
    parser.add_argument("--service", help="imitate only this service.name's conversations (default: every agent in the store)")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the panel per arm")
    parser.add_argument("--batches", type=int, default=PANEL_BATCHES, help=f"panel batches of the demo's goals to run (all {PANEL_BATCHES})")
    parser.add_argument("--seed", type=int, default=0, help="which successful conversations are sampled")
    parser.add_argument("--json", type=Path, help="also write the report here")
    arguments = parser.parse_args()
    arms = [arm for arm in arguments.arms.split(",") if arm]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms: {', '.join(sorted(unknown))}")
    demo = arguments.demo.resolve()
    settings, store = open_demo(parser, demo)
    output = demo / "imitation-baseline"
    try:
        adapters = targeted_adapters(store)
        per_adapter = {f"{item['capability']}@v{item['version']}": episodes_of(item) for item in adapters}
        states = {f"{item['capability']}@v{item['version']}": item["state"] for item in adapters}
        episodes = sum(per_adapter.values())
        count = arguments.examples or episodes
        if not count:
            raise SystemExit("no approved adapters in the demo's store to match the budget of; pass --examples")
        conversations, data = successful_conversations(store, arguments.service, count, arguments.seed)
    finally:
        store.close()

    started = time.monotonic()
    manifest = train(settings, conversations, output)
    imitation_seconds = time.monotonic() - started
    results = []
    with Router(demo, threads=2) as router:
        for arm in arms:
            results.append(run_arm(router, arm, adapters, output / "adapter", arguments.repeats, arguments.batches))
    report = {
        "demo": str(demo), "agent": MODEL_DRIVEN, "service": arguments.service, "data": data,
        "budget": {"episodes": episodes, "per_adapter": per_adapter}, "targeted": list(per_adapter), "states": states,
        "imitation": manifest["metrics"]["imitation"], "imitation_seconds": round(imitation_seconds, 1), "arms": results,
    }  # fmt: skip
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2))
    print(render(report))


if __name__ == "__main__":
    main()
