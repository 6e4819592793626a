"""Token-level mixture of LoRA experts (routing mode ``gate``): per decoder layer a small trained
gate, softmax(Linear(hidden)) over [base, adapter₁ … adapterₙ], scales each adapter's LoRA delta
per token.

A layer's gate runs in a forward pre-hook on that layer, on the hidden state entering it; the LoRA
Linears inside the layer read its weights and compute ``base(x) + Σ_i w_i · delta_i(x)``. All of it
happens inside the model's own forward, so generation keeps its KV cache and costs one pass per
token (PEFT's X-LoRA runs a scaling pass before every real one and gives up the cache).

Each Linear's adapters are fused once, at construction, into one down- and one up-projection with
the scaling folded in: n experts cost two matmuls per Linear (the second fused with the residual
add), not 2n. Adapter versions are immutable,
so the snapshot cannot go stale; build the gate after the model is on its device.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

BASE = "base"  # the name of slot 0: the base model, which adds no delta
FORMAT = "tracefix-gate/1"


class GateMismatch(ValueError):
    """Gate weights that do not fit this model and these adapters; the message says why."""


class _LayerRoute:
    """One decoder layer's gate output for the current forward, read by the layer's LoRA Linears."""

    __slots__ = ("logits", "weights", "_per_rank")

    def __init__(self) -> None:
        self.logits: torch.Tensor | None = None  # (batch, seq, 1 + n); None while weights are forced
        self.weights: torch.Tensor | None = None  # softmax of the logits, or the forced weights
        self._per_rank: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def set(self, logits: torch.Tensor | None, weights: torch.Tensor) -> None:
        self.logits, self.weights, self._per_rank = logits, weights, {}

    def per_rank(self, slot_of_rank: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The adapters' weights repeated once per LoRA rank row, (batch, seq, Σr): computed once per
        forward for all of the layer's Linears that share a rank layout (one tensor per layout)."""
        key = (id(slot_of_rank), dtype)
        if key not in self._per_rank:
            self._per_rank[key] = self.weights[..., 1:].index_select(-1, slot_of_rank).to(dtype)
        return self._per_rank[key]


class _FusedExperts:
    """One LoRA Linear's adapters side by side: x → down (Σr × in) → × w(token) → up (out × Σr).

    Kept in the base layer's dtype, so the up-projection and the residual add are one ``addmm``."""

    __slots__ = ("down", "up_t", "slot_of_rank")

    def __init__(self, module: LoraLinear, adapter_names: Sequence[str], layouts: dict[tuple[int, ...], torch.Tensor]) -> None:
        dtype = module.base_layer.weight.dtype
        with torch.no_grad():
            self.down = torch.cat([module.lora_A[name].weight for name in adapter_names]).to(dtype)
            up = torch.cat([module.lora_B[name].weight * module.scaling[name] for name in adapter_names], dim=1)
            self.up_t = up.to(dtype).t()
        ranks = tuple(module.lora_A[name].weight.shape[0] for name in adapter_names)
        if ranks not in layouts:
            # Column i of the adapters' weights (slot i + 1) repeated once per rank row of adapter i.
            layouts[ranks] = torch.repeat_interleave(torch.arange(len(ranks)), torch.tensor(ranks)).to(self.down.device)
        self.slot_of_rank = layouts[ranks]


def _gated_forward(module: LoraLinear, route: _LayerRoute, experts: _FusedExperts, x: torch.Tensor) -> torch.Tensor:
    """``base(x) + Σ_i w_i(token) · delta_i(x)``; LoRA dropout is never applied: the experts are
    frozen, and the gate is trained against exactly the deltas it mixes when serving."""
    result = module.base_layer(x)
    if module.disable_adapters:  # PEFT's own switch (``disable_adapter()``) still means the base alone
        return result
    hidden = F.linear(x, experts.down) * route.per_rank(experts.slot_of_rank, x.dtype)  # (batch, seq, Σr)
    flat = torch.addmm(result.reshape(-1, result.shape[-1]), hidden.reshape(-1, hidden.shape[-1]), experts.up_t)
    return flat.view_as(result)


