"""Adapter files: a LoRA on a tiny random Llama (SmolLM2's real tokenizer) saved, verified and loaded
back exactly, and every kind of damaged, foreign or unsafe directory refused before it is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import torch
import transformers  # noqa: F401  (installed by make test: never skipped)
import peft  # noqa: F401  (installed by make test: never skipped)

from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict  # noqa: E402

from tracefix.trainer import adapters  # noqa: E402
from tracefix.trainer.adapters import AdapterRejected  # noqa: E402

INPUT_IDS = torch.tensor([[1, 17, 256, 4096, 30000, 2]])


@pytest.fixture(scope="module")
def base_dir(tiny_model: Path) -> Path:
    return tiny_model


@pytest.fixture(scope="module")
def fresh_base(base_dir: Path) -> Callable[[], Any]:
    """A new base model per call: attaching an adapter modifies the base in place."""
    from transformers import AutoModelForCausalLM

    return lambda: AutoModelForCausalLM.from_pretrained(base_dir).eval()


@pytest.fixture(scope="module")
def trained(fresh_base: Callable[[], Any]) -> PeftModel:
    """A LoRA whose weights are seeded noise: a freshly initialised one is zero and changes nothing."""
    config = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(fresh_base(), config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def manifest_fields(base_dir: Path) -> dict[str, Any]:
    return {
        "capability": "tool_call_precision",
        "version": 1,
        "environment": {"family": "tool_call_precision", "difficulty": 1},
        "base_model": "tiny-random-llama",
        "base_model_hash": adapters.base_model_hash(base_dir),
        "training": {"steps": 0, "learning_rate": 1e-4},
        "metrics": {"reward": 0.5},
        "created_at": "2025-01-01T00:00:00Z",
    }


@pytest.fixture(scope="module")
def saved(trained: PeftModel, manifest_fields: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("adapters") / "tool_call_precision" / "v1"
    adapters.save_adapter(trained, directory, manifest_fields)
    return directory


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    """A private copy of the saved adapter, for tests that damage it."""
    return Path(shutil.copytree(saved, tmp_path / "v1"))


@pytest.fixture
def no_torch_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("torch.load (pickle) was called")

    monkeypatch.setattr(torch, "load", refuse)


def relist(directory: Path, name: str) -> None:
    """Record `name`'s current sha256 in the manifest, so only the check under test can object."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    (directory / "manifest.json").write_text(json.dumps(manifest))


def logits(model: Any) -> Any:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


def test_a_saved_adapter_loads_back_with_identical_weights_and_logits(
    saved: Path, trained: PeftModel, fresh_base: Callable[[], Any], manifest_fields: dict[str, Any], no_torch_load: None
) -> None:
    base_logits = logits(fresh_base())
    loaded = adapters.load_adapter(fresh_base(), saved, "tool_call_precision", manifest_fields["base_model_hash"])
    assert isinstance(loaded, PeftModel) and loaded.active_adapter == "tool_call_precision"
    expected = get_peft_model_state_dict(trained)
    actual = get_peft_model_state_dict(loaded, adapter_name="tool_call_precision")
    assert expected.keys() == actual.keys() and len(expected) == 2 * 4 * 2  # A and B, 4 projections, 2 layers
    assert all(torch.equal(expected[key], actual[key]) for key in expected)
    # the loaded adapter decodes from its weights merged into a copy of the base's (trainer.merged_lora):
    # the same sum in another order, so equal within float32's rounding rather than to the bit
    torch.testing.assert_close(logits(loaded.eval()), logits(trained), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits(trained), base_logits)  # the adapter really changes the model


def test_a_second_adapter_loads_into_an_existing_peft_model_under_its_name(
    saved: Path, trained: PeftModel, fresh_base: Callable[[], Any], no_torch_load: None
) -> None:
    first = adapters.load_adapter(fresh_base(), saved, "first")
    both = adapters.load_adapter(first, saved, "second")
    assert both is first and set(both.peft_config) == {"first", "second"}
    expected = get_peft_model_state_dict(trained)
    second = get_peft_model_state_dict(both, adapter_name="second")
    assert expected.keys() == second.keys()
    assert all(torch.equal(expected[key], second[key]) for key in expected)


def test_the_manifest_lists_every_file_with_its_sha256(saved: Path, manifest_fields: dict[str, Any]) -> None:
    manifest = adapters.read_manifest(saved)
    on_disk = {path.name for path in saved.iterdir()} - {"manifest.json"}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= on_disk
    assert set(manifest["files"]) == on_disk
    for name, sha256 in manifest["files"].items():
        assert hashlib.sha256((saved / name).read_bytes()).hexdigest() == sha256
    assert manifest["format"] == 1
    assert {key: manifest[key] for key in manifest_fields} == manifest_fields
    assert adapters.verify_adapter(saved) == manifest


def test_saving_the_same_version_twice_is_refused(
    saved: Path, trained: PeftModel, manifest_fields: dict[str, Any]
) -> None:
    before = {path.name: path.read_bytes() for path in saved.iterdir()}
    with pytest.raises(FileExistsError, match="immutable"):
        adapters.save_adapter(trained, saved, {**manifest_fields, "created_at": "2025-02-01T00:00:00Z"})
    assert {path.name: path.read_bytes() for path in saved.iterdir()} == before
    assert sorted(path.name for path in saved.parent.iterdir()) == ["v1"]  # no staging directory left


