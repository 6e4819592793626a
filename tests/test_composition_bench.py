"""``bench/composition.py``'s pieces: the router routing each request on its own when
``[router] hold_conversations`` is false (a routing table over the wide tiny model with real LoRA
adapters, and one conversation through the real HTTP router), PEFT's linear merge of two saved
adapters, and the arms' paired comparisons and report from hand-made results."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.composition import (
    available_arms,
    best_single,
    chosen_arms,
    linear_merge,
    lineup,
    merge_weights,
    paired_comparisons,
    pass_agreement,
    render,
    served_table,
)
from examples.demo.panel import MODEL_DRIVEN
from tracefix.daemon.core import generalist as generalists
from tracefix.daemon.core.intervals import mcnemar_p, paired_difference
from tracefix.router.protocol import ChatRequest
from tracefix.router.routes.chat import latest_user_turn
from tests.conftest import serving_router
from tests.lora_support import make_adapter

DESCRIPTIONS = {"billing": "Questions about invoices, refunds and payments.", "shipping": "Tracking parcels and delivery dates."}
BOTH = [("billing", DESCRIPTIONS["billing"]), ("shipping", DESCRIPTIONS["shipping"])]
PROMPTS = [f"Request {index}: " + words for index, words in enumerate(
    ["my invoice is wrong", "where is my parcel", "I want to send it back", "hello", "refund please",
     "delivery date?", "exchange size", "what is two plus two", "cancel everything", "is it raining"]
)]  # fmt: skip
TOKEN = "composition-test-token"


@pytest.fixture(scope="module")
def adapter(wide_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """The directory of a real adapter `capability` v`version`, made once per module."""
    import peft  # noqa: F401  (installed by make test: never skipped)
    root = tmp_path_factory.mktemp("adapters")
    made: dict[tuple[str, int], Path] = {}

    def directory(capability: str, version: int) -> Path:
        if (capability, version) not in made:
            made[capability, version] = make_adapter(wide_tiny_model, root / capability / f"v{version}", capability, version, 7 * len(made) + version)
        return made[capability, version]

    return directory


def two_prompts(choose: Callable[[str], str | None]) -> tuple[str, str]:
    """Two prompts of `PROMPTS` the classifier sends to different places."""
    choices = {prompt: choose(prompt) for prompt in PROMPTS}
    first = PROMPTS[0]
    second = next((prompt for prompt in PROMPTS if choices[prompt] != choices[first]), None)
    assert second is not None, "the tiny model's classifier sends every prompt to the same place"
    return first, second


# -- [router] hold_conversations ------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(wide_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch  # noqa: F401  (installed by make test: never skipped)
    from tracefix.router.embedded import EmbeddedBackend

    embedded = EmbeddedBackend(str(wide_tiny_model), tmp_path_factory.mktemp("cache"), max_context_tokens=1024)
    yield embedded
    embedded.stop()


@pytest.mark.parametrize("hold", [True, False])
def test_without_holding_conversations_each_request_is_classified_on_its_latest_user_turn(
    backend: Any, adapter: Callable[[str, int], Path], hold: bool
) -> None:
    from tracefix.router.routing import Classifier, RoutingTable

    table = RoutingTable(backend, "classifier", hold_conversations=hold)
    try:
        for capability, description in BOTH:
            table.add(capability, 1, adapter(capability, 1), description)
        classifier = Classifier(backend)
        first, later = two_prompts(lambda prompt: classifier.choose(prompt, BOTH))

        def route(latest: str) -> Any:
            lease = table.acquire(None, first, "c-1", None, latest)
            table.release(lease)
            return lease

        opening = route(first)
        assert (opening.reason, opening.capability) == ("classifier", classifier.choose(first, BOTH))
        moved = route(later)  # the same conversation, its user now asking something else
        if hold:
            assert (moved.reason, moved.capability) == ("held", opening.capability)
        else:
            assert (moved.reason, moved.capability) == ("classifier", classifier.choose(later, BOTH))
            assert moved.capability != opening.capability
        snapshot = table.snapshot()
        assert (snapshot["hold_conversations"], snapshot["held_conversations"]) == (hold, 1 if hold else 0)
    finally:
        for live in table.live():
            table.remove(live.name)
        table.close()


def test_the_latest_user_turn_is_the_last_user_message() -> None:
    chat = ChatRequest.model_validate({"model": "base", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}, {"role": "assistant", "content": "done"},
    ]})  # fmt: skip
    assert (chat.first_user_turn(), latest_user_turn(chat)) == ("first", "second")
    assert latest_user_turn(ChatRequest.model_validate({"model": "base", "messages": [{"role": "system", "content": "x"}]})) is None


def test_the_http_router_with_hold_conversations_false_routes_a_conversation_on_its_latest_turn(
    wide_tiny_model: Path, tmp_path: Path, adapter: Callable[[str, int], Path]
) -> None:
    from tracefix.router.routing import Classifier

    config = tmp_path / "tracefix.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "tracefix.duckdb"}"\n[model]\nname = "{wide_tiny_model}"\n'
        f'[router]\ntoken = "{TOKEN}"\nrouting = "classifier"\nhold_conversations = false\nmax_context_tokens = 1024\nexport_spans = false\n'
    )
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with serving_router(config) as (url, _, backend):
        for capability, description in BOTH:
            body = {"capability": capability, "version": 1, "path": str(adapter(capability, 1)), "description": description}
            assert httpx.post(f"{url}/admin/adapters", json=body, headers=admin, timeout=30).status_code == 200
        classifier = Classifier(backend)
        first, later = two_prompts(lambda prompt: classifier.choose(prompt, BOTH))
        expected = classifier.choose(later, BOTH)
        messages = [{"role": "user", "content": first}, {"role": "assistant", "content": "Go on."}, {"role": "user", "content": later}]
        request = {"model": "base", "messages": messages, "max_tokens": 1, "metadata": {"conversation_id": "c-1"}}
        reply = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == (f"{expected}@v1" if expected else "base")
        routing = httpx.get(f"{url}/admin/routing", headers=admin).json()
        assert (routing["hold_conversations"], routing["held_conversations"]) == (False, 0)


# -- the linear merge -----------------------------------------------------------------------------


def lora_matrices(directory: Path) -> dict[str, Any]:
    """The saved adapter's LoRA tensors, by name, and its scaling (alpha / r) under "scaling"."""
    from safetensors.torch import load_file

    config = json.loads((directory / "adapter_config.json").read_text())
    return {**load_file(directory / "adapter_model.safetensors"), "scaling": config["lora_alpha"] / config["r"]}


