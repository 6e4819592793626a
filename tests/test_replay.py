"""Replay of real failures: the trainer answers a failed trajectory's opening with the base and the
adapter (trainer/replay.py), and the daemon judges each first turn with the capability's own rule
labeler, as it would judge the agent (daemon/pipeline/replay_judge.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tracefix.daemon.analysis.capabilities import load_registry
from tracefix.daemon.core.settings import CapabilitySettings
from tracefix.trainer.environment import assistant_call, assistant_text, load_tools
from tracefix.daemon.pipeline.replay_judge import judge, replayed_trajectory

TOOLS = load_tools(json.loads((Path(__file__).parent / "fixtures" / "tools" / "airline.json").read_text()))
CASE = {"trajectory_id": "t1", "system": "You are an airline agent.", "user": "Cancel reservation R-12345 please."}


def _judge(capability: str, answer: dict) -> str:
    labeler = load_registry(CapabilitySettings())[capability].labeler
    return labeler.label(replayed_trajectory(CASE, answer, TOOLS)).label.value


def test_a_write_before_any_read_is_lacking_precondition_verification() -> None:
    assert _judge("precondition_verification", assistant_call("cancel_reservation", {"reservation_id": "R-12345"})) == "LACKING"
    assert _judge("precondition_verification", assistant_call("get_reservation", {"reservation_id": "R-12345"})) != "LACKING"


def test_a_call_that_fails_its_schema_is_lacking_tool_call_precision() -> None:
    assert _judge("tool_call_precision", assistant_call("get_reservation", {"reservation": 5})) == "LACKING"
    assert _judge("tool_call_precision", assistant_call("get_reservation", {"reservation_id": "R-12345"})) == "PRESENT"
    # Asked to cancel a reservation and answering in prose is no call at all: lacking too.
    assert _judge("tool_call_precision", assistant_text("Sure, one moment.")) == "LACKING"


def test_a_replay_reports_each_cases_labels_with_the_labelers_reasons_and_the_answers(tiny_model: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.lora_support import make_adapter
    from tracefix.trainer.replay import replay
    from tracefix.trainer.rollouts import Sampling

    adapter_dir = make_adapter(tiny_model, tmp_path / "adapter", "tool_call_precision", 1, seed=3)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    cases = [CASE, {**CASE, "trajectory_id": "t2", "user": "How many bags can I check on R-12345?"}]

    replayed = replay(model, tokenizer, cases, TOOLS, Sampling(max_new_tokens=12))
    assert [item["trajectory_id"] for item in replayed["answers"]] == ["t1", "t2"]  # answers only: the trainer judges nothing
    assert all({"base", "adapter"} <= set(item) and "base_reason" not in item for item in replayed["answers"])
    report = judge(replayed, "tool_call_precision", TOOLS, CapabilitySettings())

    assert report["cases"] == 2 and [item["trajectory_id"] for item in report["items"]] == ["t1", "t2"]
    for case, item in zip(cases, report["items"], strict=True):
        for who in ("base", "adapter"):
            answer = item[f"{who}_answer"]
            assert isinstance(answer, str) and len(answer) <= 300
            # The reason is the labeler's own verdict on the answer shown next to it.
            judged = load_registry(CapabilitySettings())["tool_call_precision"].labeler.label(
                replayed_trajectory(case, assistant_text(answer), TOOLS)
            )
            assert (item[who], item[f"{who}_reason"]) == (judged.label.value, judged.reason)
    assert report["base_lacking"] == sum(item["base"] == "LACKING" for item in report["items"])
