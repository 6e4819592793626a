"""LoRA layers that decode from their adapter merged into a copy of the base weight.

PEFT's LoRA layer computes ``base(x) + B(A(x)) · scale``: its input cast to the adapter's float32,
two more products, a scaling, a sum and a cast back, around the base's product. Under autograd
that is what training needs; at a decode step's 1-16 rows it is about a sixth of the step (on
SmolLM2-135M with LoRA on q, k, v and o, a held-out evaluation in bfloat16 took 7.7 s with the
adapter's branch and 6.7 s without it, docs/performance.md). Where no gradient flows, the layer
here multiplies once, by ``W + scale · B A`` kept for the adapter (packed as the base's own weights
are, ``trainer.packed_linear``), and computes it again when the base or the
adapter changes (an optimiser step, ``adapter_weights``, a loaded adapter: their tensors' versions
or addresses). The same approach as merging an adapter for serving, without touching the base's
own weights, so training, the reference policy and ``disable_adapter`` are untouched.

``merge_lora_products(model)`` makes each PEFT ``lora.Linear`` of a wrapped model a
``MergedLoraLinear``; ``trainer.recipes.load_policy`` and ``trainer.adapters.load_adapter`` (the
router, the gate, evaluation) install it. A batch whose rows ask for one adapter (the router's
``adapter_names``) takes it too; rows of different adapters, adapter variants (DoRA), an adapter
with a bias of its own, dropout in training mode and anything under autograd take PEFT's own forward.

The merged weight is rounded to the base's dtype, as a merged adapter served in bfloat16 is, so a
bfloat16 decode may differ from the unmerged sum in the last place; rollouts, evaluation and the
router decode alike, and losses and gradients are PEFT's.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn
from torch.nn import functional

from tracefix.trainer import packed_linear

# Off only to measure it; the environment variable reaches the processes a bench starts.
MERGED = os.environ.get("TRACEFIX_MERGED_LORA", "1") != "0"
_KEEP = 4  # adapters (or sets of them) a layer keeps a merged weight for: the router serves several
_BASE = "__base__"  # PEFT's name for a row of a mixed batch that takes no adapter


class MergedLoraLinear(LoraLinear):
    """PEFT's ``lora.Linear`` that multiplies by its merged weight where no gradient flows (see the module)."""

    _merged: dict[tuple[str, ...], tuple[tuple[Any, ...], torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapters = self._decoding_adapters(x, args, kwargs)
        if adapters is None:
            return super().forward(x, *args, **kwargs)
        base = self.base_layer
        if not adapters:
            return base(x)
        weight = self._merged_weight(adapters, x)
        if weight.is_mkldnn:
            return packed_linear.packed_product(x, weight, base.bias)
        return functional.linear(x, weight, None if base.bias is None else base.bias.detach())

    def _decoding_adapters(self, x: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...] | None:
        """The adapters this call adds to the base (empty: none), or None where PEFT's forward must run."""
        names = kwargs.get("adapter_names")
        if not MERGED or args or any(value is not None for key, value in kwargs.items() if key != "adapter_names"):
            return None
        if self.disable_adapters or self.merged or not isinstance(self.base_layer, nn.Linear):
            return None
        if x.dtype != self.base_layer.weight.dtype:
            return None
        if names is None:
            adapters = tuple(name for name in self.active_adapters if name in self.lora_A)
        else:
            distinct = set(names)
            if len(distinct) != 1:
                return None
            (name,) = distinct
            if name == _BASE:
                return ()
            if name not in self.lora_A:
                return None
            adapters = (name,)
        for name in adapters:
            dropout = self.lora_dropout[name]
            if name in self.lora_variant or self.lora_B[name].bias is not None or (dropout.training and not isinstance(dropout, nn.Identity)):
                return None  # a variant (DoRA), a bias of the adapter's own (lora_bias), dropout in training
        if torch.is_grad_enabled() and (x.requires_grad or any(self._trainable(name) for name in adapters)):
            return None
        return adapters

    def _trainable(self, name: str) -> bool:
        return self.lora_A[name].weight.requires_grad or self.lora_B[name].weight.requires_grad

    def _merged_weight(self, adapters: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
        base = self.base_layer.weight
        state = (base.data_ptr(), base._version) + tuple(
            value
            for name in adapters
            for tensor in (self.lora_A[name].weight, self.lora_B[name].weight)
            for value in (tensor.data_ptr(), tensor._version)
        ) + tuple(float(self.scaling[name]) for name in adapters)
        kept = self._merged if self._merged is not None else {}
        entry = kept.get(adapters)
        if entry is not None and entry[0][0] is base and entry[0][1:] == state:
            return entry[1]
        with torch.no_grad():
            merged = base.detach().float()
            for name in adapters:
                merged = merged + self.get_delta_weight(name).float()
            merged = merged.to(base.dtype)
            weight = packed_linear.pack(merged) if packed_linear.packs(merged, x) else merged
        kept.pop(adapters, None)
        for stale in [key for key in kept if any(name not in self.lora_A for name in key)]:
            del kept[stale]  # a deleted adapter's (the router unloads old versions)
        while len(kept) >= _KEEP:
            kept.pop(next(iter(kept)))
        kept[adapters] = ((base, *state), weight)
        self._merged = kept
        return weight

    def __getstate__(self) -> dict[str, Any]:
        # A cache, and packed weights are opaque tensors that cannot be copied or pickled.
        state = dict(super().__getstate__())
        state.pop("_merged", None)
        return state


def merge_lora_products(model: nn.Module) -> None:
    """Make each PEFT ``lora.Linear`` under ``model`` a ``MergedLoraLinear``, in place."""
    for module in model.modules():
        if type(module) is LoraLinear:
            module.__class__ = MergedLoraLinear
