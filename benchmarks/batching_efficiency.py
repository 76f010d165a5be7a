"""Batching efficiency: the fraction of real (non-pad) tokens in token-based batches vs random sentence batches.

Loads Multi30k en-de (never committed; default `../shared/data/multi30k` from the repo root), trains a shared
BPE vocabulary on the training set (or loads `--tokenizer`), tokenises with the library pipeline and compares:

* `TokenBatchSampler(max_tokens)`: pairs grouped by length, <= max_tokens per side counted with padding;
* random sentence batches (HF's standard recipe: shuffled, fixed number of sentences) of the same average
  number of sentences per batch, and the length-sorted variants of both for reference.

Target: real-token fraction >= 0.95 for token batches with max_tokens=4096.

    python benchmarks/batching_efficiency.py --max-tokens 4096 2048 8192 25000
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from vaswani_transformer.data import TokenBatchSampler, load_parallel_dataset, tokenize_parallel_dataset
from vaswani_transformer.tokenization import train_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def efficiency(batches, src, tgt):
    """(real/padded source, real/padded target, real/padded both) summed over all batches."""
    real_s = real_t = pad_s = pad_t = 0
    for b in batches:
        b = np.asarray(b)
        real_s += src[b].sum()
        real_t += tgt[b].sum()
        pad_s += len(b) * src[b].max()
        pad_t += len(b) * tgt[b].max()
    return real_s / pad_s, real_t / pad_t, (real_s + real_t) / (pad_s + pad_t)


def random_sentence_batches(n, batch_size, seed):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.path.join(REPO, "..", "shared", "data", "multi30k"))
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--tokenizer", help="a saved tokenizer folder (default: train a BPE vocabulary here)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-proc", type=int, default=None)
    args = parser.parse_args()

    prefix = os.path.join(args.data_dir, "train")
    started = time.perf_counter()
    raw = load_parallel_dataset(train_file=prefix, source_lang=args.source_lang, target_lang=args.target_lang)
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        files = [f"{prefix}.{args.source_lang}", f"{prefix}.{args.target_lang}"]
        tokenizer = train_tokenizer(files=files, vocab_size=args.vocab_size, output_dir=tempfile.mkdtemp())
    ds, report = tokenize_parallel_dataset(
        raw, tokenizer, args.source_lang, args.target_lang, num_proc=args.num_proc
    )
    print(report, file=sys.stderr)
    table = ds["train"].with_format("numpy")
    src, tgt = np.asarray(table["source_length"]), np.asarray(table["target_length"])
    print(f"# Multi30k {args.source_lang}-{args.target_lang} train: {len(src)} pairs, vocab {len(tokenizer)}, "
          f"mean length src {src.mean():.1f} / tgt {tgt.mean():.1f} tokens (</s> included); "
          f"prepared in {time.perf_counter() - started:.0f}s\n")

    header = ["max_tokens", "batching", "batches", "sent/batch", "real src", "real tgt", "real both"]
    rows = []
    for max_tokens in args.max_tokens:
        sampler = TokenBatchSampler(src, tgt, max_tokens, seed=args.seed)
        sampler.set_epoch(0)
        token_batches = list(sampler)
        mean_size = len(src) / len(token_batches)
        size = max(1, round(mean_size))
        random_batches = random_sentence_batches(len(src), size, args.seed)
        order = np.lexsort((src, tgt))  # fairseq-style (target, source) order, fixed-size sentence batches
        sorted_batches = [order[i : i + size] for i in range(0, len(order), size)]
        for name, batches in [
            ("tokens (TokenBatchSampler)", token_batches),
            (f"random sentences (bs={size})", random_batches),
            (f"sorted sentences (bs={size})", sorted_batches),
        ]:
            s, t, both = efficiency(batches, src, tgt)
            rows.append([str(max_tokens), name, str(len(batches)), f"{len(src) / len(batches):.1f}",
                         f"{s:.3f}", f"{t:.3f}", f"{both:.3f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
