"""Training cost in the manner of Table 2: model FLOPs counted from the configuration.

Convention: one multiply-add is 2 FLOPs; training (forward + backward) is 3x the forward pass. Counted: the
attention projections (Q, K, V, output), attention scores (QK^T) and weighted sums (softmax x V), the two FFN
matrices and the output layer over the vocabulary. Free: embedding look-ups, positional encodings, softmax,
layer norms, biases, residual additions, dropout and the loss. Decoder self-attention under the causal mask counts
the (T + 1) / 2 keys a target position sees on average; the encoder-decoder attention projects the encoder output
to keys and values once per decoder layer (a cost per source token).

The paper's Table 2 figures are not model FLOPs: they are training time x number of GPUs x each GPU's sustained
single-precision rate (footnote 5: 9.5 TFLOPS for a P100), i.e. what the hardware could have done. The model
FLOPs of the same runs, divided by those figures, are the utilisation the runs implicitly had.

``python -m vaswani_transformer.flops`` prints the base/big comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAINING_MULTIPLIER = 3  # backward = 2x forward (gradients with respect to activations and to weights)

# The paper's runs (Sections 5.1, 5.2, Table 2): 8 P100 GPUs, ~25k source + 25k target tokens per batch.
PAPER_TOKENS_PER_BATCH = 25_000
PAPER_STEPS = {"base": 100_000, "big": 300_000}
PAPER_REPORTED_FLOPS = {"base": 3.3e18, "big": 2.3e19}
PAPER_VOCAB_SIZE = 37_000  # shared source-target BPE vocabulary of WMT 2014 English-German
# Average tokens per sentence on each side (our assumption; the paper does not state it): WMT14 en-de with a 37k
# BPE is ~25 subwords per sentence, and the count per target token barely depends on it (attention terms are small).
PAPER_AVERAGE_LENGTH = 25.0


def _dims(config) -> tuple[int, int, int, int, int, int, int, int]:
    """(d_model, d_ff, heads, d_k, d_v, encoder layers, decoder layers, vocabulary) of a config."""
    return (config.d_model, config.d_ff, config.num_heads, config.head_dim_k, config.head_dim_v,
            config.encoder_layers, config.decoder_layers, config.vocab_size)  # fmt: skip


def forward_flops_per_sentence(config, source_length: float, target_length: float) -> float:
    """Forward FLOPs of one sentence pair of the given (average) source and target lengths."""
    if source_length <= 0 or target_length <= 0:
        raise ValueError(f"source_length and target_length must be positive, got {source_length}, {target_length}.")
    d, d_ff, h, d_k, d_v, n_enc, n_dec, vocab = _dims(config)
    s, t = float(source_length), float(target_length)
    qkvo = 2 * d * h * (2 * d_k + d_v) + 2 * h * d_v * d  # Q, K, V and output projections, per token
    ffn = 2 * 2 * d * d_ff  # two linear maps, per token

    def attend(keys: float) -> float:  # scores and weighted sums of one query over `keys` keys
        return 2 * keys * h * (d_k + d_v)

    encoder = n_enc * s * (qkvo + attend(s) + ffn)
    self_attention = qkvo + attend((t + 1) / 2)
    cross_query_side = 2 * d * h * d_k + 2 * h * d_v * d + attend(s)  # Q and output projections, scores, sums
    cross_memory = 2 * d * h * (d_k + d_v)  # K and V of each encoder output, per source token
    decoder = n_dec * (t * (self_attention + cross_query_side + ffn) + s * cross_memory)
    output_layer = t * 2 * d * vocab
    return encoder + decoder + output_layer


def model_flops_per_target_token(config, source_length: float, target_length: float) -> float:
    """Training (forward + backward) model FLOPs per target token at the given average sentence lengths."""
    return TRAINING_MULTIPLIER * forward_flops_per_sentence(config, source_length, target_length) / target_length


def training_flops(config, target_tokens: float, source_length: float, target_length: float) -> float:
    """Total training FLOPs of a run: target tokens trained on x FLOPs per target token."""
    if target_tokens < 0:
        raise ValueError(f"target_tokens must be >= 0, got {target_tokens}.")
    return target_tokens * model_flops_per_target_token(config, source_length, target_length)


def model_flops_utilization(flops: float, seconds: float, peak_flops_per_second: float) -> float:
    """Achieved model FLOPs per second over `peak_flops_per_second` (the peak of all devices used together)."""
    if not peak_flops_per_second > 0:
        raise ValueError(f"peak_flops_per_second must be positive, got {peak_flops_per_second}.")
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}.")
    return flops / seconds / peak_flops_per_second


def measure_matmul_peak(dtype="float32", size: int = 2048, seconds: float = 2.0, device: str = "cpu") -> float:
    """Measured FLOP/s of square `size` x `size` matrix products in `dtype` for about `seconds` (2 n^3 per product),
    with the torch threads currently set: the peak that a model FLOPs utilisation is measured against. In float32 on a
    CPU with oneDNN, the faster of torch's product and oneDNN's (each for half the time): the model's linear layers
    multiply float32 through oneDNN where MKL's product is the slower (AMD CPUs with AVX-512 from Zen 5 on: about half
    as fast)."""
    import time

    import torch

    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype or its name, got {dtype!r}.")
    if not (isinstance(size, int) and size > 0) or not seconds > 0:
        raise ValueError(f"size must be a positive int and seconds positive, got {size!r}, {seconds!r}.")
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device=device, dtype=dtype) for _ in range(2))
    on_gpu = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)
    out = torch.empty(size, size, device=device, dtype=dtype)
    products = [lambda: torch.mm(a, b, out=out)]
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if not on_gpu and dtype == torch.float32 and onednn:  # in bf16 torch's product is oneDNN's already
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))  # a b^T
    # A GPU runs products asynchronously: queue several between waits, so that the wait is not what gets measured.
    queued = 10 if on_gpu else 1
    rates = []
    for product in products:
        product()  # warm-up: kernel selection, first-touch of the output
        sync()
        count, start = 0, time.perf_counter()
        while True:
            for _ in range(queued):
                product()
            count += queued
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / len(products):
                rates.append(2.0 * size**3 * count / elapsed)
                break
    return max(rates)


def average_lengths(dataset, source_column: str = "source_length", target_column: str = "target_length"):
    """(mean source length, mean target length) in tokens of a tokenized map-style dataset, else None."""
    names = getattr(dataset, "column_names", None) or []
    if source_column not in names or target_column not in names or not hasattr(dataset, "__len__") or not len(dataset):
        return None  # a streamed dataset has no length to average over without reading it
    import pyarrow.compute as pc  # datasets' own storage: the mean without building Python lists

    columns = dataset.with_format("arrow")
    return float(pc.mean(columns[source_column]).as_py()), float(pc.mean(columns[target_column]).as_py())


def run_training_cost(config, dataset, target_tokens_seen) -> dict[str, float | None]:
    """``model_flops_per_target_token`` and ``training_flops`` of a run: its target tokens seen at the training
    set's average source and target lengths (None where either is unknown)."""
    lengths = average_lengths(dataset)
    per_token = model_flops_per_target_token(config, *lengths) if lengths else None
    total = float(target_tokens_seen * per_token) if per_token is not None and target_tokens_seen is not None else None
    return {"model_flops_per_target_token": per_token, "training_flops": total}


