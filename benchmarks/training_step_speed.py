"""Training-step speed: our model vs HF MarianMTModel at the same configuration.

Both models get the same random batch (sources and targets of the given lengths, no padding), the same
optimizer (Adam) and the same loss (label-smoothed cross-entropy 0.1 computed from the logits, as Seq2SeqTrainer
does); we time forward + backward + optimizer step, in fp32 and (where the CPU has native bf16) under bf16 autocast,
with each model's default attention (SDPA) and with eager attention: PyTorch's CPU SDPA backward is several times
slower in bf16 than in fp32, so on a CPU bf16 pays only with eager attention (`--attn_implementation eager`).
Each setting runs first with glibc's default allocator, then with freed memory kept in the process, as
`scripts/train.py` does on a CPU (`keep_freed_cpu_memory`).

    python benchmarks/training_step_speed.py --d-model 256 --layers 3 --heads 4 --d-ff 1024 --vocab 8000
"""

import argparse
import time

import torch
from transformers import MarianConfig, MarianMTModel

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.modeling_vaswani_transformer import shift_tokens_right
from vaswani_transformer.trainer import keep_freed_cpu_memory


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


def time_steps(model, batch, steps: int, bf16: bool) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    model.train()
    timings = []
    for step in range(steps + 2):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), batch["labels"].flatten(), label_smoothing=0.1
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:  # warm-up steps are not timed
            timings.append(time.perf_counter() - start)
    timings.sort()
    return timings[len(timings) // 2]


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
    parser.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto",
                        help="also time bf16 autocast; auto: only where the CPU has native bf16 (AVX-512/AMX)")
    args = parser.parse_args()
    capability = torch.backends.cpu.get_cpu_capability()
    with_bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and "AVX512" in capability)

    generator = torch.Generator().manual_seed(0)
    ids = lambda: torch.randint(4, args.vocab, (args.batch, args.length), generator=generator)  # noqa: E731
    labels = ids()
    batch = {"input_ids": ids(), "labels": labels, "decoder_input_ids": shift_tokens_right(labels, 0, 1)}  # both models
    tokens = args.batch * args.length
    print(f"batch {args.batch} x {args.length} tokens per side, d_model {args.d_model}, {args.layers}+{args.layers} layers, "
          f"h {args.heads}, d_ff {args.d_ff}, vocab {args.vocab}, torch threads {torch.get_num_threads()}, "
          f"CPU {capability}{'' if with_bf16 else ' (bf16 skipped: emulated on this CPU, far slower than fp32)'}")
    print("| model | precision | attention | CPU memory | ms / step | target tokens / s | speed-up vs first row |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    settings = [(False, "sdpa"), (False, "eager")] + ([(True, "sdpa"), (True, "eager")] if with_bf16 else [])
    reference = None
    # glibc's default allocator first, then freed memory kept in the process as train.py does on CPU (for the rest
    # of this process: the setting cannot be undone).
    for memory in ("glibc default", "kept (train.py)"):
        if memory != "glibc default" and not keep_freed_cpu_memory():
            break
        for bf16, attention in settings:
            for kind in ("marian", "vaswani"):
                seconds = time_steps(build(kind, args, attention), batch, args.steps, bf16)
                reference = reference or seconds
                print(f"| {kind} | {'bf16 autocast' if bf16 else 'fp32'} | {attention} | {memory} | "
                      f"{seconds * 1000:.0f} | {tokens / seconds:,.0f} | {reference / seconds:.2f}x |")


if __name__ == "__main__":
    main()