def test_a_flipped_byte_in_the_weights_is_refused_naming_the_file(
    copy: Path, fresh_base: Callable[[], Any], no_torch_load: None
) -> None:
    weights = copy / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterRejected, match=r"adapter_model\.safetensors .*sha256"):
        adapters.verify_adapter(copy)
    with pytest.raises(AdapterRejected, match=r"adapter_model\.safetensors"):
        adapters.load_adapter(fresh_base(), copy, "tampered")


@pytest.mark.parametrize("name", ["adapter_model.bin", "weights.pt", "weights.pth", "state.pkl", "last.ckpt"])
def test_a_pickle_file_is_refused_even_when_the_manifest_lists_it(
    copy: Path, name: str, fresh_base: Callable[[], Any], no_torch_load: None
) -> None:
    (copy / name).write_bytes(pickle.dumps({"weights": [0.0]}))
    relist(copy, name)
    with pytest.raises(AdapterRejected, match=rf"pickle-format {name}"):
        adapters.verify_adapter(copy)
    with pytest.raises(AdapterRejected, match="pickle"):
        adapters.load_adapter(fresh_base(), copy, "pickled")


def test_an_unlisted_extra_file_is_refused(copy: Path) -> None:
    (copy / "notes.txt").write_text("added after saving")
    with pytest.raises(AdapterRejected, match=r"does not list: notes\.txt"):
        adapters.verify_adapter(copy)


def test_a_listed_file_that_is_missing_is_refused(copy: Path) -> None:
    (copy / "README.md").unlink()
    with pytest.raises(AdapterRejected, match=r"README\.md is listed in the manifest but missing"):
        adapters.verify_adapter(copy)


def test_a_missing_or_unreadable_manifest_is_refused(copy: Path) -> None:
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(AdapterRejected, match="not readable JSON"):
        adapters.verify_adapter(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(AdapterRejected, match="no manifest.json"):
        adapters.verify_adapter(copy)


def test_an_adapter_config_that_is_not_lora_is_refused(copy: Path) -> None:
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    relist(copy, "adapter_config.json")
    with pytest.raises(AdapterRejected, match="not a LoRA config"):
        adapters.verify_adapter(copy)


def test_an_adapter_for_another_base_model_is_refused(
    saved: Path, manifest_fields: dict[str, Any], fresh_base: Callable[[], Any]
) -> None:
    assert adapters.verify_adapter(saved, manifest_fields["base_model_hash"])["capability"] == "tool_call_precision"
    with pytest.raises(AdapterRejected, match="trained on base model hash"):
        adapters.verify_adapter(saved, "0" * 64)
    with pytest.raises(AdapterRejected, match="trained on base model hash"):
        adapters.load_adapter(fresh_base(), saved, "foreign", "0" * 64)


@pytest.mark.parametrize("crash", ["after the weights are written", "at the rename"])
def test_a_crash_during_save_leaves_no_directory_behind(
    crash: str, trained: PeftModel, manifest_fields: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    if crash == "at the rename":
        monkeypatch.setattr(os, "replace", fail)
    else:
        save_pretrained = trained.save_pretrained

        def save_then_fail(*args: Any, **kwargs: Any) -> None:
            save_pretrained(*args, **kwargs)
            fail()

        monkeypatch.setattr(trained, "save_pretrained", save_then_fail)
    with pytest.raises(OSError, match="disk gone"):
        adapters.save_adapter(trained, tmp_path / "adapters" / "v2", manifest_fields)
    assert list((tmp_path / "adapters").iterdir()) == []


def test_the_base_model_hash_follows_the_files_not_the_path(base_dir: Path, tmp_path: Path) -> None:
    moved = Path(shutil.copytree(base_dir, tmp_path / "moved"))
    original = adapters.base_model_hash(base_dir)
    assert len(original) == 64 and adapters.base_model_hash(moved) == original
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))
    assert adapters.base_model_hash(moved) != original
    (moved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        adapters.base_model_hash(moved)


@pytest.mark.slow  # needs root: it mounts a tmpfs of its own (run by hand with -m slow)
def test_an_adapter_saved_onto_a_full_disk_fails_with_the_reason_and_leaves_nothing(tmp_path: Path, tiny_model: Path) -> None:
    """A training run's last step on a full disk: saving raises the file system's reason, and no
    half-written adapter (nor its staging directory) is left for the router or a rerun to find."""
    import subprocess

    from tests.lora_support import make_adapter

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"mounting a tmpfs needs root: {mounted.stderr}"
    try:
        (disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(disk).free - 16 * 1024))  # 16 KB left
        with pytest.raises(Exception, match="No space left on device"):  # OSError, or safetensors' error naming it
            make_adapter(tiny_model, disk / "runs" / "v1", "error_recovery", 1, 1)
        assert [path.name for path in (disk / "runs").iterdir()] == []  # neither the adapter nor its staging
        (disk / "filler").unlink()
        assert (make_adapter(tiny_model, disk / "runs" / "v1", "error_recovery", 1, 1) / "manifest.json").is_file()  # space again: it saves
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
