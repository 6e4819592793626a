"""``bench/grpo_settings.py`` with the tiny random model: one warm start, a variant's GRPO run from
it, and that run scored on the validation seeds at its last step and at the earlier checkpoint it
keeps (``save_steps``), each paired with the warm start on the same seeds; with ``keep_best`` the
run ends on the step its own validation seeds scored best, and the bench says which."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_a_variant_is_scored_at_its_end_and_at_its_kept_earlier_checkpoint(tmp_path: Path, tiny_model: Path) -> None:
    command = [
        sys.executable, "bench/grpo_settings.py", "--model", str(tiny_model), "--output", str(tmp_path), "--seeds", "3",
        "--max-new-tokens", "8", "--warm", "threads=1", "warm_start_examples=4", "warm_start_epochs=1",
        # Guided episodes give the random model's groups variance, so every step updates.
        "--variant", "two-steps", "threads=1", "steps=2", "save_steps=1", "groups_per_step=1", "group_size=2",
        "resample_groups=0", "warm_guided_share=0.5", "learning_rate=0.05",
        "--variant", "best-of-two", "threads=1", "steps=2", "save_steps=1", "groups_per_step=1", "group_size=2",
        "resample_groups=0", "warm_guided_share=0.5", "learning_rate=0.05", "keep_best=true", "validation_seeds=2",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
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
