"""Beam search speed of our CTranslate2 export next to ours and MarianMT's `generate`, at the same model size.

One random model of the size of the OPUS-MT Marian models that CTranslate2 serves (d_model 512, 6 + 6 layers, 8
heads, d_ff 2048, a shared vocabulary of --vocab-size), given to MarianMTModel with the same weights
(`beam_search_speed.marian_with_the_same_weights`) and exported with `vaswani-export-ctranslate2` (float32 and
int8). Every decoder translates the same batch of random sources (~20 tokens) with beam 4 and length penalty 0.6,
exactly --new-tokens output tokens per sentence (</s> suppressed), with 1 and 2 threads. Wall-clock sentences/s,
best of --repeats.

Target (issue 17): CTranslate2 int8 >= 2x MarianMT's `generate` (float32 was ~1.1x in CTranslate2's own Marian
conversion on a 2-core CPU).

    python benchmarks/ctranslate2_speed.py --batch-size 16 --new-tokens 24 --repeats 3
"""

import argparse
import os
import tempfile
import time

import torch
from beam_search_speed import marian_with_the_same_weights, sources
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.ctranslate2_export import export_ctranslate2, load_translator


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer whose ids are the model's: <pad> <s> </s> <unk>, then w4, w5, ... (only the vocabulary is used)."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, vocab_size)])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                   pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>")  # fmt: skip


def best_wall_time(run, repeats: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    config = VaswaniTransformerConfig(vocab_size=args.vocab_size, d_model=args.d_model, encoder_layers=args.layers,
                                      decoder_layers=args.layers, num_heads=8, d_ff=4 * args.d_model, dropout=0.0)
    ours = VaswaniTransformerForConditionalGeneration(config).eval()
    marian = marian_with_the_same_weights(ours)
    inputs = sources(args.batch_size, args.source_length, args.vocab_size, args.seed)
    tokenizer = word_tokenizer(args.vocab_size)
    token_batch = [tokenizer.convert_ids_to_tokens([i for i in row if i]) for row in inputs["input_ids"].tolist()]
    steps = dict(num_beams=args.num_beams, length_penalty=0.6, max_new_tokens=args.new_tokens, suppress_tokens=[2])

    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(os.path.join(folder, "model"))
        tokenizer.save_pretrained(os.path.join(folder, "model"))
        for quantization in ("float32", "int8"):
            export_ctranslate2(os.path.join(folder, "model"), os.path.join(folder, quantization), quantization)
        print(f"# d_model {args.d_model}, {args.layers}+{args.layers} layers, vocab {args.vocab_size}; batch "
              f"{args.batch_size}, sources ~{args.source_length} tokens, beam {args.num_beams}, {args.new_tokens} "
              f"output tokens; wall clock, best of {args.repeats}\n")  # fmt: skip
        print("| threads | decoder | seconds | sentences/s | vs MarianMT |\n| --- | --- | --- | --- | --- |")
        for threads in args.threads:
            torch.set_num_threads(threads)
            runs = {
                "MarianMTModel.generate (transformers' beam search)": lambda: marian.generate(**inputs, **steps),
                "ours, paper beam search": lambda: ours.generate(**inputs, **steps),
                "ours, transformers' beam search": lambda: ours.generate(
                    **inputs, **steps, length_penalty_type="transformers"
                ),
            }
            for quantization in ("float32", "int8"):
                translator, _, _ = load_translator(os.path.join(folder, quantization), intra_threads=threads)
                runs[f"CTranslate2 {quantization}"] = lambda translator=translator: translator.translate_batch(
                    token_batch, beam_size=args.num_beams, length_penalty=0.6, max_decoding_length=args.new_tokens,
                    min_decoding_length=args.new_tokens,
                )
            with torch.no_grad():
                seconds = {name: best_wall_time(run, args.repeats) for name, run in runs.items()}
            baseline = seconds["MarianMTModel.generate (transformers' beam search)"]
            for name, value in seconds.items():
                print(f"| {threads} | {name} | {value:.2f} | {args.batch_size / value:.1f} | {baseline / value:.2f}x |")


if __name__ == "__main__":
    main()
