"""``bench/grpo_settings.py`` with the tiny random model: one warm start, a variant's GRPO run from
it, and that run scored on the validation seeds at its last step and at the earlier checkpoint it
keeps (``save_steps``), each paired with the warm start on the same seeds; with ``keep_best`` the
run ends on the step its own validation seeds scored best, and the bench says which. Then
``bench/score_checkpoints.py`` scores that run's saved weights on other seeds, paired with the first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import REPO


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The bench's output folder and its finished process: a warm start and two variants' runs."""
    tmp_path = tmp_path_factory.mktemp("grpo-settings")
    command = [
        sys.executable, "bench/grpo_settings.py", "--model", str(tiny_model), "--output", str(tmp_path), "--seeds", "3",
        "--max-new-tokens", "8", "--warm", "threads=1", "warm_start_examples=4", "warm_start_epochs=1",
        # Guided episodes give the random model's groups variance, so every step updates.
        "--variant", "two-steps", "threads=1", "steps=2", "save_steps=1", "groups_per_step=1", "group_size=2",
        "resample_groups=0", "warm_guided_share=0.5", "learning_rate=0.05",
        "--variant", "best-of-two", "threads=1", "steps=2", "save_steps=1", "groups_per_step=1", "group_size=2",
        "resample_groups=0", "warm_guided_share=0.5", "learning_rate=0.05", "keep_best=true", "validation_seeds=2",
    ]  # fmt: skip
    return tmp_path, subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_variant_is_scored_at_its_end_and_at_its_kept_earlier_checkpoint(bench_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    tmp_path, done = bench_run
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    row, best = (json.loads(line) for line in done.stdout.splitlines()[:2])
    assert row["variant"] == "two-steps" and row["steps"] == 2 and row["paired"]["seeds"] == 3
    # checkpoint-1 is kept beside checkpoint-2 (the run's end, scored as the run itself): scored alone
    assert [point["step"] for point in row["along"]] == [1]
    along = row["along"][0]["paired"]
    assert along["seeds"] == 3 and along["after_only"] + along["before_only"] + along["both"] + along["neither"] == 3
    assert "| two-steps | 1 |" in done.stdout and "other kept checkpoints" in done.stdout
    # the warm start is kept for later runs (reused when warm.json is there), and so is the checkpoint scored
    assert (tmp_path / "warm.json").exists() and (tmp_path / "variants" / "two-steps" / "checkpoints" / "sft+grpo" / "checkpoint-1").is_dir()
    # keep_best scored the warm start (step 0) and both checkpoints on its own 2 validation seeds, and
    # ended on one of them; the run's other kept checkpoints are scored on the bench's seeds
    assert [item["step"] for item in best["checkpoints"]] == [0, 1, 2] and {item["seeds"] for item in best["checkpoints"]} == {2}
    assert best["kept_step"] in (0, 1, 2)
    assert sorted(point["step"] for point in best["along"]) == sorted({1, 2} - {best["kept_step"]})
    assert f"kept step {best['kept_step']}" in done.stdout


def test_saved_weights_are_scored_on_other_seeds_paired_with_the_first(
    bench_run: tuple[Path, subprocess.CompletedProcess[str]], tiny_model: Path, tmp_path: Path
) -> None:
    output, done = bench_run
    assert done.returncode == 0, done.stderr[-3000:]
    run = output / "variants" / "two-steps"
    warm = run / "trials" / "sft+grpo" / "warm_start.safetensors"
    bench = [sys.executable, "bench/score_checkpoints.py", "--model", str(tiny_model), "--max-new-tokens", "8"]
    scored = subprocess.run(
        [*bench, "--seeds", "7:12", f"warm={warm}", f"again={warm}", f"step1={run / 'checkpoints' / 'sft+grpo' / 'checkpoint-1'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    names = [json.loads(line)["name"] for line in scored.stdout.splitlines() if line.startswith("{")]
    assert names == ["warm", "again", "step1"] and "Seeds 7–11 (5), greedy" in scored.stdout
    # the same weights score the same on every seed (greedy): paired with themselves, nothing won or lost
    rows = {line.split(" | ")[0].strip("| "): line for line in scored.stdout.splitlines() if line.startswith("| ")}
    assert " 0 / 0 | +0.00 [" in rows["again"] and rows["again"].split(" | ")[1:3] == rows["warm"].split(" | ")[1:3]
    assert "step1" in rows
    # weights that are not this model's adapter are refused by name, before any scoring
    other = tmp_path / "other.safetensors"
    save_file({name: tensor for name, tensor in list(load_file(str(warm)).items())[:2]}, str(other))
    refused = subprocess.run([*bench, "--seeds", "7:9", f"warm={warm}", f"other={other}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "other:" in refused.stderr and "not an adapter" in refused.stderr
    assert '"name"' not in refused.stdout  # not even the first weights were scored
    # a missing path or an empty seed range stops at the arguments
    for arguments in (["--seeds", "7:9", "warm=/nowhere"], ["--seeds", "9:7", f"warm={warm}"]):
        stopped = subprocess.run([*bench, *arguments], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 2 and ("no weights at" in stopped.stderr or "END above FIRST" in stopped.stderr)
    # seeds the run trained on (its demonstrations and training seeds, from 99 904 up) are refused
    trained = subprocess.run([*bench, "--seeds", "99900:99910", f"warm={warm}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 1 and "demonstrations' and training's" in trained.stderr and '"name"' not in trained.stdout


def test_kept_scores_are_reused_and_a_range_is_extended_without_replaying(
    bench_run: tuple[Path, subprocess.CompletedProcess[str]], tiny_model: Path, tmp_path: Path
) -> None:
    output, done = bench_run
    assert done.returncode == 0, done.stderr[-3000:]
    warm = output / "variants" / "two-steps" / "trials" / "sft+grpo" / "warm_start.safetensors"
    step1 = output / "variants" / "two-steps" / "checkpoints" / "sft+grpo" / "checkpoint-1"
    bench = [sys.executable, "bench/score_checkpoints.py", "--model", str(tiny_model), "--scores", str(tmp_path / "scores")]

    def score(seeds: str) -> tuple[dict[str, int], str]:
        run = subprocess.run([*bench, "--max-new-tokens", "8", "--seeds", seeds, f"warm={warm}", f"step1={step1}"],
                             cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        return {line["name"]: line["played"] for line in lines}, run.stdout.split("greedy:")[1]

    first, table = score("20:24")
    assert first == {"warm": 4, "step1": 4} and len(list((tmp_path / "scores").glob("*.json"))) == 2
    again, same = score("20:24")
    assert again == {"warm": 0, "step1": 0} and same == table  # nothing played, the same table
    extended, _ = score("22:27")
    assert extended == {"warm": 3, "step1": 3}  # 24, 25, 26 are new
    # other decoding settings are other results: nothing is reused for them
    changed = subprocess.run([*bench, "--max-new-tokens", "4", "--seeds", "20:22", f"warm={warm}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert changed.returncode == 0 and json.loads(changed.stdout.splitlines()[0])["played"] == 2
    # a kept file that is not one stops the bench with its path, and is left as it was
    for kept in (tmp_path / "scores").glob("*.json"):
        kept.write_text("{not json")
    broken = subprocess.run([*bench, "--max-new-tokens", "8", "--seeds", "20:22", f"warm={warm}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert broken.returncode == 1 and "is not a scores file" in broken.stderr and '"name"' not in broken.stdout
    assert all(kept.read_text() == "{not json" for kept in (tmp_path / "scores").glob("*.json"))


def test_a_training_runs_request_gives_the_environment_and_settings_scored_on(
    bench_run: tuple[Path, subprocess.CompletedProcess[str]], tiny_model: Path, tmp_path: Path
) -> None:
    """``--request``: a daemon run's adapter is scored on that run's environment (its tool
    definitions, in its order) with its [training] settings, and its scores are kept apart from the
    bench's own environment's."""
    from bench.grpo_settings import settings
    from examples.airline.tools import TOOLS

    output, done = bench_run
    assert done.returncode == 0, done.stderr[-3000:]
    warm = output / "variants" / "two-steps" / "trials" / "sft+grpo" / "warm_start.safetensors"
    request = tmp_path / "request.json"
    training = settings({"threads": 1}, 8).model_dump(mode="json")
    request.write_text(json.dumps({"family": "tool_call_precision", "difficulty": 1, "tools": list(reversed(TOOLS)), "training": training}))
    bench = [sys.executable, "bench/score_checkpoints.py", "--model", str(tiny_model), "--scores", str(tmp_path / "scores")]

    def played(*options: str) -> int:
        run = subprocess.run([*bench, *options, "--seeds", "30:33", f"warm={warm}"], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.splitlines()[0])["played"]

    # The bench's environment, then the request's (the same tools in another order: another
    # opening), with the same decoding: the second is played, not taken from the first's scores.
    assert played("--max-new-tokens", "8") == 3
    assert played("--request", str(request)) == 3
    assert played("--request", str(request)) == 0
    assert len(list((tmp_path / "scores").glob("*.json"))) == 2
    # a file that is not a run's request stops the bench with its path, before any scoring
    for text in ("{not json", json.dumps({"family": "no_such_family", "tools": []}), json.dumps({"tools": TOOLS})):
        request.write_text(text)
        refused = subprocess.run([*bench, "--request", str(request), "--seeds", "30:31", f"warm={warm}"], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 1 and f"--request {request}: not a training run's request" in refused.stderr, refused.stderr[-2000:]
        assert '"name"' not in refused.stdout
