"""Only the positions a loss reads go through the output layer.

A causal LM's forward pass ends with the output layer: hidden size × vocabulary (576 × 49,152 for
SmolLM2-135M) for every position, then a log-softmax over the vocabulary. The training losses read
a fraction of the positions: the warm start the demonstrations' labelled tokens, GRPO the
policy's own tokens (42 % of a demonstration's tokens after its opening on the airline agent; the
rest are instructions' end, tool results and padding). So the losses run the decoder stack, take
its last hidden states at the positions they read and put only those through the output layer
(``trainer.shared_prefix``, ``trainer.policy_loss``). A row's logits are the same computation
either way, and so are the gradients: equal to the bit on the CPU (`bench/warm_start_prefix.py`
checks it), and an update of the warm start takes 1.2× less time (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

SCORED_ONLY = True  # off only to measure it: every position through the output layer, as before

# Config keys of models whose logits are more than the output layer's (softcapped, scaled).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The decoder stack and the output layer under ``model``'s PEFT wrapper, or None where the
    whole forward pass must run: ``SCORED_ONLY`` off, or a model that does more to its logits than
    the output layer."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not SCORED_ONLY or any(getattr(base.config, key, None) for key in _LOGIT_TRANSFORMS):
        return None
    return base.get_decoder(), base.get_output_embeddings()


def contiguous_head_input(model: Any) -> Any:
    """Makes the input of ``model``'s output layer contiguous before it is multiplied; returns the
    hook's handle.

    Transformers passes the output layer ``hidden[:, -k:]`` where only the last ``k`` positions'
    logits are wanted (``logits_to_keep``: a prefill that only needs the next token). torch's
    matmul folds a [rows, k, hidden] input into one product where its leading dimensions are
    contiguous or the weight takes a gradient; a frozen output layer (a LoRA run's base, a served
    model) given a slice of a longer sequence gets neither, so it multiplies row by row against the
    weight expanded to [rows, hidden, vocab], a copy of the whole output layer per row (906 MB for
    16 rows of SmolLM2-135M in bfloat16: 2.2 s of a profiled 16-seed evaluation,
    docs/performance.md). Copying the slice (rows × k × hidden) first makes it the one product it is."""
    head = model.get_output_embeddings()
    return head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))


def scored_logits(model: Any, inputs: dict[str, Any], where: Any) -> Any:
    """The logits of ``model``'s forward pass over ``inputs`` at the positions ``where`` (a boolean
    [rows, W'] over its first W' positions), [k, V] row by row. Only those positions go through the
    output layer; a model whose logits are more than the output layer's runs whole and they are
    picked from it."""
    parts = _decoder_and_head(model)
    if parts is None:
        return model(**inputs).logits[:, : where.shape[1]][where]
    decoder, head = parts
    return head(decoder(**inputs).last_hidden_state[:, : where.shape[1]][where])
