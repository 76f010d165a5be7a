"""Training-step speed: our model vs HF MarianMTModel at the same configuration.

Runs on `--device` (default: a CUDA GPU when one is present, else the CPU), named in the header. Both models get
the same random batch (sources and targets of the given lengths, no padding), the same optimizer (Adam) and the same
loss (label-smoothed cross-entropy 0.1 computed from the logits, as Seq2SeqTrainer does); we time forward + backward +
optimizer step, in fp32 and (where the device has native bf16) under bf16 autocast, with each model's default
attention (SDPA) and with eager attention: PyTorch's CPU SDPA backward is several times slower in bf16 than in fp32,
so on a CPU bf16 pays only with eager attention (`--attn_implementation eager`). On a CPU each setting runs first with
glibc's default allocator, then with freed memory kept in the process, as `scripts/train.py` does on a CPU
(`keep_freed_cpu_memory`); on a GPU once, with PyTorch's CUDA caching allocator.

Model FLOPs per step are `vaswani_transformer.flops.model_flops_per_target_token` of the configuration at the batch's
lengths x its target tokens (the same count for both models: the same configuration); MFU divides the achieved model
FLOP/s by the matrix-product peak of the precision used (bf16 autocast: the bf16 peak), measured in the same run with
the same torch threads (`measure_matmul_peak`) on the same device. Each (setting, model) runs in the same alternating
order (Marian, ours, Marian, ours...): on a CPU in its own child process, so that its peak RSS
(`device.peak_rss_mib`) is its own; on a GPU in this process (a new one would spend longer starting CUDA than timing)
with PyTorch's peak of allocated GPU memory reset per setting, and attention kept off cuDNN's kernel for both models
as the training job does (`trainer.skip_cudnn_attention`).

    python benchmarks/training_step_speed.py --d-model 256 --layers 3 --heads 4 --d-ff 1024 --vocab 8000
"""

import argparse
import copy
import json
import resource
import subprocess
import sys

import torch
from device import add_device_argument, check_device, describe, matmul_peaks, memory_label, now, peak_memory_mib
from device import reset_peak_memory
from transformers import MarianConfig, MarianMTModel

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.flops import model_flops_per_target_token, model_flops_utilization
from vaswani_transformer.hardware import has_native_bf16
from vaswani_transformer.modeling_vaswani_transformer import shift_tokens_right
from vaswani_transformer.hardware import keep_freed_cpu_memory
from vaswani_transformer.trainer import skip_cudnn_attention


def bf16_note(requested: str, native: bool) -> str:
    """The header's note on bf16 autocast for `--bf16 requested` on a device with or without native bf16: why it is
    not timed, or that it is timed emulated; empty where it is timed natively."""
    if requested == "no":
        return " (bf16 not timed: --bf16 no)"
    if native:
        return ""
    if requested == "yes":
        return " (bf16 timed as --bf16 yes asks, though emulated on this device: far slower than fp32)"
    return " (bf16 skipped: emulated on this device, far slower than fp32)"