def deltas(matrices: dict[str, Any]) -> dict[str, Any]:
    """Each module's LoRA delta: scaling · B @ A."""
    return {
        name.replace(".lora_A.weight", ""): matrices["scaling"] * matrices[name.replace("lora_A", "lora_B")] @ matrices[name]
        for name in matrices
        if name.endswith("lora_A.weight")
    }


def test_the_linear_merge_of_two_adapters_averages_their_lora_matrices(
    wide_tiny_model: Path, adapter: Callable[[str, int], Path], tmp_path: Path
) -> None:
    import torch

    from tracefix.trainer.adapters import base_model_hash, verify_adapter

    inputs = [adapter("billing", 1), adapter("shipping", 1)]
    manifest = {"capability": "merge", "version": 1, "merged_from": ["billing@v1", "shipping@v1"]}
    linear_merge(inputs, merge_weights(2), wide_tiny_model, tmp_path / "merge", manifest)
    saved = verify_adapter(tmp_path / "merge", base_model_hash(wide_tiny_model))
    assert (saved["capability"], saved["version"], saved["merged_from"]) == ("merge", 1, ["billing@v1", "shipping@v1"])

    merged, one, two = lora_matrices(tmp_path / "merge"), lora_matrices(inputs[0]), lora_matrices(inputs[1])
    assert merged["scaling"] == 1.0 and one["scaling"] == two["scaling"]
    average = {name: (one[name] + two[name]) / 2 for name in one if name != "scaling"}
    expected = deltas({**average, "scaling": one["scaling"]})
    got = deltas(merged)
    assert set(got) == set(expected) and len(got) > 0
    for name, delta in got.items():
        assert torch.allclose(delta, expected[name], atol=1e-5), name
    name = next(iter(got))
    assert not torch.allclose(got[name], deltas(one)[name], atol=1e-3)  # the merge is neither input
    assert not torch.allclose(got[name], deltas(two)[name], atol=1e-3)


def test_the_merge_of_one_adapter_is_that_adapter(wide_tiny_model: Path, adapter: Callable[[str, int], Path], tmp_path: Path) -> None:
    import torch

    source = adapter("billing", 1)
    linear_merge([source], merge_weights(1), wide_tiny_model, tmp_path / "merge", {"capability": "merge", "version": 1})
    got, expected = deltas(lora_matrices(tmp_path / "merge")), deltas(lora_matrices(source))
    assert set(got) == set(expected)
    assert all(torch.allclose(got[name], expected[name], atol=1e-5) for name in got)


# -- arms, paired comparisons and the report ------------------------------------------------------


