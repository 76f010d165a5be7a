"""Training-step scaling of our model: step time against tokens per batch and against sentence length.

One training step is forward + backward + Adam update (label-smoothed cross-entropy 0.1 from the logits, as
`training_step_speed.py`), on random batches without padding: sources and targets of the same length L.

(a) tokens per batch at a fixed sentence length: step time should grow linearly (a fixed cost per step plus a cost
    per token); the table gives tokens/s per row and a least-squares line ms = intercept + slope x tokens.
(b) sentence length at a fixed number of tokens per batch (batch = tokens // L sentences): the per-token cost of the
    projections, FFN and output layer does not depend on L, attention's does (n^2 per sentence, so n per token);
    the rising time per token shows the attention part. The model-FLOPs column (`flops.model_flops_per_target_token`
    at that length) is what the count predicts, relative to the first row.

Runs on `--device` (default: a CUDA GPU when one is present, else the CPU), named in the header and the figure's
title. fp32 by default; `--bf16` adds the same rows under bf16 autocast (worth it only where the device has native
bf16: a CPU with AVX512_BF16 or AMX, a GPU from Ampere on; a note is printed where it has not). One process, warm-up
steps before each row, the median of the timed steps; on a CPU freed memory is kept in the process as
`scripts/train.py` does. A PNG with the two panels is written to `--output`.

    python benchmarks/training_scaling.py --threads 2 --output training_scaling.png
"""

import argparse
import datetime
import os
import statistics

import numpy as np
import torch
from device import add_device_argument, check_device, describe, matmul_peaks, now

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.flops import model_flops_per_target_token, model_flops_utilization
from vaswani_transformer.hardware import has_native_bf16
from vaswani_transformer.modeling_vaswani_transformer import shift_tokens_right
from vaswani_transformer.hardware import keep_freed_cpu_memory
from vaswani_transformer.trainer import skip_cudnn_attention


