"""Linear layers whose weights are packed once for the CPU's product kernels, not per call.

torch multiplies a bfloat16 ``F.linear`` on the CPU with oneDNN, which first reorders the weight
from its plain [out, in] layout into the blocked layout its AMX / AVX-512 kernels read, on every
call: a read and a write of the whole weight before the product reads it again. Where a product is
large (a prefill of hundreds of rows) that is a share of the work; where it is a decode step's 1-16
rows it is most of it, and a decode step is about 200 such products (7 a layer and the output
layer). oneDNN can keep the reordered weight instead (``torch.ops.mkldnn._reorder_linear_weight``,
the packing ``torch.compile`` does for frozen CPU inference) and multiply from it directly.
Measured on the Intel AMX machine (docs/performance.md): a [1,536 × 576] product of 8 rows over
weights not in cache 189 → 118 µs, of 700 rows 753 → 648 µs; a decode step of 8 rows of
SmolLM2-135M about 1.2× faster. A float32 ``F.linear`` goes to MKL's sgemm, which at a few rows
reads a large weight more slowly than oneDNN's kernel reads a packed one: on an AVX2-only AMD Zen 3,
[1,536 × 576] at 8 rows 1.8× faster packed, the output layer [49,152 × 576] 2.6×, at 700 rows and
for the small [576 × 576] and [192 × 576] weights the same; GRPO's rollouts 1.15-1.37× and the
router at 8 streams 1.31-1.49× faster (docs/performance.md).

``pack_linears(model)`` makes every ``nn.Linear`` of ``model`` a ``PackedLinear``: the same module
(its parameters, hooks, state dict and PEFT's wrapping are untouched) whose forward multiplies from
a packed copy of the weight where nothing needs its gradient: float32 or bfloat16 weights on the
CPU, autograd off or neither the input nor the weight requiring a gradient (the frozen base of a
LoRA run and a served model: generation, evaluation, the router). Under autograd it is
``nn.Linear``'s forward, so a loss and its gradients are computed as before. The copy is made at
the first such call (a process that only trains pays no memory for it: about the base's linear
weights again, 270 MB in bfloat16 and 540 MB in float32 for SmolLM2-135M) and made again when the
weight changes (in place, as merging an adapter does, or replaced). Other dtypes and devices, a
torch built without oneDNN and, for bfloat16, a CPU without oneDNN's bfloat16 path keep the plain
product.

The packed product sums in another order than the per-call one, so its outputs may differ in the
last place; every path that decodes without autograd (rollouts, evaluation, the router) uses it
alike, so a completion is scored as it is served.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from torch import nn

# Off only to measure it (the plain per-call product everywhere); the environment variable reaches
# the processes a bench starts (``bench/throughput.py --unpacked``).
PACKED = os.environ.get("TRACEFIX_PACKED_LINEAR", "1") != "0"
_ROWS_HINT = 16  # the rows oneDNN picks its blocking for; any number of rows multiplies correctly


@functools.cache
def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch can multiply ``dtype`` from packed weights on this CPU: a build with oneDNN;
    float32 on any CPU it runs on, bfloat16 only on a CPU that has oneDNN's bfloat16 path (AVX-512
    BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU, such as AMD Zen 3, has not, and there bfloat16
    weights stay plain)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packs(weight: torch.Tensor, input: torch.Tensor) -> bool:
    """Whether a product of ``input`` with ``weight`` is multiplied from a packed weight here: both
    of one dtype that packs on this CPU, packing on (the caller sees to it that no gradient flows)."""
    return PACKED and weight.dtype == input.dtype and weight.device.type == "cpu" and available(weight.dtype)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in]) reordered once into oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_size=_ROWS_HINT)


def packed_product(input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(input, weight, bias)`` from ``pack(weight)``, for any leading shape of ``input``."""
    leading = input.shape[:-1]
    rows = input.reshape(-1, input.shape[-1]).contiguous()
    output = torch.ops.mkldnn._linear_pointwise(rows, packed, None if bias is None else bias.detach(), "none", [], "")
    return output.reshape(*leading, output.shape[-1])


class PackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies float32 and bfloat16 CPU inputs from a packed copy of its weight
    where no gradient flows through the product (see the module)."""

    _packed: Any = None
    _packed_of: tuple[Any, int, int] | None = None  # the weight it was packed from: (it, its address, its version)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if not packs(weight, input):
            return super().forward(input)
        if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad or (self.bias is not None and self.bias.requires_grad)):
            return super().forward(input)
        packed_of = self._packed_of
        if packed_of is None or packed_of[0] is not weight or packed_of[1:] != (weight.data_ptr(), weight._version):
            self._packed = pack(weight)
            self._packed_of = (weight, weight.data_ptr(), weight._version)
        return packed_product(input, self._packed, self.bias)

    def __getstate__(self) -> dict[str, Any]:
        # The packed copy is a cache that oneDNN's opaque tensors cannot copy or pickle: a deep
        # copy or a saved module leaves it out and packs its own weight at its first use.
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        state.pop("_packed_of", None)
        return state


def pack_linears(model: nn.Module) -> None:
    """Make each plain ``nn.Linear`` under ``model`` a ``PackedLinear``, in place (nothing where
    this torch cannot pack). Its weights are packed at their first use without autograd."""
    if not available(torch.float32):
        return
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
