"""The GPU check's training part, on this machine's CPU: ``bench/gpu_training.py`` drives the daemon's
own TrainingRunner and training subprocess to a verdict and checks what a GPU run must show, and
``bench/gpu_check.sh`` fails loudly where torch sees no GPU instead of passing on the CPU. The GPU
run itself needs a GPU machine: ``bash bench/gpu_check.sh`` there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_the_training_check_passes_through_the_daemons_own_job_and_reports_what_it_measured(tmp_path: Path, tiny_model: Path) -> None:
    command = [
        sys.executable, "bench/gpu_training.py", "--model", str(tiny_model), "--work", str(tmp_path), "--max-new-tokens", "8",
        # The tiny random model earns no reward by itself: guided episodes give its groups variance, and
        # a large learning rate moves it far enough in one pass for the clip to bind on the second.
        "--set", "device=cpu", "threads=1", "warm_start_examples=2", "steps=2", "groups_per_step=1", "group_size=2", "eval_seeds=2",
        "warm_guided_share=0.5", "learning_rate=0.05",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [line.split(":")[0] for line in lines[:5]] == ["PASS run", "PASS device", "PASS warm_start", "PASS grpo", "PASS evaluation"], lines
    figures = json.loads(lines[-1])
    assert (figures["device"], figures["memory_limit_mb"], figures["peak_gpu_mb"]) == ("cpu", 16384, None)
    assert figures["settings"]["steps"] == 2 and figures["grpo_rollouts"] >= 4 and figures["clip_fraction_max"] > 0
    assert figures["grpo_added"]["seeds"] == 2 and figures["warm_start_s_per_update"] > 0


def test_the_same_check_fails_when_the_run_did_not_train_where_it_was_asked(tmp_path: Path, tiny_model: Path) -> None:
    command = [
        sys.executable, "bench/gpu_training.py", "--model", str(tiny_model), "--work", str(tmp_path), "--max-new-tokens", "8",
        "--set", "threads=1", "warm_start_examples=2", "steps=1", "groups_per_step=1", "group_size=2", "eval_seeds=2",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    import torch

    if torch.cuda.is_available():  # on a GPU machine this is the check itself
        assert "PASS device" in done.stdout, done.stdout
    else:  # [training] device = "cuda" (the check's) on a machine without one: the run fails with the reason
        assert done.returncode == 1 and done.stdout.startswith("FAIL run: failed"), done.stdout
        assert "sees no usable GPU" in done.stdout and "FAIL device: trained on None" in done.stdout


def test_gpu_check_fails_its_training_part_where_torch_sees_no_gpu(tmp_path: Path) -> None:
    import torch

    environment = {**os.environ, "PARTS": "train", "SKIP_INSTALL": "1", "TRAIN_VENV": sys.prefix}
    done = subprocess.run(["bash", "bench/gpu_check.sh", str(tmp_path)], cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    if torch.cuda.is_available():
        assert "PASS device" in done.stdout, done.stdout + done.stderr
    else:
        assert done.returncode == 1 and done.stdout.splitlines() == [f"FAIL train-install (no torch that sees a GPU in {sys.prefix})"], done.stdout
