"""How to compose the loop's adapters, measured on task success over the demo's own panel of goals.

TRACE composes single-capability adapters per task and reports it beating a linear merge and the
best single adapter. After a `bench/demo_loop.py` run (its output directory, with the daemon
stopped), this serves the demo's approved adapters (live, or in canary or approved when its time
ran out: the agent's generalist and the capability-targeted adapters, each capability's newest) from
a router of its own on the demo's settings and runs the model-driven agent over the demo's panel
(the same seeded goals, the same sampling) once per arm:

- ``base``: routing off, the base model alone;
- ``generalist``: the agent's generalist alone, asked for by name;
- ``single:<capability>``: one targeted adapter alone, asked for by name (one arm per adapter);
- ``per_conversation``: all of them live, classifier routing decided on a conversation's first
  user turn and held for the conversation (what the demo serves; the generalist where the
  classifier picks no targeted adapter);
- ``per_request``: the same, but every request classified on its own latest user turn and nothing
  held (``[router] hold_conversations = false``);
- ``merge``: one adapter, PEFT's linear merge of the targeted adapters (of the generalist when
  there is none; the targeted ones already start from it), asked for by name.

Each arm gets a fresh router, so none inherits another's loaded adapters, caches or held
conversations. It prints task success per arm with 95 % Wilson intervals and, paired on the same
goals (each goal's first conversation per arm), each arm against ``base``, each targeted arm against
``generalist`` and ``per_conversation`` against each other arm: the difference with its 95 %
interval and McNemar's exact p, as markdown (and JSON with ``--json``). With ``--repeats 2`` it
also pairs each arm's first pass against its second: the bench's own run-to-run noise.

    python bench/composition.py --demo .tracefix/bench-demo
    python bench/composition.py --demo .tracefix/bench-demo --arms base,per_conversation,per_request --batches 6
    python bench/composition.py --demo .tracefix/bench-demo --arms generalist,per_conversation --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.demo_loop import goal_steps_table  # noqa: E402
from bench.imitation_baseline import Router, load_adapter, open_demo, run_panel, targeted_adapters  # noqa: E402
from examples.demo.panel import MODEL_DRIVEN, PANEL_BATCH, PANEL_BATCHES, Tally  # noqa: E402
from tracefix.daemon.core import generalist as generalists  # noqa: E402
from tracefix.daemon.core import tracks  # noqa: E402
from tracefix.daemon.core.settings import Settings  # noqa: E402
from tracefix.daemon.promotion.lifecycle import served_name  # noqa: E402
from tracefix.daemon.promotion.router_client import RouterAdmin  # noqa: E402
from tracefix.router.routing import adapter_name  # noqa: E402

BASE, GENERALIST, SINGLE, PER_CONVERSATION, PER_REQUEST, MERGE = "base", "generalist", "single", "per_conversation", "per_request", "merge"
MERGED_CAPABILITY = "merge"  # the merged adapter's name in the router: merge@v1
HOLD = "TRACEFIX_ROUTER_HOLD_CONVERSATIONS"


# -- what the demo approved -----------------------------------------------------------------------


def lineup(adapters: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The generalist (the panel agent's newest approved one, else the newest of any agent's, if
    any) and each targeted capability's newest approved adapter, by capability, from
    `targeted_adapters`' rows (oldest first)."""
    newest = {adapter["capability"]: adapter for adapter in adapters}
    found = [adapter for capability, adapter in newest.items() if generalists.is_generalist(capability)]
    ours = generalists.capability(MODEL_DRIVEN)  # the one the router serves the panel's conversations
    generalist = max(found, key=lambda adapter: (adapter["capability"] == ours, adapter["adapter_id"]), default=None)
    targeted = [adapter for capability, adapter in sorted(newest.items()) if not generalists.is_generalist(capability)]
    return generalist, targeted


def available_arms(generalist: dict[str, Any] | None, targeted: list[dict[str, Any]]) -> list[str]:
    """Every arm the demo's adapters make, in the order they run."""
    arms = [BASE] + ([GENERALIST] if generalist else []) + [f"{SINGLE}:{adapter['capability']}" for adapter in targeted]
    return arms + ([PER_CONVERSATION, PER_REQUEST, MERGE] if generalist or targeted else [])


def chosen_arms(requested: str, available: list[str]) -> list[str]:
    """The arms of a comma-separated `--arms` (``single`` is every single arm), in `available`'s
    order; ValueError naming what is not available."""
    names = {name for name in requested.split(",") if name}
    wanted = {arm for arm in available if arm in names or (SINGLE in names and arm.startswith(f"{SINGLE}:"))}
    unknown = sorted(name for name in names - wanted if name != SINGLE)
    if unknown:
        raise ValueError(f"no arm {', '.join(unknown)} on this demo's adapters; available: {', '.join(available)}")
    return [arm for arm in available if arm in wanted]