class GatedExperts:
    """Several LoRA adapters of one ``peft.PeftModel`` mixed per token by trained per-layer gates.

    Slot 0 of every gate is the base model, slot i is ``adapter_names[i - 1]``. The gates (float32,
    on the model's device) start with the base slot's bias at ``base_bias`` and small weights, so an
    untrained gate serves (nearly) the base model. Not thread-safe: one forward or generation at a
    time, like the model itself.
    """

    def __init__(self, peft_model: Any, adapter_names: Sequence[str], base_bias: float = 4.0, seed: int = 0) -> None:
        self.model = peft_model
        self.adapter_names = list(adapter_names)
        _check_adapters(peft_model, self.adapter_names)
        self._decoder = peft_model.get_base_model().get_decoder()
        layers = list(self._decoder.layers)
        self.hidden_size = peft_model.get_base_model().config.get_text_config().hidden_size
        wrapped = _lora_modules(peft_model, layers, self.adapter_names)
        device = next(peft_model.parameters()).device
        self.gates = nn.ModuleList(
            _initial_gate(self.hidden_size, len(self.adapter_names), base_bias, seed + index) for index in range(len(layers))
        ).to(device)
        self._routes = [_LayerRoute() for _ in layers]
        self._forced: torch.Tensor | None = None
        self._generation: list[torch.Tensor] | None = None
        self._shares: torch.Tensor | None = None
        self._modules = [module for modules in wrapped for module in modules]
        layouts: dict[tuple[int, ...], torch.Tensor] = {}
        for route, modules in zip(self._routes, wrapped, strict=True):
            for module in modules:
                experts = _FusedExperts(module, self.adapter_names, layouts)
                module.forward = partial(_gated_forward, module, route, experts)
        self._hooks = [
            layer.register_forward_pre_hook(partial(self._route, index), with_kwargs=True)
            for index, layer in enumerate(layers)
        ]
        self._hooks.append(self._decoder.register_forward_hook(self._record))

    @property
    def slots(self) -> list[str]:
        """Slot names in gate order: ``base`` then the adapters."""
        return [BASE, *self.adapter_names]

    def remove(self) -> None:
        """Restore the plain PEFT model (e.g. when routing switches to another mode)."""
        for hook in self._hooks:
            hook.remove()
        for module in self._modules:
            del module.forward  # the instance attribute hid peft's class method
        self._hooks, self._modules = [], []

    def _route(self, index: int, layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        route = self._routes[index]
        if self._forced is not None:
            route.set(None, self._forced.to(hidden.device).expand(*hidden.shape[:-1], -1))
            return
        # Detached: each gate learns from its own layer's labels and does not steer later layers'
        # inputs, so training needs no backward pass through the model. The hidden state is
        # RMS-normalised because its scale differs by orders of magnitude between layers.
        normed = F.rms_norm(hidden.detach().float(), (hidden.shape[-1],))
        logits = self.gates[index](normed)
        route.set(logits, logits.detach().softmax(-1))

    def _record(self, decoder: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._generation is not None:
            # The last position of each forward is the one the next token is predicted from.
            self._generation.append(torch.stack([route.weights[:, -1] for route in self._routes]).mean(0))

    def token_shares(self) -> torch.Tensor:
        """Per-token expert weights of the last forward, averaged over layers: (batch, seq, 1 + n)."""
        if self._routes[0].weights is None:
            raise RuntimeError("no forward has run through the gated model yet")
        return torch.stack([route.weights for route in self._routes]).mean(0).detach()

    def gate_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Every layer's gate logits for a batch, (batch, seq, 1 + n) each, with gradients to the
        gates; runs the decoder stack without the LM head (what gate training needs)."""
        if self._forced is not None:
            raise RuntimeError("gate logits are undefined while weights are forced by override()")
        self._decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return [route.logits for route in self._routes]

    def generate(self, **inputs: Any) -> Any:
        """``model.generate(**inputs)``, recording the expert shares of every generated token."""
        self._generation = []
        try:
            return self.model.generate(**inputs)
        finally:
            steps, self._generation = self._generation, None
            self._shares = torch.cat(steps).mean(0) if steps else None

    def expert_shares(self) -> dict[str, float]:
        """Mean weight per slot over the tokens of the last ``generate`` (all rows of its batch), at
        the positions they were predicted from; empty before any generation."""
        if self._shares is None:
            return {}
        return {name: float(share) for name, share in zip(self.slots, self._shares.tolist(), strict=True)}

    @contextmanager
    def override(self, weights: Sequence[float] | Mapping[str, float]) -> Iterator[None]:
        """Force the same expert weights on every token and layer: a sequence over the slots
        (base first) or a mapping from slot name to weight (missing slots get 0)."""
        forced = self._slot_weights(weights)
        previous, self._forced = self._forced, forced
        try:
            yield
        finally:
            self._forced = previous

    def _slot_weights(self, weights: Sequence[float] | Mapping[str, float]) -> torch.Tensor:
        if isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(self.slots))
            if unknown:
                raise ValueError(f"unknown slots {unknown}; the slots are {self.slots}")
            weights = [float(weights.get(name, 0.0)) for name in self.slots]
        if len(weights) != len(self.slots):
            raise ValueError(f"{len(weights)} weights for {len(self.slots)} slots {self.slots}")
        if any(weight < 0 for weight in weights):
            raise ValueError(f"expert weights must not be negative: {list(weights)}")
        return torch.tensor([float(weight) for weight in weights])

    def save(self, path: Path) -> None:
        """Write the gate weights as safetensors, tagged with the adapters they route between
        (atomically: a crash never leaves half a file behind)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in self.gates.state_dict().items()}
        metadata = {
            "format": FORMAT,
            "adapters": json.dumps(self.adapter_names),
            "layers": str(len(self.gates)),
            "hidden_size": str(self.hidden_size),
        }
        handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(handle)
        try:
            save_file(tensors, staging, metadata=metadata)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.remove(staging)

    def load(self, path: Path) -> None:
        """Load gate weights saved by ``save``; refused unless they were trained for exactly these
        adapters, in this order, on a model of this shape."""
        metadata = read_metadata(path)
        saved = json.loads(metadata["adapters"])
        if saved != self.adapter_names:
            raise GateMismatch(
                f"{path} holds a gate for adapters {saved}, but this model mixes {self.adapter_names}; "
                "train a gate for these adapters (their order is the slot order)"
            )
        shape = (int(metadata.get("layers", -1)), int(metadata.get("hidden_size", -1)))
        if shape != (len(self.gates), self.hidden_size):
            raise GateMismatch(
                f"{path} holds a gate for {shape[0]} layers of width {shape[1]}, "
                f"this model has {len(self.gates)} of width {self.hidden_size}"
            )
        device = self.gates[0].weight.device
        self.gates.load_state_dict({name: tensor.to(device) for name, tensor in load_file(str(path)).items()})


def read_metadata(path: Path) -> dict[str, str]:
    """A gate file's metadata (format, adapters as a JSON list, layers, hidden_size)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except SafetensorError as error:
        raise GateMismatch(f"{path} is not a safetensors file: {error}") from error
    if metadata.get("format") != FORMAT or "adapters" not in metadata:
        raise GateMismatch(f"{path} is not a gate file ({FORMAT})")
    return metadata


def gate_adapters(path: Path) -> list[str]:
    """The adapter names a saved gate routes between, in slot order: what to load before it."""
    return json.loads(read_metadata(path)["adapters"])


def _initial_gate(hidden_size: int, adapters: int, base_bias: float, seed: int) -> nn.Linear:
    """Small random weights (logit noise ~0.1 on a normalised input) and a high base bias."""
    gate = nn.Linear(hidden_size, 1 + adapters)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * 0.1 / hidden_size**0.5)
        gate.bias.zero_()
        gate.bias[0] = base_bias
    return gate


def _check_adapters(peft_model: Any, adapter_names: list[str]) -> None:
    if not adapter_names:
        raise ValueError("a gate needs at least one adapter")
    if BASE in adapter_names or len(set(adapter_names)) != len(adapter_names):
        raise ValueError(f"adapter names must be unique and not {BASE!r}: {adapter_names}")
    missing = [name for name in adapter_names if name not in peft_model.peft_config]
    if missing:
        raise ValueError(f"adapters {missing} are not loaded; loaded: {sorted(peft_model.peft_config)}")


def _lora_modules(peft_model: Any, layers: list[nn.Module], adapter_names: list[str]) -> list[list[LoraLinear]]:
    """Per decoder layer, its LoRA Linears; refuses what a per-layer gate cannot mix exactly."""
    inside = {id(module) for layer in layers for module in layer.modules()}
    wrapped: list[list[LoraLinear]] = []
    for layer in layers:
        # PEFT's Linear, or the loop's own that decodes from the merged adapter (trainer.merged_lora):
        # the gate replaces either's forward
        modules = [module for module in layer.modules() if isinstance(module, LoraLinear)]
        others = [module for module in layer.modules() if isinstance(module, LoraLayer) and not isinstance(module, LoraLinear)]
        if others:
            kinds = sorted({f"{type(module).__module__}.{type(module).__qualname__}" for module in others})
            raise ValueError(f"LoRA layers of kind {kinds} (quantized, embedding …) cannot be gated")
        for module in modules:
            if "forward" in vars(module):
                raise ValueError("this model is already gated; remove() the other gate first")
            if module.merged:
                raise ValueError("a merged adapter cannot be gated; unmerge the model first")
            absent = [name for name in adapter_names if name not in module.lora_A]
            if absent:
                raise ValueError(f"adapters {absent} do not wrap every module the others do; they must share target modules")
            variants = [name for name in adapter_names if name in module.lora_variant]
            if variants:
                raise ValueError(f"adapters {variants} use a LoRA variant (e.g. DoRA), which the gate cannot mix")
        wrapped.append(modules)
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and id(module) not in inside:
            raise ValueError(f"{name} carries LoRA outside the decoder layers, where no gate reads")
    if not any(wrapped):
        raise ValueError("no LoRA Linear found in the decoder layers")
    return wrapped