def row(capability: str, version: int, state: str, adapter_id: int) -> dict[str, Any]:
    return {"adapter_id": adapter_id, "capability": capability, "version": version, "state": state, "path": f"/a/{capability}/v{version}"}


def test_the_lineup_takes_each_capabilitys_newest_adapter_and_the_arms_follow_from_it() -> None:
    ours = generalists.capability(MODEL_DRIVEN)
    rows = [row(ours, 1, "live", 1), row("tool_args", 1, "live", 2), row("refunds", 1, "live", 3), row("tool_args", 2, "canary", 4),
            row("generalist.hotel", 1, "live", 5)]  # fmt: skip
    generalist, targeted = lineup(rows)
    assert generalist is not None and (generalist["capability"], generalist["version"]) == (ours, 1)  # the panel agent's
    assert [(item["capability"], item["version"]) for item in targeted] == [("refunds", 1), ("tool_args", 2)]
    available = available_arms(generalist, targeted)
    assert available == ["base", "generalist", "single:refunds", "single:tool_args", "per_conversation", "per_request", "merge"]
    assert chosen_arms("merge,single,base", available) == ["base", "single:refunds", "single:tool_args", "merge"]
    with pytest.raises(ValueError, match="single:nope"):
        chosen_arms("base,single:nope", available)
    assert available_arms(None, []) == ["base"]


def arm(name: str, model: str, successes: list[bool], goals: list[str] | None = None, served: list[list[str]] | None = None) -> dict[str, Any]:
    """A hand-made arm record as `run_panel` returns it: one conversation per goal g0, g1, … (goals of
    type cancel, then change, alternately), each answered by `model` unless `served` says otherwise."""
    goals = goals or [f"g{index}" for index in range(len(successes))]
    served = served or [[model]] * len(successes)
    outcomes = [
        {"conversation": f"{name}-{index}", "goal": goal, "success": success, "progress": {"goal": ("cancel", "change")[index % 2]}, "served_by": by}
        for index, (goal, success, by) in enumerate(zip(goals, successes, served, strict=True))
    ]
    count = sum(successes)
    return {"arm": name, "model": model, "conversations": len(successes), "successes": count, "rate": count / len(successes),
            "interval": [0.1, 0.9], "seconds": 12.0, "goal_steps": [], "outcomes": outcomes}  # fmt: skip


def hand_made() -> dict[str, Any]:
    base = arm("base", "base", [False] * 6 + [True] * 2)
    single_a = arm("single:refunds", "refunds@v1", [True] * 3 + [False] * 5)
    single_b = arm("single:tool_args", "tool_args@v2", [True] * 4 + [False] * 4)
    # A second conversation of g0 that fails: only each goal's first conversation is paired.
    per_conversation = arm("per_conversation", "base", [True] * 6 + [False] * 2 + [False], [f"g{index}" for index in range(8)] + ["g0"])
    merge = arm("merge", "merge@v1", [True] + [False] * 7)
    results = [base, single_a, single_b, per_conversation, merge]
    return {
        "demo": "/d", "agent": "airline", "batches": 2, "repeats": 1, "generalist": None, "targeted": ["refunds@v1", "tool_args@v2"],
        "states": {"refunds@v1": "live", "tool_args@v2": "canary"}, "arms": results, "best_single": best_single(results),
        "merge": {"name": "merge@v1", "path": "/m", "inputs": ["refunds@v1", "tool_args@v2"], "weights": [0.25, 0.25]},
        "paired": paired_comparisons(results),
    }  # fmt: skip


def test_each_arm_is_paired_with_base_and_per_conversation_with_each_other_arm_on_each_goals_first_conversation() -> None:
    report = hand_made()
    paired = {(item["from"], item["to"]): item for item in report["paired"]}
    assert list(paired) == [
        ("base", "single:refunds"), ("base", "single:tool_args"), ("base", "per_conversation"), ("base", "merge"),
        ("single:refunds", "per_conversation"), ("single:tool_args", "per_conversation"), ("merge", "per_conversation"),
    ]  # fmt: skip
    # per_conversation succeeds on g0…g5 (its second g0 failure is not paired), base on g6 and g7.
    item = paired["base", "per_conversation"]
    assert (item["goals"], item["before"], item["after"], item["after_only"], item["before_only"]) == (8, 2, 6, 6, 2)
    delta, low, high = paired_difference(6, 2, 0, 0)
    assert item["difference"] == round(delta, 4) == 0.5
    assert item["interval"] == [round(low, 4), round(high, 4)]
    assert item["mcnemar_p"] == round(mcnemar_p(6, 2), 4)
    against_merge = paired["merge", "per_conversation"]  # merge succeeds on g0 only, which per_conversation shares
    assert (against_merge["after_only"], against_merge["before_only"], against_merge["difference"]) == (5, 0, 0.625)
    assert report["best_single"] == "single:tool_args"


