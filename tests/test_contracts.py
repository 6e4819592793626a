"""The daemon ↔ trainer contract (daemon/core/contracts.py): what the daemon writes as a training
request is what the trainer reads back, and a request either side gets wrong is refused with the
fields named, before any model is loaded — by the trainer's own process, over a real request file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracefix.daemon.core.contracts import GeneralistRequest, TargetedRequest, training_request
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.pipeline.training_runner import job_settings, train_config
from tests.conftest import REPO

TOOLS = [{"name": "get_order", "description": "Read an order.", "parameters": {"type": "object", "properties": {}}}]


def _targeted() -> dict:
    settings = Settings()
    return TargetedRequest(
        run_id=7, capability="error_recovery.shop-agent", version=2, family="error_recovery", difficulty=1, tools=TOOLS,
        training=train_config(settings), **job_settings(settings),
    ).model_dump(mode="json")  # fmt: skip


def test_what_the_daemon_writes_the_trainer_reads_back_unchanged() -> None:
    written = json.loads(json.dumps(_targeted()))
    read = training_request(written)
    assert isinstance(read, TargetedRequest) and read.model_dump(mode="json") == written
    assert (read.kind, read.capability, read.training.recipe, read.evaluation.seeds) == (
        "targeted", "error_recovery.shop-agent", Settings().training.recipe, Settings().training.eval_seeds,
    )  # fmt: skip
    generalist = {**{key: value for key, value in written.items() if key not in ("family", "difficulty", "tools", "replay", "starts_from")},
                  "kind": "generalist", "agent": "shop-agent", "conversations": "/runs/1/conversations.json", "margin": 0.05}  # fmt: skip
    assert isinstance(training_request(generalist), GeneralistRequest)
    without_kind = {key: value for key, value in written.items() if key != "kind"}  # written before kinds existed
    assert training_request(without_kind).kind == "targeted"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"version": 0}, "version: Input should be greater than or equal to 1"),
        ({"tools": "get_order"}, "tools: Input should be a valid list"),
        ({"kind": "ensemble"}, "does not match any of the expected tags"),
        ({"training": {"recipe": "magic"}}, "training.recipe"),
        ({"evaluation": {"seeds": 4}}, "evaluation.margin: Field required"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ],
)
def test_a_wrong_field_is_refused_by_name(change: dict, named: str) -> None:
    with pytest.raises(ValueError, match="bad training request") as refused:
        training_request({**_targeted(), **change})
    assert named in str(refused.value)


def test_the_trainer_refuses_a_wrong_request_before_loading_anything(tmp_path: Path) -> None:
    request = {key: value for key, value in _targeted().items() if key != "family"}
    (tmp_path / "request.json").write_text(json.dumps(request))
    command = [sys.executable, "-m", "tracefix.trainer.train_job", "--request", str(tmp_path / "request.json"), "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "family: Field required" in done.stderr.splitlines()[-1], done.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_result_is_read_with_its_extras_and_refused_with_the_reason_when_unusable() -> None:
    from tracefix.daemon.core.contracts import training_result

    result = {"run_id": 3, "capability": "error_recovery.shop-agent", "verdict": "candidate", "evaluation": {"reasons": []},
              "training": {"recipe": "sft"}, "adapter": "/runs/3/adapter", "steps": 2, "seconds": 9.5, "device": "cpu"}  # fmt: skip
    read = training_result(json.dumps(result))
    assert read.model_dump(mode="json") == result  # the device, beyond the contract, is kept
    for wrong, named in (
        ({**result, "adapter": None}, "a candidate names its adapter's directory"),
        ({**result, "verdict": "maybe"}, "verdict: Input should be 'candidate' or 'rejected_by_eval'"),
        ({key: value for key, value in result.items() if key != "evaluation"}, "evaluation: Field required"),
    ):
        with pytest.raises(ValueError, match="unusable training result") as refused:
            training_result(json.dumps(wrong))
        assert named in str(refused.value)
    with pytest.raises(ValueError, match="unusable training result"):
        training_result("{not json")
