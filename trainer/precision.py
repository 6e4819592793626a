"""The float type the model runs in: bfloat16 where the hardware multiplies it natively, else float32.

A CPU multiplies bfloat16 natively with Intel's AMX tiles (``amx_bf16``) or AVX-512 BF16
(``avx512_bf16``: Intel Cooper Lake and later, AMD Zen 4 and later); a GPU where CUDA says so.
There the frozen base model's weights and activations are bfloat16 and its matrix products run on
those units; the LoRA weights and the optimizer's state stay float32 (PEFT keeps an adapter in
float32 beside a bfloat16 base), as mixed-precision training does on a GPU. Elsewhere bfloat16
would be emulated, slower than float32, so ``auto`` keeps float32 there and an explicit
``bfloat16`` is refused with a message that says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names for the native instructions
_CPUINFO = Path("/proc/cpuinfo")


class UnsupportedDtype(ValueError):
    """The configured dtype cannot run natively on this device; the message says what to set."""


def cpu_flags(cpuinfo: Path = _CPUINFO) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (the first ``flags`` line), empty where there is
    no /proc/cpuinfo (then ``auto`` keeps float32)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_bfloat16(flags: frozenset[str] | None = None) -> str | None:
    """The flag that gives this CPU native bfloat16 products (AMX first), or None."""
    flags = cpu_flags() if flags is None else flags
    return next((flag for flag in BFLOAT16_FLAGS if flag in flags), None)


def resolve(setting: str, device: str, flags: frozenset[str] | None = None) -> str:
    """"float32" or "bfloat16" for a ``dtype`` setting on ``device`` ("cpu" or "cuda"): ``auto`` is
    bfloat16 where the device multiplies it natively; an explicit "bfloat16" where it does not is an
    ``UnsupportedDtype``."""
    if setting == "float32":
        return "float32"
    if setting not in ("auto", "bfloat16"):
        raise UnsupportedDtype(f"dtype {setting!r} is not one of 'auto', 'float32', 'bfloat16'")
    if device == "cuda":
        import torch

        native = torch.cuda.is_bf16_supported()
        where = f"GPU {torch.cuda.get_device_name()}"
    else:
        native = cpu_bfloat16(flags) is not None
        where = "this CPU (it has neither amx_bf16 nor avx512_bf16 in /proc/cpuinfo)"
    if native:
        return "bfloat16"
    if setting == "bfloat16":
        raise UnsupportedDtype(f"dtype = 'bfloat16', but {where} has no native bfloat16 products: it would run emulated,"
                               " slower than float32; set dtype = 'auto' or 'float32'")  # fmt: skip
    return "float32"


def check_settings(model_dtype: str, training_dtype: str, training_device: str) -> None:
    """Raise ``UnsupportedDtype`` at start-up for what a job would refuse later: ``[model] dtype`` (the
    validation gate runs the base model on the CPU) and ``[training] dtype`` on its device. A GPU's
    answer is left to the job: a ``cuda`` device is not looked at here, and ``auto`` only where the
    CPU alone would refuse (then torch is asked whether CUDA can run the job instead)."""
    try:
        resolve(model_dtype, "cpu")
    except UnsupportedDtype as error:
        raise UnsupportedDtype(f"[model] {error}") from None
    if training_device == "cuda":
        return
    try:
        resolve(training_dtype, "cpu")
    except UnsupportedDtype as error:
        if training_device == "auto":
            import torch

            if torch.cuda.is_available():
                return
        raise UnsupportedDtype(f"[training] {error}") from None


def torch_dtype(name: str) -> Any:
    """The torch dtype of a resolved name."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
