"""Adapter files on disk: one directory per (capability, version), written whole or not at all, and
checked before a single tensor is read from it.

A directory holds what PEFT saves (``adapter_config.json``, ``adapter_model.safetensors``, its
model card) and ``manifest.json``: the caller's fields (capability, version, environment spec,
``base_model``, ``base_model_hash``, training config, metrics, ``created_at``) plus ``format`` and
the sha256 of every other file. Only safetensors are ever loaded; a pickle file in the directory
rejects the whole adapter, since unpickling runs arbitrary code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST = "manifest.json"
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".ckpt"})
_CHUNK = 1 << 20


class AdapterRejected(ValueError):
    """The adapter directory must not be loaded; the message says why."""


def base_model_hash(model_dir: Path) -> str:
    """sha256 over a model's safetensors weights and config.json: an adapter only fits the exact
    weights it was trained on. Cached while the files' paths, mtimes and sizes are unchanged."""
    model_dir = Path(model_dir).resolve()
    weights, config = sorted(model_dir.glob("*.safetensors")), model_dir / "config.json"
    if not weights or not config.is_file():
        raise FileNotFoundError(f"{model_dir} needs *.safetensors weights and a config.json to be hashed")
    stamps = tuple((str(path), path.stat().st_mtime_ns, path.stat().st_size) for path in [*weights, config])
    return _hash_files(stamps)


@functools.lru_cache(maxsize=32)
def _hash_files(stamps: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, size in stamps:
        # Name and size delimit each file, so moving bytes between files changes the hash.
        digest.update(f"{Path(name).name}\0{size}\0".encode())
        with open(name, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def save_adapter(model: Any, directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write a PEFT model's LoRA adapter and its manifest to `directory` atomically; returns the
    manifest. A version is immutable, so an existing `directory` is a `FileExistsError`."""
    directory = Path(directory)
    if directory.exists():
        raise FileExistsError(f"{directory} already exists; adapter versions are immutable, save under a new version")
    if list(model.peft_config) != ["default"]:
        # PEFT saves any other adapter name into a subdirectory, which loading would not find.
        raise ValueError(f"save_adapter saves a model with one adapter named 'default', not {list(model.peft_config)}")
    if "base_model_hash" not in manifest:
        raise ValueError("the manifest needs base_model_hash (from base_model_hash()) to tie the adapter to its base")
    directory.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a crash mid-way never leaves a half adapter behind.
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.staging-", dir=directory.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        files = {name: _sha256(staging / name) for name in _files_in(staging)}
        written = {**manifest, "format": FORMAT, "files": files}
        (staging / MANIFEST).write_text(json.dumps(written, indent=2, sort_keys=True))
        verify_adapter(staging)  # never publish what loading would refuse
        _sync(staging)
        if directory.exists():
            raise FileExistsError(f"{directory} was created while saving; adapter versions are immutable")
        os.replace(staging, directory)
        _sync_directory(directory.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def read_manifest(directory: Path) -> dict[str, Any]:
    """The adapter's manifest.json, or `AdapterRejected` if it is missing or not a JSON object."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise AdapterRejected(f"{directory} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterRejected(f"{path} is not readable JSON: {error}") from error
    if not isinstance(manifest, dict):
        raise AdapterRejected(f"{path} is not a JSON object")
    return manifest


def verify_adapter(directory: Path, base_hash: str | None = None) -> dict[str, Any]:
    """The manifest of an adapter that is complete, unmodified, LoRA, safetensors only and (when
    `base_hash` is given) trained on that base; otherwise `AdapterRejected` naming the reason."""
    directory = Path(directory)
    if not directory.is_dir():
        raise AdapterRejected(f"{directory} is not a directory")
    present = _files_in(directory)
    pickled = sorted(name for name in present if Path(name).suffix.lower() in PICKLE_SUFFIXES)
    if pickled:
        raise AdapterRejected(f"{directory} holds pickle-format {', '.join(pickled)}; refused, never loaded")
    manifest = read_manifest(directory)
    if manifest.get("format") != FORMAT:
        raise AdapterRejected(f"{directory / MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT}")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not all(isinstance(value, str) for value in listed.values()):
        raise AdapterRejected(f"{directory / MANIFEST} has no files table of name -> sha256")
    for name in (CONFIG, WEIGHTS):
        if name not in listed:
            raise AdapterRejected(f"{directory / MANIFEST} does not list {name}")
    present.discard(MANIFEST)
    for name in sorted(listed):
        if name not in present:
            raise AdapterRejected(f"{name} is listed in the manifest but missing from {directory}")
    extra = sorted(present - listed.keys())
    if extra:
        raise AdapterRejected(f"{directory} holds files the manifest does not list: {', '.join(extra)}")
    for name, expected in sorted(listed.items()):
        if _sha256(directory / name) != expected:
            raise AdapterRejected(f"{name} in {directory} does not match its sha256 in the manifest")
    try:
        config = json.loads((directory / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterRejected(f"{directory / CONFIG} is not readable JSON: {error}") from error
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        found = config.get("peft_type") if isinstance(config, dict) else None
        raise AdapterRejected(f"{directory / CONFIG} is not a LoRA config (peft_type {found!r})")
    if base_hash is not None and manifest.get("base_model_hash") != base_hash:
        raise AdapterRejected(
            f"{directory} was trained on base model hash {manifest.get('base_model_hash')!r}, not {base_hash!r}"
        )
    return manifest


def load_adapter(base_model: Any, directory: Path, name: str, base_hash: str | None = None) -> Any:
    """Verify the adapter, then attach it to `base_model` under adapter name `name` and return the
    PeftModel. A plain base model is wrapped, and modified in place, by PEFT; weights are read with
    safetensors only."""
    from peft import PeftModel

    from tracefix.trainer.merged_lora import merge_lora_products

    verify_adapter(directory, base_hash)
    if isinstance(base_model, PeftModel):
        base_model.load_adapter(str(directory), adapter_name=name)
    else:
        base_model = PeftModel.from_pretrained(base_model, str(directory), adapter_name=name)
    merge_lora_products(base_model)  # decoding multiplies by the adapter merged into a copy of the base
    return base_model


def _files_in(directory: Path) -> set[str]:
    """Relative names of every file below `directory`; a symlink could point anywhere, so it rejects."""
    names = set()
    for path in directory.rglob("*"):
        if path.is_symlink():
            raise AdapterRejected(f"{path} is a symlink; adapter directories hold plain files only")
        if path.is_file():
            names.add(path.relative_to(directory).as_posix())
    return names


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _sync(directory: Path) -> None:
    """Flush every file and directory below `directory`, so the rename publishes data already on disk."""
    for path in sorted(directory.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            _sync_directory(path)
    _sync_directory(directory)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
