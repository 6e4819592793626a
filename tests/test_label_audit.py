"""bench/label_audit.py's scores of planted defects, on a hand-made handful of runs."""

from __future__ import annotations

import json
from pathlib import Path

from bench.label_audit import planted_scores, read_planted, run_labels


def test_planted_scores_count_lacking_on_needing_successes_and_recall_of_planted_defects() -> None:
    runs = [
        # Successful runs: only LACKING and PRESENT labels say the run needed the capability.
        ("success", {}, {"error_recovery": "PRESENT", "argument_grounding": "NA"}),
        ("success", {}, {"error_recovery": "LACKING", "argument_grounding": "PRESENT"}),
        ("success", {}, {"error_recovery": "PRESENT", "argument_grounding": "PRESENT"}),
        # Failed runs: each planted defect is recalled only when labelled LACKING.
        ("failure", {"error_recovery": "LACKING"}, {"error_recovery": "LACKING", "argument_grounding": "LACKING"}),
        ("failure", {"error_recovery": "LACKING"}, {"error_recovery": "NA"}),
        ("failure", {"argument_grounding": "LACKING"}, {"argument_grounding": "LACKING"}),
        ("failure", {"multi_step_completion": "LACKING"}, {}),  # never labelled at all
    ]

    scores = planted_scores(runs)

    assert scores["error_recovery"] == {
        "success_needed": 3, "success_lacking": 1, "success_lacking_share": 1 / 3, "precision_ok": None,
        "planted": 2, "recalled": 1, "recall": 0.5, "recall_ok": False,
    }  # fmt: skip
    assert scores["argument_grounding"] == {
        "success_needed": 2, "success_lacking": 0, "success_lacking_share": 0.0, "precision_ok": None,
        "planted": 1, "recalled": 1, "recall": 1.0, "recall_ok": True,
    }  # fmt: skip
    assert (scores["multi_step_completion"]["planted"], scores["multi_step_completion"]["recall"]) == (1, 0.0)
    assert scores["multi_step_completion"]["success_lacking_share"] is None


def test_precision_is_judged_only_from_ten_needing_successes_against_fifteen_percent() -> None:
    def successes(lacking: int, present: int) -> list[tuple[str, dict[str, str], dict[str, str]]]:
        labels = ["LACKING"] * lacking + ["PRESENT"] * present
        return [("success", {}, {"tool_call_precision": label}) for label in labels]

    assert planted_scores(successes(1, 8))["tool_call_precision"]["precision_ok"] is None  # 9 runs: too few
    assert planted_scores(successes(1, 9))["tool_call_precision"]["precision_ok"] is True  # 10 %
    assert planted_scores(successes(2, 8))["tool_call_precision"]["precision_ok"] is False  # 20 %


def test_planted_defects_are_read_from_json_lines_and_arrays(tmp_path: Path) -> None:
    runs = [{"run_id": "a", "planted": {}}, {"run_id": "b", "planted": {"error_recovery": "LACKING"}}, {"run_id": "c"}]
    lines, array = tmp_path / "runs.jsonl", tmp_path / "runs.json"
    lines.write_text("".join(json.dumps(run) + "\n" for run in runs))
    array.write_text(json.dumps(runs))

    assert read_planted(lines) == read_planted(array) == {"a": {}, "b": {"error_recovery": "LACKING"}}


def test_a_repeating_labeler_counts_by_its_first_run() -> None:
    trajectory = {"labels": [
        {"capability": "error_recovery", "run": 1, "label": "PRESENT"},
        {"capability": "error_recovery", "run": 0, "label": "LACKING"},
        {"capability": "argument_grounding", "run": 0, "label": "NA"},
    ]}  # fmt: skip

    assert run_labels(trajectory) == {"error_recovery": "LACKING", "argument_grounding": "NA"}
