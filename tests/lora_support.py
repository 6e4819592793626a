"""Real LoRA adapters for tests, saved and verifiable like trained ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_adapter(base_dir: Path, directory: Path, capability: str, version: int, seed: int) -> Path:
    """A saved LoRA adapter whose B matrices are seeded noise (a fresh LoRA is zero and changes nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tracefix.trainer import adapters

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), LoraConfig(r=4, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    manifest = {"capability": capability, "version": version, "base_model_hash": adapters.base_model_hash(base_dir)}
    adapters.save_adapter(model, directory, manifest)
    return directory


def register_candidate(store: Any, capability: str, version: int, path: Path | str, run_id: int, environment_id: int = 1) -> int:
    """An adapter row in state `candidate`, as the training job writes one (its id)."""
    rows = store.query(
        "INSERT INTO adapters (capability, version, run_id, environment_id, path, manifest_sha256, state, evaluation, created_at) "
        "VALUES (?, ?, ?, ?, ?, 'x', 'candidate', '{}', now()) RETURNING adapter_id",
        [capability, version, run_id, environment_id, str(path)],
    )
    return rows[0]["adapter_id"]
