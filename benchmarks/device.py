"""The device a benchmark runs on: one `--device` option for every benchmark (a CUDA GPU when there is one, else the
CPU), the device named in each table's header, timers that wait for the device, and peak memory of the device.

On a CPU peak memory is the process's peak RSS (`peak_rss_mib`; each setting runs in its own process where a
benchmark compares them); on a CUDA GPU it is PyTorch's peak of allocated device memory since `reset_peak_memory`.
"""

import argparse
import resource
import time

import torch


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=default_device(),
                        help="cpu or cuda[:N] (default: cuda when a GPU is present, else cpu)")  # fmt: skip


def check_device(name: str) -> torch.device:
    """`name` as a torch.device; a clear error for a CUDA device that is not there."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {name}: no CUDA GPU is available here (torch {torch.__version__}).")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"error: --device {name}: the benchmarks run on cpu or cuda.")
    return device


def describe(device: torch.device) -> str:
    """The device in words for a table's header: the GPU's name, or the CPU's capability and torch threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return (f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}")  # fmt: skip


def peak_matmul_size(device: torch.device) -> int:
    """Side of the square products that measure a matrix-product peak (`flops.measure_matmul_peak`): 2048 on a CPU;
    8192 on a GPU, where a 2048^3 product takes tens of microseconds and launches would count."""
    return 8192 if device.type == "cuda" else 2048


def matmul_peaks(precisions: list[str], device: torch.device, seconds: float = 2.0) -> tuple[int, dict[str, float]]:
    """(side of the products, {precision: FLOP/s}): the matrix-product peak of each of "fp32" / "bf16" on `device`,
    measured now (`flops.measure_matmul_peak`), against which a benchmark's MFU is computed."""
    from vaswani_transformer.flops import measure_matmul_peak

    size = peak_matmul_size(device)
    dtypes = {"fp32": "float32", "bf16": "bfloat16"}
    return size, {p: measure_matmul_peak(dtypes[p], size, seconds, str(device)) for p in precisions}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """A wall-clock timestamp taken after the device's queued work has finished."""
    synchronize(device)
    return time.perf_counter()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> float:
    """Peak allocated GPU memory since `reset_peak_memory` (CUDA), or the process's peak RSS (CPU), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


def peak_rss_mib() -> float:
    """This program's peak resident set size, MiB: `VmHWM` of /proc/self/status on Linux.

    Not getrusage's `ru_maxrss`: Linux carries the parent's peak over into a child started with fork (or vfork) and
    exec, so a benchmark's child process would report at least its parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere (KiB on Linux and BSDs)


def memory_label(device: torch.device) -> str:
    return "peak GPU memory MiB" if device.type == "cuda" else "peak RSS MiB"