@dataclass
class PaperEstimate:
    """Our model-FLOPs estimate of one of the paper's runs next to the paper's Table 2 figure."""

    preset: str
    steps: int
    target_tokens: float
    flops_per_target_token: float
    flops: float
    paper_flops: float

    @property
    def implied_utilization(self) -> float:
        """Our count over the paper's figure (time x GPUs x peak): the utilisation the run implicitly had."""
        return self.flops / self.paper_flops


def paper_estimate(preset: str, average_length: float = PAPER_AVERAGE_LENGTH) -> PaperEstimate:
    """The estimate for the paper's `base` (100k steps) or `big` (300k) run, 25k target tokens per batch."""
    from .configuration_vaswani_transformer import VaswaniTransformerConfig

    if preset not in PAPER_STEPS:
        raise ValueError(f"preset must be one of {sorted(PAPER_STEPS)}, got {preset!r}.")
    config = VaswaniTransformerConfig.from_preset(preset, vocab_size=PAPER_VOCAB_SIZE)
    tokens = float(PAPER_STEPS[preset] * PAPER_TOKENS_PER_BATCH)
    per_token = model_flops_per_target_token(config, average_length, average_length)
    return PaperEstimate(preset, PAPER_STEPS[preset], tokens, per_token, tokens * per_token,
                         PAPER_REPORTED_FLOPS[preset])  # fmt: skip