def test_with_a_generalist_each_targeted_arm_is_paired_with_it_once() -> None:
    generalist = arm("generalist", "generalist.airline@v1", [True, True, False, False, False, False])
    single = arm("single:refunds", "refunds@v1", [True, False, True, True, True, False])
    merge = arm("merge", "merge@v1", [False] * 6)
    per_conversation = arm("per_conversation", "generalist.airline@v1", [True, True, True, False, False, False])
    paired = {(item["from"], item["to"]): item for item in paired_comparisons([generalist, single, merge, per_conversation])}
    assert list(paired) == [
        ("generalist", "single:refunds"), ("generalist", "merge"),
        ("generalist", "per_conversation"), ("single:refunds", "per_conversation"), ("merge", "per_conversation"),
    ]  # fmt: skip
    item = paired["generalist", "single:refunds"]  # won g2, g3, g4; lost g1
    assert (item["before"], item["after"], item["after_only"], item["before_only"]) == (2, 4, 3, 1)
    assert item["mcnemar_p"] == round(mcnemar_p(3, 1), 4)


def test_the_report_names_each_arm_the_best_single_adapter_and_the_paired_differences() -> None:
    report = hand_made()
    text = render(report)
    assert "| single:tool_args | `tool_args@v2` (canary in the demo) alone, by name | 0.50 [0.10, 0.90] (4/8) | 8 | 12 |" in text
    assert "| per_conversation | `refunds@v1` (live in the demo), `tool_args@v2` (canary in the demo), live;" in text
    assert "linear merge of `refunds@v1`, `tool_args@v2`" in text
    assert "Best single adapter: `single:tool_args` at 0.50." in text
    assert "| per_conversation − base | 8 | 2 → 6 | +0.50 [" in text
    assert "the merge is" not in text  # two adapters were merged

    report["merge"]["inputs"] = ["refunds@v1"]
    assert "the merge is refunds@v1 itself" in render(report)


def test_the_report_says_which_models_answered_each_arms_conversations_and_how_they_did_per_goal() -> None:
    generalist, adapter = "generalist.airline@v1", "refunds@v1"
    # Routed per conversation: the classifier sent g0, g1, g3 to the adapter, g2 to the generalist,
    # and g4's conversation to the generalist first and then the adapter.
    routed = arm("per_conversation", "base", [True, False, False, True, True],
                 served=[[adapter], [adapter], [generalist], [adapter], [generalist, adapter]])  # fmt: skip
    lines = served_table([arm("generalist", generalist, [True, False]), routed])
    assert lines[3:] == [
        f"| generalist | `{generalist}` | 2 | 1 | cancel 1/1, change 0/1 |",
        f"| per_conversation | `{adapter}` | 3 | 2 | cancel 1/1, change 1/2 |",
        f"| per_conversation | `{generalist}` | 1 | 0 | cancel 0/1 |",
        f"| per_conversation | `{generalist}` then `{adapter}` | 1 | 1 | cancel 1/1 |",
    ]
    assert "Which models answered each arm's conversations:" in render(hand_made())


def test_with_two_passes_each_arm_is_paired_with_itself_on_the_same_goals() -> None:
    goals = ["g0", "g1", "g2", "g3"] * 2
    # Pass 2 meets g1 where pass 1 did not and misses g3 where pass 1 met it: 2 goals differ.
    steady = arm("generalist", "generalist.airline@v1", [True, False, False, True] * 2, goals)
    noisy = arm("per_conversation", "base", [True, False, False, True] + [True, True, False, False], goals)
    agreement = {item["arm"]: item for item in pass_agreement([steady, noisy], 2)}
    assert (agreement["generalist"]["differ"], agreement["generalist"]["difference"]) == (0, 0.0)
    item = agreement["per_conversation"]
    assert (item["goals"], item["differ"], item["before"], item["after"], item["after_only"], item["before_only"]) == (4, 2, 2, 2, 1, 1)
    assert item["mcnemar_p"] == round(mcnemar_p(1, 1), 4)
    assert pass_agreement([steady, noisy], 1) == []  # one pass: nothing to pair

    report = {**hand_made(), "passes": list(agreement.values())}
    assert "| per_conversation | 4 | 2 | 2 → 2 | +0.00 [" in render(report)
    assert "pass 1 against pass 2" not in render(hand_made())
