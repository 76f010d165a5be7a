"""Which half precisions a device multiplies in hardware, and a warning where a model runs in one it only emulates.

On a CPU without the instructions, PyTorch multiplies bf16 and fp16 matrices in software: a 64 x 512 x 2048 product
took 5.6 ms in bf16 against 1.3 ms in float32 on an AMD EPYC Zen 5 with ATen and oneDNN held to AVX2 (one thread),
and 5.7 ms in fp16 on the same CPU as it is (it has AVX-512 BF16, 0.33 ms, but no AVX-512 FP16). Training picks bf16
only where it is native (`--bf16_where_native`); a model or a run asked for in a half precision elsewhere is warned.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import torch

from .modeling_vaswani_transformer import cpuinfo_field

logger = logging.getLogger(__name__)


def multiplies_natively(dtype: torch.dtype, device_type: str) -> bool:
    """Whether `device_type` ("cpu", "cuda", ...) multiplies `dtype` matrices in hardware. bf16: CPUs with AVX-512
    BF16 or AMX (where torch's oneDNN is enabled and may use them), CUDA GPUs from Ampere on; fp16: CPUs with AVX-512
    FP16 or AMX-FP16 (the same), any CUDA GPU; float32/float64 everywhere. Other devices (MPS, XPU) are taken at their
    word: True."""
    if dtype not in (torch.bfloat16, torch.float16):
        return True
    if device_type == "cuda":
        if dtype == torch.float16:
            return torch.cuda.is_available()
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type != "cpu":
        return True
    # the instructions, and oneDNN (torch's only path for half-precision products on a CPU) allowed to use them:
    # disabled (`torch.backends.mkldnn.enabled = False`) or held below them (ONEDNN_MAX_CPU_ISA), it emulates them
    # ~150x slower than float32
    library = "_is_mkldnn_bf16_supported" if dtype == torch.bfloat16 else "_is_mkldnn_fp16_supported"
    onednn = torch.backends.mkldnn.enabled and getattr(torch.ops.mkldnn, library, lambda: True)()
    if dtype == torch.bfloat16:
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own CPUID checks
        return onednn and any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    amx_fp16 = getattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)()
    return onednn and (amx_fp16 or "avx512_fp16" in cpuinfo_field("flags").split())


def has_native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu", "cuda") multiplies bf16 matrices in hardware (see `multiplies_natively`); False
    for devices whose bf16 we do not know (training then stays in fp32, which is never the slow choice)."""
    return device_type in ("cpu", "cuda") and multiplies_natively(torch.bfloat16, device_type)


def emulated_precision_warning(dtype: torch.dtype, device_type: str, what: str, remedy: str) -> str | None:
    """A one-line warning when `what` (a model, a training run) computes in `dtype` on a device that only emulates it
    (ending in `remedy`, what to do instead), else None."""
    if multiplies_natively(dtype, device_type):
        return None
    name = str(dtype).removeprefix("torch.")
    if device_type == "cuda":  # only bf16 gets here: GPUs before Ampere
        where, lacks = "a CUDA GPU", "bf16 arrived with Ampere"
    else:
        where, lacks = "a CPU", "it lacks " + ("AVX-512 BF16 and AMX" if dtype == torch.bfloat16 else
                                              "AVX-512 FP16 and AMX-FP16")  # fmt: skip
    return (f"{what} runs in {name} on {where} that multiplies {name} in software ({lacks}): several times slower "
            f"than float32 here; {remedy}.")


def warn_if_emulated(model: torch.nn.Module, what: str, remedy: str) -> str | None:
    """Log `emulated_precision_warning` for `model`'s parameters on their device; returns the warning (or None)."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return None
    warning = emulated_precision_warning(parameter.dtype, parameter.device.type, what, remedy)
    if warning:
        logger.warning(warning)
    return warning


# glibc's mallopt parameters (malloc.h) and the value set for both: 1 GiB.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _KEEP_BYTES = -1, -3, 1 << 30


def keep_freed_cpu_memory() -> bool:
    """Make glibc's malloc keep freed blocks of up to 1 GiB in the process instead of returning them to the OS.

    Every training step allocates and frees the same large tensors (a batch's logits are 32 MB at 1k tokens x 8k
    vocabulary), and so do decoding steps and each `generate` call's packing of the weights. By default glibc serves
    blocks over 32 MB with mmap and unmaps them when freed, and returns the top of the heap past 128 kB, so every
    step faults fresh zeroed pages back in (packing WMT's 37,000 x 512 output layer: 42 ms, 13 ms with freed memory
    kept). The cost is memory the process keeps between steps (about one step's peak). Returns False where the C
    library has no ``mallopt`` (not glibc).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, TypeError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


__all__ = [
    "emulated_precision_warning", "has_native_bf16", "keep_freed_cpu_memory", "multiplies_natively", "warn_if_emulated",
]