def paper_table(average_length: float = PAPER_AVERAGE_LENGTH) -> str:
    """A Markdown table of the base/big estimates next to the paper's Table 2 figures."""
    lines = [
        "| model | steps | target tokens | FLOPs / target token | model FLOPs (ours) | Table 2 | ours / Table 2 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for preset in PAPER_STEPS:
        e = paper_estimate(preset, average_length)
        lines.append(f"| {preset} | {e.steps:,} | {e.target_tokens:.2e} | {e.flops_per_target_token:.3g} | "
                     f"{e.flops:.2e} | {e.paper_flops:.1e} | {e.implied_utilization:.2f} |")  # fmt: skip
    return "\n".join(lines)


def training_hours(flops: float, devices: int, peak_flops_per_device: float, utilization: float) -> float:
    """Wall-clock hours to do `flops` model FLOPs on `devices` devices at `utilization` of their peak."""
    if devices < 1 or not peak_flops_per_device > 0 or not 0 < utilization <= 1:
        raise ValueError(f"need devices >= 1, a positive peak and 0 < utilization <= 1; got {devices}, "
                         f"{peak_flops_per_device}, {utilization}.")  # fmt: skip
    return flops / (devices * peak_flops_per_device * utilization) / 3600.0


def required_utilization(flops: float, hours: float, devices: int, peak_flops_per_device: float) -> float:
    """The model FLOPs utilisation at which `flops` take `hours` on `devices` devices (the inverse of the above)."""
    if not hours > 0:
        raise ValueError(f"hours must be positive, got {hours}.")
    return flops / (hours * 3600.0 * devices * peak_flops_per_device)


# Dense peaks per device in FLOP/s, from the vendors' data sheets, for the estimates of `hardware_table`.
HARDWARE_PEAKS = {
    "P100 fp32 (the paper's figure)": 9.5e12,
    "V100 SXM2 fp16 tensor cores": 125e12,
    "A100 SXM bf16": 312e12,
    "H100 SXM bf16": 989e12,
}


def hardware_table(devices: int = 8, utilization: float = 0.3, average_length: float = PAPER_AVERAGE_LENGTH) -> str:
    """A Markdown table: hours of the paper's base and big runs on `devices` of each device at `utilization`."""
    estimates = {preset: paper_estimate(preset, average_length) for preset in PAPER_STEPS}
    lines = [f"| {devices} x device | peak / device | " + " | ".join(f"{p} hours" for p in estimates) + " |",
             "| --- | --- | " + " | ".join("---" for _ in estimates) + " |"]  # fmt: skip
    for name, peak in HARDWARE_PEAKS.items():
        hours = [training_hours(e.flops, devices, peak, utilization) for e in estimates.values()]
        lines.append(f"| {name} | {peak / 1e12:g} TFLOPS | " + " | ".join(f"{h:,.2f}" for h in hours) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m vaswani_transformer.flops [--devices 8] [--utilization 0.3]``: Table 2 and wall-clock estimates."""
    from . import cli

    parser = cli.ArgumentParser(description="Training FLOPs of the paper's runs next to Table 2, and their "
                                "wall-clock hours on a number of devices at a stated model FLOPs utilisation.")  # fmt: skip
    # Ranges checked while parsing (exit 2), so that a bad value prints nothing of the tables.
    parser.add_argument("--devices", type=cli.positive_int, default=8,
                        help="devices training together (default 8, as the paper)")  # fmt: skip
    parser.add_argument("--utilization", type=cli.fraction, default=0.3,
                        help="model FLOPs utilisation in (0, 1] assumed for the hours (default 0.3, about the paper's "
                        "runs)")  # fmt: skip
    args = parser.parse_args(argv)
    print(f"Training FLOPs (forward + backward = 3x forward, 1 multiply-add = 2 FLOPs), vocabulary "
          f"{PAPER_VOCAB_SIZE:,}, {PAPER_TOKENS_PER_BATCH:,} target tokens per batch, "
          f"{PAPER_AVERAGE_LENGTH:g} tokens per sentence on each side:")  # fmt: skip
    print(paper_table())
    print(f"\nWall clock on {args.devices} devices at {args.utilization:.0%} model FLOPs utilisation:")
    print(hardware_table(args.devices, args.utilization))


if __name__ == "__main__":
    main()


__all__ = [
    "PaperEstimate",
    "HARDWARE_PEAKS",
    "average_lengths",
    "forward_flops_per_sentence",
    "hardware_table",
    "measure_matmul_peak",
    "model_flops_per_target_token",
    "model_flops_utilization",
    "paper_estimate",
    "paper_table",
    "required_utilization",
    "run_training_cost",
    "training_flops",
    "training_hours",
]