def build(kind: str, args, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "marian":
        config = MarianConfig(
            vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
            encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=args.d_ff,
            decoder_ffn_dim=args.d_ff, activation_function="relu", scale_embedding=True, dropout=0.1,
            max_position_embeddings=512, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2,
        )  # fmt: skip
        config._attn_implementation = attention
        return MarianMTModel(config)
    config = VaswaniTransformerConfig(
        vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        num_heads=args.heads, d_ff=args.d_ff,
    )  # fmt: skip
    config._attn_implementation = attention
    return VaswaniTransformerForConditionalGeneration(config)


def time_steps(model, batch, steps: int, bf16: bool, device: torch.device) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    model.train()
    timings = []
    for step in range(steps + 2):
        start = now(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), batch["labels"].flatten(), label_smoothing=0.1
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:  # warm-up steps are not timed
            timings.append(now(device) - start)
    timings.sort()
    return timings[len(timings) // 2]


def make_batch(args, device: torch.device) -> dict[str, torch.Tensor]:
    """The same random batch (no padding) for both models, from a fixed seed, on `device`."""
    generator = torch.Generator().manual_seed(0)
    ids = lambda: torch.randint(4, args.vocab, (args.batch, args.length), generator=generator)  # noqa: E731
    source, labels = ids(), ids()
    batch = {"input_ids": source, "labels": labels, "decoder_input_ids": shift_tokens_right(labels, 0, 1)}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def memory_now_mib(device: torch.device) -> float:
    """Allocated GPU memory now (CUDA), or this process's resident set size now (CPU: Linux /proc; elsewhere the
    peak so far), MiB."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return peak_memory_mib(device)


def child(args) -> dict:
    """Time one (model, precision, attention, allocator) setting (on a CPU in a fresh process)."""
    kind, precision, attention, memory = args.child.split(",")
    if memory == "kept" and not keep_freed_cpu_memory():
        return {"unavailable": True}  # not glibc: no such setting
    device = check_device(args.device)
    if device.type == "cuda":
        skip_cudnn_attention()  # as train.py does on a GPU, for both models
    batch = make_batch(args, device)
    model = build(kind, args, attention).to(device)
    before = memory_now_mib(device)  # imports, model and batch: what the training steps add comes on top
    reset_peak_memory(device)
    seconds = time_steps(model, batch, args.steps, precision == "bf16", device)
    return {"seconds": seconds, "before_mib": before, "peak_mib": peak_memory_mib(device)}


def run_child(args, kind: str, precision: str, attention: str, memory: str) -> dict:
    """Run `child` in a new Python process with the same model options, torch threads and device; in this one on a
    GPU, where a process costs more than a setting's steps (CUDA's start) and peak memory is reset per setting."""
    if check_device(args.device).type == "cuda":
        own = copy.copy(args)
        own.child = f"{kind},{precision},{attention},{memory}"
        return child(own)
    options = ["--d-model", args.d_model, "--layers", args.layers, "--heads", args.heads, "--d-ff", args.d_ff,
               "--vocab", args.vocab, "--batch", args.batch, "--length", args.length, "--steps", args.steps,
               "--threads", torch.get_num_threads(), "--device", args.device,
               "--child", f"{kind},{precision},{attention},{memory}"]  # fmt: skip
    done = subprocess.run([sys.executable, __file__, *map(str, options)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {kind} {precision} {attention} {memory} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto",
                        help="also time bf16 autocast; auto: only where the device has native bf16 "
                             "(CPU: AVX-512 BF16/AMX; GPU: Ampere on)")  # fmt: skip
    parser.add_argument("--peak-seconds", type=float, default=2.0,
                        help="seconds of square matrix products (2048 on a CPU, 8192 on a GPU) per precision "
                             "for the measured peak (default 2)")  # fmt: skip
    add_device_argument(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: one setting in a fresh process
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return print(json.dumps(child(args)))
    device = check_device(args.device)
    native_bf16 = has_native_bf16(device.type)
    with_bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and native_bf16)

    tokens = args.batch * args.length
    config = VaswaniTransformerConfig(vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers,
                                      decoder_layers=args.layers, num_heads=args.heads, d_ff=args.d_ff)  # fmt: skip
    step_flops = model_flops_per_target_token(config, args.length, args.length) * tokens
    precisions = ["fp32"] + (["bf16"] if with_bf16 else [])
    size, peak = matmul_peaks(precisions, device, args.peak_seconds)
    print(f"batch {args.batch} x {args.length} tokens per side, d_model {args.d_model}, {args.layers}+{args.layers} layers, "
          f"h {args.heads}, d_ff {args.d_ff}, vocab {args.vocab}, {describe(device)}"
          f"{bf16_note(args.bf16, native_bf16)}")
    print(f"model FLOPs per step {step_flops / 1e9:.3g} GFLOP ({step_flops / tokens / 1e6:.1f} MFLOP per target "
          "token); "
          f"measured {size}^3 matmul peak " + ", ".join(f"{p} {peak[p] / 1e9:.0f} GFLOP/s" for p in precisions))
    on_cpu = device.type == "cpu"
    print(f"| model | precision | attention | {'CPU' if on_cpu else 'GPU'} memory | ms / step | target tokens / s "
          f"| speed-up vs first row | GFLOP/s | MFU | {memory_label(device)} ({'RSS' if on_cpu else 'allocated'} "
          "before first step) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    settings = [("fp32", "sdpa"), ("fp32", "eager")] + ([("bf16", "sdpa"), ("bf16", "eager")] if with_bf16 else [])
    reference = None
    # on a CPU glibc's default allocator first, then freed memory kept in the process as train.py does on CPU; on a
    # GPU PyTorch's caching allocator only. Each (setting, model) in its own process, Marian and ours alternating.
    allocators = ({"default": "glibc default", "kept": "kept (train.py)"} if on_cpu
                  else {"cuda": "CUDA caching allocator"})  # fmt: skip
    for memory, allocator in allocators.items():
        for precision, attention in settings:
            for kind in ("marian", "vaswani"):
                result = run_child(args, kind, precision, attention, memory)
                if result.get("unavailable"):
                    return
                seconds = result["seconds"]
                reference = reference or seconds
                mfu = model_flops_utilization(step_flops, seconds, peak[precision])
                print(f"| {kind} | {'bf16 autocast' if precision == 'bf16' else 'fp32'} | {attention} | "
                      f"{allocator} | {seconds * 1000:.0f} | "
                      f"{tokens / seconds:,.0f} | {reference / seconds:.2f}x | {step_flops / seconds / 1e9:.3g} | "
                      f"{mfu:.0%} | {result['peak_mib']:,.0f} ({result['before_mib']:,.0f}) |", flush=True)


if __name__ == "__main__":
    main()
