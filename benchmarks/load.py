"""Load: peak memory and speed of (1) translating 1k, 10k and 100k lines with `vaswani-translate`'s streaming path and
(2) tokenising + batching a synthetic WMT14-sized corpus (4.5M pairs) through `vaswani_transformer.data`.

Each row runs in a child process of its own. Two memory figures per row:

* peak RSS (the child's `VmHWM`, `device.peak_rss_mib`: not `ru_maxrss`, which a child inherits from its parent); it
  includes the pages of memory-mapped files the child has touched (datasets' Arrow files), which the kernel can drop
  at any time;
* peak anonymous RSS (`RssAnon` of /proc/self/status, sampled every 20 ms in the child): the heap, what the process
  really holds. Flat in the number of lines (translation windows) and in the corpus size (Arrow is memory-mapped)
  is the claim this benchmark checks.

(1) `translate_file` as `vaswani-translate --input in.txt --output out.txt` runs it: windows of `--window` lines
sorted by length, token batches, the model's decoding (beam 4, GNMT length penalty 0.6). The default model is a
tiny random one (d_model 64, 2+2 layers) with an 8k BPE vocabulary trained here, decoding at most 8 tokens (a random
model never ends a sentence, it would always decode source length + 50): it measures the pipeline's memory and
overhead, not a real model's speed; `--model_name_or_path` takes a trained folder instead (e.g. runs/quickstart).
Input sentences are synthetic English-like lines, 6 words on average (`--translate_words 23` for WMT14's length).

(2) The corpus (train.en, train.de; Zipf-distributed pseudo-words, WMT14 en-de lengths) is written to a temporary
folder, a shared 8k BPE vocabulary is trained on its first 100k pairs, then the child runs
`load_parallel_dataset` (text -> Arrow in the datasets cache), `tokenize_parallel_dataset` (datasets.map, cached Arrow,
`--num_proc` processes) and a full pass of the training DataLoader (`TokenBatchSampler.from_dataset` +
`TranslationDataCollator`, `--max_tokens` per batch). The 4.5M-pair row needs about 6 GB of disk in the temporary
folder and takes tens of minutes on 2 cores.

    python benchmarks/load.py                                           # 1k/10k/100k lines; 4.5M pairs
    python benchmarks/load.py --translate 1000 10000 --corpus 100000 450000 --num_proc 1
    python benchmarks/load.py --translate 1000 --corpus --model_name_or_path runs/quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from device import peak_rss_mib


WMT14_PAIRS = 4_508_785  # WMT14 en-de training pairs (the paper's "about 4.5 million sentence pairs")
_VOCAB_WORDS = 50_000


# ------------------------------------------------------------------------------------------- synthetic text


def _pseudo_words(rng: np.random.Generator, count: int, suffix: str = "") -> np.ndarray:
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    lengths = rng.integers(1, 5, size=count)
    words = {"".join(rng.choice(syllables, size=n)) + suffix for n in lengths}
    while len(words) < count:
        words.add("".join(rng.choice(syllables, size=4)) + suffix)
    return np.array(sorted(words)[:count])


def synthetic_sentences(count: int, seed: int = 0, mean_words: float = 23.0, chunk: int = 50_000):
    """Yield (english-like, german-like) lines: Zipf word frequencies, lognormal lengths (WMT14: mean ~23 words)."""
    rng = np.random.default_rng(seed)
    en, de = _pseudo_words(rng, _VOCAB_WORDS), _pseudo_words(rng, _VOCAB_WORDS, "en")
    punctuation = np.array([".", ",", "?", "!", ";"])
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        lengths = np.clip(rng.lognormal(np.log(mean_words) - 0.55**2 / 2, 0.55, size=n), 1, 150).astype(int)
        ids = (rng.zipf(1.15, size=int(lengths.sum())) - 1) % _VOCAB_WORDS
        ratio = np.clip(rng.normal(1.0, 0.1, size=n), 0.6, 1.6)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for i in range(n):
            words = ids[offsets[i] : offsets[i + 1]]
            german = words[: max(1, int(len(words) * ratio[i]))][::-1]
            end = punctuation[words[0] % len(punctuation)]
            yield " ".join(en[words]) + " " + end, " ".join(de[german]) + " " + end


# ------------------------------------------------------------------------------------------- child processes


class AnonymousPeak:
    """The largest RssAnon (heap and other private memory, not file mappings) seen while running, in MB."""

    def __init__(self, every: float = 0.02):
        self.peak, self.every, self._stop = 0.0, every, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    self.peak = max(self.peak, int(line.split()[1]) / 1024)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> AnonymousPeak:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def child_translate(args) -> dict:
    from vaswani_transformer.translate import load_model_and_tokenizer, translate_file

    torch.set_num_threads(args.threads)
    with AnonymousPeak() as peak:
        started = time.perf_counter()
        model, tokenizer = load_model_and_tokenizer(args.model)
        loaded = time.perf_counter()
        written = translate_file(model, tokenizer, args.input, args.output, window=args.window,
                                 max_tokens=args.max_tokens, show_progress=False)  # fmt: skip
        done = time.perf_counter()
    return {"lines": written, "load_s": loaded - started, "seconds": done - loaded, "anon_mb": peak.peak}


def child_corpus(args) -> dict:
    from transformers import AutoTokenizer
    from torch.utils.data import DataLoader

    from vaswani_transformer.data import (
        TokenBatchSampler,
        TranslationDataCollator,
        load_parallel_dataset,
        tokenize_parallel_dataset,
    )

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with AnonymousPeak() as peak:
        started = time.perf_counter()
        raw = load_parallel_dataset(train_file=args.input, source_lang="en", target_lang="de", cache_dir=args.cache)
        loaded = time.perf_counter()
        tokenized, report = tokenize_parallel_dataset(
            raw, tokenizer, "en", "de", max_source_tokens=args.max_tokens, max_target_tokens=args.max_tokens,
            num_proc=args.num_proc,
        )  # fmt: skip
        train = tokenized["train"]
        tokenized_at = time.perf_counter()
        sampler = TokenBatchSampler.from_dataset(train, args.max_tokens, seed=0)
        loader = DataLoader(train, batch_sampler=sampler, collate_fn=TranslationDataCollator(tokenizer))
        pairs = tokens = 0
        for batch in loader:
            pairs += batch["input_ids"].shape[0]
            tokens += int(batch["attention_mask"].sum())
        done = time.perf_counter()
    return {"pairs": len(raw["train"]), "kept": report.kept("train"), "batched_pairs": pairs, "source_tokens": tokens,
            "batches": len(sampler), "load_s": loaded - started, "tokenize_s": tokenized_at - loaded,
            "batch_s": done - tokenized_at, "anon_mb": peak.peak}  # fmt: skip


def run_child(kind: str, **options) -> dict:
    """Run this file as `--child kind` in a fresh process; its JSON result (with its peak RSS in MB)."""
    argv = [sys.executable, os.path.abspath(__file__), "--child", kind]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    output = process.stdout.read()
    if process.wait() != 0:
        raise SystemExit(f"the {kind} child failed with exit status {process.returncode}")
    return json.loads(output.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ the rows


def tiny_model(folder: Path, corpus_prefix: Path) -> None:
    """A random d_model-64, 2+2-layer model with an 8k BPE vocabulary trained on the corpus' first lines."""
    from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
    from vaswani_transformer.tokenization import config_kwargs_from_tokenizer, train_tokenizer

    files = [f"{corpus_prefix}.en", f"{corpus_prefix}.de"]
    tokenizer = train_tokenizer(files=files, vocab_size=8000, show_progress=False)
    config = VaswaniTransformerConfig(d_model=64, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=128,
                                      **config_kwargs_from_tokenizer(tokenizer))  # fmt: skip
    torch.manual_seed(0)
    model = VaswaniTransformerForConditionalGeneration(config).eval()
    model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 8  # a random model never stops
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def write_corpus(prefix: Path, pairs: int, seed: int = 0) -> None:
    with open(f"{prefix}.en", "w", encoding="utf-8") as en, open(f"{prefix}.de", "w", encoding="utf-8") as de:
        for source, target in synthetic_sentences(pairs, seed):
            en.write(source + "\n")
            de.write(target + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("--translate", type=int, nargs="*", default=[1000, 10_000, 100_000],
                        help="numbers of lines to translate, one row each (none: skip)")  # fmt: skip
    parser.add_argument("--corpus", type=int, nargs="*", default=[WMT14_PAIRS],
                        help="corpus sizes in pairs to tokenise and batch, one row each (none: skip)")  # fmt: skip
    parser.add_argument("--translate_words", type=float, default=6.0,
                        help="mean words per line to translate (WMT14 test sets: ~23; the default keeps 100k lines "
                        "to minutes with beam search on 2 CPU cores)")  # fmt: skip
    parser.add_argument("--model_name_or_path", help="a trained model folder (default: a tiny random model)")
    parser.add_argument("--window", type=int, default=None, help="translation window (default: vaswani-translate's)")
    parser.add_argument("--max_tokens", type=int, default=4096, help="source tokens per batch")
    parser.add_argument("--num_proc", type=int, default=None, help="tokenising processes (datasets.map num_proc)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each child")
    parser.add_argument("--tmp", help="temporary folder (default: the system's)")
    parser.add_argument("--child", choices=("translate", "corpus"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.window is None:
            from vaswani_transformer.translate import DEFAULT_WINDOW

            args.window = DEFAULT_WINDOW
        result = (child_translate if args.child == "translate" else child_corpus)(args)
        print(json.dumps({**result, "rss_mb": peak_rss_mib()}))
        return

    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{os.cpu_count()} cores, {args.threads} torch thread(s) per child", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="vaswani-load-", dir=args.tmp) as tmp:
        tmp = Path(tmp)
        model = args.model_name_or_path
        if model is None:
            write_corpus(tmp / "tokenizer_sample", 100_000, seed=2)
            tiny_model(tmp / "tiny", tmp / "tokenizer_sample")
            model = tmp / "tiny"
        common = {"threads": args.threads, "max_tokens": args.max_tokens}
        if args.window is not None:
            common["window"] = args.window
        for lines in args.translate or []:
            source = tmp / f"in_{lines}.txt"
            with open(source, "w", encoding="utf-8") as f:
                f.writelines(english + "\n" for english, _ in synthetic_sentences(lines, 1, args.translate_words))
            r = run_child("translate", model=model, input=source, output=tmp / f"out_{lines}.txt", **common)
            rows.append([f"translate {lines:,} lines", f"{r['rss_mb']:.0f}", f"{r['anon_mb']:.0f}",
                         f"{r['lines'] / r['seconds']:,.0f} lines/s", f"{r['seconds']:.1f} s (+{r['load_s']:.1f} s "
                         "loading)"])  # fmt: skip
            print(" | ".join(rows[-1]), flush=True)
        for pairs in args.corpus or []:
            folder = tmp / f"corpus_{pairs}"
            folder.mkdir()
            started = time.perf_counter()
            write_corpus(folder / "train", pairs)
            print(f"wrote {pairs:,} pairs in {time.perf_counter() - started:.0f} s", flush=True)
            options = dict(common, cache=folder / "cache", input=folder / "train", model=model)
            if args.num_proc:
                options["num_proc"] = args.num_proc
            r = run_child("corpus", **options)
            rows.append([f"tokenise + batch {pairs:,} pairs", f"{r['rss_mb']:.0f}", f"{r['anon_mb']:.0f}",
                         f"{r['pairs'] / r['tokenize_s']:,.0f} pairs/s tokenising, "
                         f"{r['batched_pairs'] / r['batch_s']:,.0f} pairs/s batching",
                         f"{r['load_s']:.0f} s to Arrow + {r['tokenize_s']:.0f} s + {r['batch_s']:.0f} s "
                         f"({r['batches']:,} batches)"])  # fmt: skip
            print(" | ".join(rows[-1]), flush=True)
            shutil.rmtree(folder)
    print()
    print("| row | peak RSS (MB) | peak anonymous RSS (MB) | speed | time |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