# -- the merge ------------------------------------------------------------------------------------


def merge_weights(count: int) -> list[float]:
    """PEFT's linear merge sums sqrt(weight × scaling) · A over the adapters, and B alike, into an
    adapter of scaling 1: a weight of 1/count² each makes its A and B the averages of theirs at
    their scaling (the mean of the deltas where the As agree, as they start from the generalist),
    and merging one adapter gives that adapter back."""
    return [1.0 / count**2] * count


def linear_merge(paths: list[Path], weights: list[float], model_dir: Path, directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """PEFT's linear merge (``add_weighted_adapter``, combination "linear") of the adapters at
    `paths` with `weights`, saved at `directory` as one adapter with `manifest` (plus the base
    model's hash); its manifest. The adapters must share a LoRA rank; ValueError otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    from tracefix.trainer.adapters import CONFIG, base_model_hash, load_adapter, save_adapter

    configs = [json.loads((Path(path) / CONFIG).read_text()) for path in paths]
    ranks = [config["r"] for config in configs]
    if len(set(ranks)) != 1:
        raise ValueError(f"a linear merge needs equal LoRA ranks, not {ranks}")
    if any(config.get("use_rslora") for config in configs):
        raise ValueError("a linear merge here takes LoRA scaling alpha / r; these adapters use rsLoRA")
    base_hash = base_model_hash(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inputs = [f"input{index}" for index in range(len(paths))]
    for name, path in zip(inputs, paths, strict=True):
        model = load_adapter(model, Path(path), name, base_hash)
    # save_adapter saves the one adapter named "default": the merge takes that name, the inputs go.
    model.add_weighted_adapter(inputs, weights, adapter_name="default", combination_type="linear")
    model.set_adapter("default")
    for name in inputs:
        model.delete_adapter(name)
    return save_adapter(model, directory, {**manifest, "base_model_hash": base_hash})


def merged_adapter(settings: Settings, inputs: list[dict[str, Any]], output: Path) -> dict[str, Any]:
    """The merge of `inputs` as ``merge@v1`` under `output` (made once; a rerun over the same
    adapters reuses it): its path, what it merged and with which weights."""
    from tracefix.trainer.adapters import read_manifest, verify_adapter
    from tracefix.trainer.model import resolve

    directory = output / MERGED_CAPABILITY / "v1"
    names = [served_name(adapter) for adapter in inputs]
    weights = merge_weights(len(inputs))
    if directory.exists():
        merged = read_manifest(directory).get("merged_from")
        if merged != names:
            raise SystemExit(f"{directory} merges {merged}, not {names}: remove it to merge these")
        verify_adapter(directory)
    else:
        model_dir = resolve(settings.model.name, settings.model_cache_dir)
        manifest = {"capability": MERGED_CAPABILITY, "version": 1, "merged_from": names, "weights": weights, "combination": "linear"}
        try:
            linear_merge([Path(adapter["path"]) for adapter in inputs], weights, model_dir, directory, manifest)
        except ValueError as error:
            raise SystemExit(f"cannot merge {', '.join(names)}: {error}; leave the merge out with --arms") from None
    return {"name": adapter_name(MERGED_CAPABILITY, 1), "path": str(directory), "inputs": names, "weights": weights}


# -- the arms -------------------------------------------------------------------------------------


def serve(admin: RouterAdmin, arm: str, generalist: dict[str, Any] | None, targeted: list[dict[str, Any]], merge: dict[str, Any] | None) -> str:
    """Load what `arm` serves into a fresh router and set its routing; the model name to ask for."""
    if arm == BASE:
        admin.set_routing("off")
        return "base"
    if arm == GENERALIST:
        return load_adapter(admin, generalist)  # type: ignore[arg-type]  # the arm exists only with one
    if arm.startswith(f"{SINGLE}:"):
        capability = arm.partition(":")[2]
        # `single:tool_call_precision` names the capability, or one agent's track of it.
        return load_adapter(admin, next(adapter for adapter in targeted if capability in (adapter["capability"], tracks.capability_of(adapter["capability"]))))
    if arm == MERGE:
        assert merge is not None
        admin.load(merge["name"], MERGED_CAPABILITY, 1, merge["path"], f"linear merge of {', '.join(merge['inputs'])}")
        return merge["name"]
    for adapter in ([generalist] if generalist else []) + targeted:
        load_adapter(admin, adapter)
    admin.set_routing("classifier")
    if admin.routing()["hold_conversations"] != (arm == PER_CONVERSATION):
        raise SystemExit(f"the router for {arm} did not take {HOLD}: is it this checkout's router?")
    return "base"


def run_arm(demo: Path, arm: str, generalist: dict[str, Any] | None, targeted: list[dict[str, Any]], merge: dict[str, Any] | None, repeats: int, batches: int) -> dict[str, Any]:
    """One arm on a router of its own (per_request's holds no conversations): its panel record."""
    with Router(demo, threads=2, variables={HOLD: "false" if arm == PER_REQUEST else "true"}) as router:
        admin = RouterAdmin(router.settings)
        try:
            model = serve(admin, arm, generalist, targeted, merge)
            return run_panel(router, arm, model, repeats, batches)
        finally:
            admin.close()


# -- the comparisons ------------------------------------------------------------------------------


def paired_comparisons(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each arm against base; each targeted arm against the generalist (the method's question: does
    a targeted adapter on top of it do better?); then per_conversation against each other arm. On
    the goals both ran (each goal's first conversation per arm, as the demo pairs its periods): the
    second's task success minus the first's with its 95 % interval and McNemar's exact p."""
    tally = Tally()
    for result in results:
        tally.enter(result["arm"])
        for item in result["outcomes"]:
            tally.add(item["conversation"], item["success"], goal=item["goal"])
    arms = [result["arm"] for result in results]
    pairs = [(BASE, arm) for arm in arms if BASE in arms and arm != BASE]
    pairs += [(GENERALIST, arm) for arm in arms if GENERALIST in arms and arm not in (BASE, GENERALIST, PER_CONVERSATION)]
    pairs += [(arm, PER_CONVERSATION) for arm in arms if PER_CONVERSATION in arms and arm not in (BASE, PER_CONVERSATION)]
    return [comparison for first, second in pairs if (comparison := tally.paired(first, second)) is not None]


def pass_agreement(results: list[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """With `repeats` ≥ 2, each arm's first pass over the panel against its second, paired on the
    same goals as the arms are: how far one arm's runs disagree with each other (the concurrent
    conversations share the backend's batches, so even seeded sampling need not repeat itself).
    A difference between two arms smaller than this is not a difference the bench can see."""
    if repeats < 2:
        return []
    agreement = []
    for result in results:
        size = len(result["outcomes"]) // repeats
        tally = Tally()
        for index, name in enumerate(("pass 1", "pass 2")):
            tally.enter(name)
            for item in result["outcomes"][index * size : (index + 1) * size]:
                tally.add(item["conversation"], item["success"], goal=item["goal"])
        if (comparison := tally.paired("pass 1", "pass 2")) is not None:
            agreement.append({**comparison, "arm": result["arm"], "differ": comparison["after_only"] + comparison["before_only"]})
    return agreement


def best_single(results: list[dict[str, Any]]) -> str | None:
    """The single-adapter arm with the highest task success (the first of equals), if any ran."""
    singles = [result for result in results if result["arm"].startswith(f"{SINGLE}:")]
    return max(singles, key=lambda result: result["rate"])["arm"] if singles else None


def served_text(report: dict[str, Any], arm: dict[str, Any]) -> str:
    """What serves the agent in `arm` (its record), in words."""
    states = report["states"]
    named = lambda name: f"`{name}` ({states.get(name, '?')} in the demo)"  # noqa: E731
    everything = ", ".join(named(name) for name in ([report["generalist"]] if report["generalist"] else []) + report["targeted"])
    name = arm["arm"]
    if name == BASE:
        return "the base model alone (routing off)"
    if name == GENERALIST or name.startswith(f"{SINGLE}:"):
        return f"{named(arm['model'])} alone, by name"
    if name == PER_CONVERSATION:
        return f"{everything}, live; classifier on the first user turn, held per conversation (the generalist where it picks none)"
    if name == PER_REQUEST:
        return f"{everything}, live; classifier on each request's latest user turn, nothing held (`hold_conversations = false`)"
    inputs = (report["merge"] or {}).get("inputs", [])
    if len(inputs) == 1:
        return f"`{arm['model']}`: the merge of `{inputs[0]}` alone, which is that adapter, by name"
    return f"`{arm['model']}`: PEFT's linear merge of {', '.join(f'`{item}`' for item in inputs)} (their LoRA A and B averaged), by name"


def served_table(arms: list[dict[str, Any]]) -> list[str]:
    """Per arm, which models answered its conversations (the router's `model` in each response; a
    routed conversation the classifier sent two ways shows both, in order) and how those
    conversations did, per goal type: where a routed arm won or lost against a single adapter."""
    lines = ["", "| arm | answered by | conversations | task success | per goal: successes/conversations |", "|---|---|---|---|---|"]
    for arm in arms:
        groups: dict[str, list[dict[str, Any]]] = {}
        for item in arm["outcomes"]:
            groups.setdefault(" then ".join(f"`{name}`" for name in item["served_by"]) or "no answer", []).append(item)
        for served, items in sorted(groups.items(), key=lambda group: -len(group[1])):
            goals: dict[str, list[bool]] = {}
            for item in items:
                goals.setdefault(item["progress"]["goal"], []).append(item["success"])
            per_goal = ", ".join(f"{goal} {sum(done)}/{len(done)}" for goal, done in sorted(goals.items()))
            lines.append(f"| {arm['arm']} | {served} | {len(items)} | {sum(item['success'] for item in items)} | {per_goal} |")
    return lines


def paired_cells(item: dict[str, Any]) -> str:
    """A paired comparison's successes, difference with its interval, and McNemar's p, as table cells."""
    low, high = item["interval"]
    return f"{item['before']} → {item['after']} | {item['difference']:+.2f} [{low:+.2f}, {high:+.2f}] | {item['mcnemar_p']:.3f}"


def render(report: dict[str, Any]) -> str:
    lines = [
        "| arm | what serves the model-driven agent | task success on the panel | conversations | seconds |",
        "|---|---|---|---|---|",
    ]
    for arm in report["arms"]:
        low, high = arm["interval"]
        lines.append(
            f"| {arm['arm']} | {served_text(report, arm)} | {arm['rate']:.2f} [{low:.2f}, {high:.2f}] ({arm['successes']}/{arm['conversations']}) "
            f"| {arm['conversations']} | {arm['seconds']:.0f} |"
        )
    lines.append("")
    if report["best_single"]:
        best = next(arm for arm in report["arms"] if arm["arm"] == report["best_single"])
        lines.append(f"Best single adapter: `{best['arm']}` at {best['rate']:.2f}.")
    if report["merge"] and len(report["merge"]["inputs"]) == 1:
        lines.append(f"With one adapter to merge, the merge is {report['merge']['inputs'][0]} itself: a check of the merge, not a composition.")
    if report["paired"]:
        lines += [
            "",
            "Paired on the same goals (each goal's first conversation per arm): the second arm's task success minus the first's.",
            "",
            "| comparison | goals | successes | difference [95 % CI] | McNemar p |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {item['to']} − {item['from']} | {item['goals']} | {paired_cells(item)} |" for item in report["paired"]]
    if report.get("passes"):
        lines += [
            "",
            "Each arm against itself, pass 1 against pass 2 on the same goals (what a difference between arms must exceed):",
            "",
            "| arm | goals | differ | successes | difference [95 % CI] | McNemar p |",
            "|---|---|---|---|---|---|",
        ]
        lines += [f"| {item['arm']} | {item['goals']} | {item['differ']} | {paired_cells(item)} |" for item in report["passes"]]
    lines += ["", "Which models answered each arm's conversations:"] + served_table(report["arms"])
    lines += goal_steps_table({arm["arm"]: arm["goal_steps"] for arm in report["arms"]})
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", type=Path, default=Path(".tracefix/bench-demo"), help="a finished bench/demo_loop.py run's output directory")
    parser.add_argument("--arms", help="comma-separated (default: all): base, generalist, single (every single:<capability>), "
                        "single:<capability>, per_conversation, per_request, merge")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="passes over the panel per arm")
    parser.add_argument("--batches", type=int, default=PANEL_BATCHES, help=f"panel batches of {PANEL_BATCH} goals to run (all {PANEL_BATCHES})")
    parser.add_argument("--json", type=Path, help="also write the report here")
    arguments = parser.parse_args()
    demo = arguments.demo.resolve()
    settings, store = open_demo(parser, demo)
    try:
        adapters = targeted_adapters(store)
    finally:
        store.close()
    generalist, targeted = lineup(adapters)
    available = available_arms(generalist, targeted)
    try:
        arms = chosen_arms(arguments.arms or ",".join(available), available)
    except ValueError as error:
        parser.error(str(error))

    merge = None
    if MERGE in arms:
        merge = merged_adapter(settings, targeted or [generalist], demo / "composition")  # type: ignore[list-item]
    results = []
    for arm in arms:
        started = time.monotonic()
        results.append(run_arm(demo, arm, generalist, targeted, merge, arguments.repeats, arguments.batches))
        print(f"  {arm}: done in {time.monotonic() - started:.0f} s with the router's start", file=sys.stderr, flush=True)
    report = {
        "demo": str(demo), "agent": MODEL_DRIVEN, "batches": arguments.batches, "repeats": arguments.repeats,
        "generalist": served_name(generalist) if generalist else None, "targeted": [served_name(adapter) for adapter in targeted],
        "states": {served_name(adapter): adapter["state"] for adapter in adapters}, "merge": merge,
        "arms": results, "best_single": best_single(results), "paired": paired_comparisons(results),
        "passes": pass_agreement(results, arguments.repeats),
    }  # fmt: skip
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2))
    print(render(report))


if __name__ == "__main__":
    main()