def integers(text: str) -> list[int]:
    """A comma-separated list of positive integers."""
    values = [int(value) for value in text.split(",") if value.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers separated by commas, got {text!r}")
    return values


def make_batch(sentences: int, length: int, vocab: int, generator: torch.Generator,
               device: torch.device) -> dict[str, torch.Tensor]:  # fmt: skip
    """`sentences` random source/target pairs of `length` tokens each (no padding), on `device`."""
    source = torch.randint(4, vocab, (sentences, length), generator=generator)
    labels = torch.randint(4, vocab, (sentences, length), generator=generator)
    batch = {"input_ids": source, "labels": labels, "decoder_input_ids": shift_tokens_right(labels, 0, 1)}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def step_seconds(model, optimizer, batch, warmup: int, steps: int, bf16: bool, device: torch.device) -> float:
    """Median seconds of `steps` training steps on `batch`, after `warmup` untimed ones."""
    timings = []
    for step in range(warmup + steps):
        start = now(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(),
                                                 label_smoothing=0.1)  # fmt: skip
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= warmup:
            timings.append(now(device) - start)
    return statistics.median(timings)


def fit_line(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares y = intercept + slope x: (intercept, slope, R^2)."""
    slope, intercept = np.polyfit(x, y, 1)
    predicted = intercept + slope * np.asarray(x)
    residual = float(np.sum((np.asarray(y) - predicted) ** 2))
    total = float(np.sum((np.asarray(y) - np.mean(y)) ** 2))
    return float(intercept), float(slope), 1.0 - residual / total if total > 0 else 1.0


def plot(path: str, title: str, sweeps: dict) -> None:
    """Two panels: step time against tokens per batch (with the fitted lines), time per token against length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for precision, sweep in sweeps.items():
        tokens = [row["tokens"] for row in sweep["tokens"]]
        ms = [row["seconds"] * 1000 for row in sweep["tokens"]]
        (line,) = left.plot(tokens, ms, "o", label=f"{precision} measured")
        intercept, slope, r2 = sweep["fit"]
        span = np.linspace(0, max(tokens), 50)
        left.plot(span, intercept + slope * span, "--", color=line.get_color(),
                  label=f"{precision} fit: {intercept:.0f} ms + {slope * 1000:.1f} ms / 1k tokens, R² {r2:.3f}")
        lengths = [row["length"] for row in sweep["lengths"]]
        us = [row["seconds"] / row["tokens"] * 1e6 for row in sweep["lengths"]]
        right.plot(lengths, us, "o-", color=line.get_color(), label=f"{precision} measured")
        rate = statistics.median(row["flops_per_token"] * row["tokens"] / row["seconds"] for row in sweep["lengths"])
        right.plot(lengths, [row["flops_per_token"] / rate * 1e6 for row in sweep["lengths"]], ":",
                   color=line.get_color(), label=f"{precision}: model FLOPs at the median rate")  # fmt: skip
    left.set(xlabel="target tokens per batch", ylabel="ms per training step", title="(a) step time vs batch size")
    right.set(xlabel="sentence length (source = target)", ylabel="µs per target token", xscale="log",
              title="(b) time per token vs sentence length")  # fmt: skip
    right.set_xticks(lengths, [str(n) for n in lengths])
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    left.set_xlim(left=0)
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=256, help="default: configs/multi30k_cpu.yaml's model")
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--attn-implementation", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument("--length", type=int, default=24, help="sentence length of sweep (a) (default 24)")
    parser.add_argument("--tokens", type=integers, default=integers("256,512,1024,2048,4096"),
                        help="target tokens per batch of sweep (a), comma-separated")  # fmt: skip
    parser.add_argument("--batch-tokens", type=int, default=2048, help="target tokens per batch of sweep (b)")
    parser.add_argument("--lengths", type=integers, default=integers("8,16,32,64,128,256,512"),
                        help="sentence lengths of sweep (b), comma-separated")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before each row (default 2)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row, median reported (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    add_device_argument(parser)
    parser.add_argument("--bf16", action="store_true", help="also run every row under bf16 autocast")
    parser.add_argument("--peak-seconds", type=float, default=2.0,
                        help="seconds of square matrix products (2048 on a CPU, 8192 on a GPU) per precision "
                             "for the measured peak (default 2)")  # fmt: skip
    parser.add_argument("--output", default="training_scaling.png",
                        help="PNG to write (default: training_scaling.png in the current folder)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch_tokens < max(args.lengths):
        parser.error("need --steps >= 1, --warmup >= 0 and --batch-tokens >= the longest of --lengths")
    torch.set_num_threads(args.threads)
    device = check_device(args.device)
    # glibc's malloc setting of train.py on a CPU; a GPU's tensors live in PyTorch's CUDA caching allocator, and its
    # attention skips cuDNN's kernel as train.py's does (trainer.skip_cudnn_attention)
    memory = f"freed memory kept: {keep_freed_cpu_memory()}" if device.type == "cpu" else "CUDA caching allocator"
    if device.type == "cuda":
        skip_cudnn_attention()

    config = VaswaniTransformerConfig(vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers,
                                      decoder_layers=args.layers, num_heads=args.heads, d_ff=args.d_ff)  # fmt: skip
    config._attn_implementation = args.attn_implementation
    precisions = ["fp32"] + (["bf16"] if args.bf16 else [])
    size, peak = matmul_peaks(precisions, device, args.peak_seconds)
    cores = f", {os.cpu_count()} cores" if device.type == "cpu" else ""
    title = (f"d_model {args.d_model}, {args.layers}+{args.layers} layers, h {args.heads}, d_ff {args.d_ff}, "
             f"vocab {args.vocab}, {args.attn_implementation}; {describe(device)}{cores}; "
             f"{datetime.date.today()}")  # fmt: skip
    print(f"{title}; {memory}")
    if args.bf16 and not has_native_bf16(device.type):
        print("note: bf16 is emulated on this device, slower than fp32")
    print(f"measured {size}^3 matmul peak: " + ", ".join(f"{p} {peak[p] / 1e9:.0f} GFLOP/s" for p in precisions))

    generator = torch.Generator().manual_seed(0)
    sweeps = {}
    for precision in precisions:
        torch.manual_seed(0)
        model = VaswaniTransformerForConditionalGeneration(config).to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

        def row(sentences: int, length: int) -> dict:
            batch = make_batch(sentences, length, args.vocab, generator, device)
            seconds = step_seconds(model, optimizer, batch, args.warmup, args.steps, precision == "bf16", device)
            tokens = sentences * length
            per_token = model_flops_per_target_token(config, length, length)
            return {"sentences": sentences, "length": length, "tokens": tokens, "seconds": seconds,
                    "flops_per_token": per_token,
                    "mfu": model_flops_utilization(per_token * tokens, seconds, peak[precision])}  # fmt: skip

        print(f"\n(a) {precision}: tokens per batch at sentence length {args.length}")
        print("| sentences x length | target tokens | ms / step | target tokens / s | MFU |")
        print("| --- | --- | --- | --- | --- |")
        by_tokens = []
        for tokens in args.tokens:
            result = row(max(1, tokens // args.length), args.length)
            by_tokens.append(result)
            print(f"| {result['sentences']} x {args.length} | {result['tokens']} | {result['seconds'] * 1000:.0f} | "
                  f"{result['tokens'] / result['seconds']:,.0f} | {result['mfu']:.0%} |", flush=True)  # fmt: skip
        fit = fit_line([r["tokens"] for r in by_tokens], [r["seconds"] * 1000 for r in by_tokens])
        print(f"line fit: ms / step = {fit[0]:.1f} + {fit[1] * 1000:.2f} x (target tokens / 1000), R^2 {fit[2]:.4f}")

        print(f"\n(b) {precision}: sentence length at {args.batch_tokens} target tokens per batch")
        print("| sentences x length | target tokens | ms / step | µs / target token | relative | "
              "model FLOPs / token (relative) | MFU |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        by_length = []
        for length in args.lengths:
            result = row(args.batch_tokens // length, length)
            by_length.append(result)
            first = by_length[0]
            us = result["seconds"] / result["tokens"] * 1e6
            relative_flops = result["flops_per_token"] / first["flops_per_token"]
            print(f"| {result['sentences']} x {length} | {result['tokens']} | {result['seconds'] * 1000:.0f} | "
                  f"{us:.0f} | {us / (first['seconds'] / first['tokens'] * 1e6):.2f} | "
                  f"{result['flops_per_token'] / 1e6:.1f}M ({relative_flops:.2f}) | "
                  f"{result['mfu']:.0%} |", flush=True)  # fmt: skip
        sweeps[precision] = {"tokens": by_tokens, "fit": fit, "lengths": by_length}

    plot(args.output, title, sweeps)
    print(f"\nplot written to {args.output}")


if __name__ == "__main__":
    main()
