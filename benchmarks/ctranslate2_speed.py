"""Beam search speed of our CTranslate2 export next to ours and MarianMT's `generate`, at the same model size.

One random model of the size of the OPUS-MT Marian models that CTranslate2 serves (d_model 512, 6 + 6 layers, 8
heads, d_ff 2048, a shared vocabulary of --vocab-size; `--d-model`, `--layers`, `--num-heads`, `--d-ff` for others),
given to MarianMTModel with the same weights
(`beam_search_speed.marian_with_the_same_weights`) and exported with `vaswani-export-ctranslate2` (float32 and
int8). Every decoder translates the same batch of random sources (~20 tokens) with beam 4 and length penalty 0.6,
exactly --new-tokens output tokens per sentence (</s> suppressed). Wall-clock sentences/s, best of --repeats; each
CTranslate2 row in a fresh process of its own (in one where PyTorch's threads have run, CTranslate2's two-thread rows
ran several times slower; rows before 2026-11-28 were measured so). On a
CPU ours also with its packed weights kept from call to call, as `translate_lines` keeps them for a run's batches,
and both models in int8 as PyTorch's dynamic quantization makes them (`torch.ao.quantization.quantize_dynamic(model,
{torch.nn.Linear}, dtype=torch.qint8)`: int8 weights, activations quantized per call; the same recipe for both).

Runs on `--device` (default: a CUDA GPU when one is present, else the CPU), named in the header. On a CPU with 1 and
2 threads (`--threads`); on a GPU with the first `--threads` only (threads barely matter there), the clock read after
synchronising, and CTranslate2 also in float16 (the float32 export) and int8_float16 (the int8 export).

Target (issue 17): CTranslate2 int8 >= 2x MarianMT's `generate` (float32 was ~1.1x in CTranslate2's own Marian
conversion on a 2-core CPU).

    python benchmarks/ctranslate2_speed.py --batch-size 16 --new-tokens 24 --repeats 3
    python benchmarks/ctranslate2_speed.py --vocab-size 8000 --batch-size 1  # issue 15's base configuration
    python benchmarks/ctranslate2_speed.py --vocab-size 8000 --d-model 256 --layers 3 --num-heads 4 --d-ff 1024  # small
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch
from beam_search_speed import first_call, marian_with_the_same_weights, sources
from device import add_device_argument, check_device, describe, now
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.ctranslate2_export import INT8_SATURATION_WARNING, export_ctranslate2, int8_products_saturate


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer whose ids are the model's: <pad> <s> </s> <unk>, then w4, w5, ... (only the vocabulary is used)."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, vocab_size)])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                   pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>")  # fmt: skip


# A CTranslate2 row, in a process of its own: where PyTorch has run a parallel operation (its OpenMP threads exist),
# CTranslate2's own OpenMP threads ran several times slower on a 2-core CPU (batch 1 with two threads: 123 ms against 13
# in a fresh process; one thread unaffected), so in this process its two-thread rows came out far too slow.
_CTRANSLATE2_CHILD = """
import json, sys, time
import ctranslate2
job = json.loads(sys.argv[1])
translator = ctranslate2.Translator(job["folder"], device=job["device"], compute_type=job["compute_type"],
                                    intra_threads=job["threads"])
run = lambda: translator.translate_batch(job["tokens"], **job["options"])
run()  # warm-up
best = float("inf")
for _ in range(job["repeats"]):
    started = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - started)
print(best)
"""


def ctranslate2_seconds(folder: str, device: str, compute_type: str, threads: int, tokens: list, options: dict,
                        repeats: int) -> float:  # fmt: skip
    """Best wall time of CTranslate2's `translate_batch` over `repeats`, after a warm-up, in a fresh child process
    (`_CTRANSLATE2_CHILD`)."""
    job = dict(folder=folder, device=device, compute_type=compute_type, threads=threads, tokens=tokens,
               options=options, repeats=repeats)  # fmt: skip
    child = subprocess.run([sys.executable, "-c", _CTRANSLATE2_CHILD, json.dumps(job)], capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"the CTranslate2 {compute_type} row failed:\n{child.stderr}")
    return float(child.stdout.strip().splitlines()[-1])


def best_wall_time(run, repeats: int, device: torch.device) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = now(device)
        run()
        best = min(best, now(device) - started)
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
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=None, help="default: 4 x d_model")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_device_argument(parser)
    args = parser.parse_args()
    device = check_device(args.device)
    if device.index:  # load_translator takes a device type, not an index
        parser.error("CTranslate2 runs on the first GPU: pick another one with CUDA_VISIBLE_DEVICES")
    torch.manual_seed(args.seed)
    config = VaswaniTransformerConfig(vocab_size=args.vocab_size, d_model=args.d_model, encoder_layers=args.layers,
                                      decoder_layers=args.layers, num_heads=args.num_heads,
                                      d_ff=args.d_ff or 4 * args.d_model, dropout=0.0)  # fmt: skip
    ours = VaswaniTransformerForConditionalGeneration(config).eval()
    marian = marian_with_the_same_weights(ours)
    inputs = sources(args.batch_size, args.source_length, args.vocab_size, args.seed)
    tokenizer = word_tokenizer(args.vocab_size)
    token_batch = [tokenizer.convert_ids_to_tokens([i for i in row if i]) for row in inputs["input_ids"].tolist()]
    steps = dict(num_beams=args.num_beams, length_penalty=0.6, max_new_tokens=args.new_tokens, suppress_tokens=[2])
    # CTranslate2 rows: compute type -> the export it loads.
    compute_types = {"float32": "float32", "int8": "int8"}
    if device.type == "cuda":
        compute_types.update(float16="float32", int8_float16="int8")

    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(os.path.join(folder, "model"))
        tokenizer.save_pretrained(os.path.join(folder, "model"))
        for quantization in ("float32", "int8"):
            export_ctranslate2(os.path.join(folder, "model"), os.path.join(folder, quantization), quantization)
        ours, marian = ours.to(device), marian.to(device)  # saved and exported from the CPU
        if device.type == "cpu":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor
                ours_int8, marian_int8 = (torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)
                                          for model in (ours, marian))  # fmt: skip
        inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
        synchronised = ", synchronised" if device.type == "cuda" else ""
        print(f"# {describe(device)}\n# d_model {args.d_model}, {args.layers}+{args.layers} layers, "
              f"{config.num_heads} heads, d_ff {config.d_ff}, vocab "
              f"{args.vocab_size}; batch {args.batch_size}, sources ~{args.source_length} tokens, beam "
              f"{args.num_beams}, {args.new_tokens} output tokens; wall clock{synchronised}, best of "
              f"{args.repeats}\n")  # fmt: skip
        for compute_type in compute_types:
            if compute_type.startswith("int8") and int8_products_saturate(compute_type, device.type):
                print("# " + INT8_SATURATION_WARNING % compute_type + "\n")
        options = dict(beam_size=args.num_beams, length_penalty=0.6, max_decoding_length=args.new_tokens,
                       min_decoding_length=args.new_tokens)  # CTranslate2's, as `steps` above
        print("| threads | decoder | seconds | sentences/s | vs MarianMT |\n| --- | --- | --- | --- | --- |")
        for threads in args.threads if device.type == "cpu" else args.threads[:1]:
            torch.set_num_threads(threads)
            runs = {
                "MarianMTModel.generate (transformers' beam search)": lambda: marian.generate(**inputs, **steps),
                "ours, paper beam search": lambda: ours.generate(**inputs, **steps),
                **({"ours, paper beam search, a first call (packing its weights)": lambda: first_call(
                    ours, ours.generate, **inputs, **steps
                )} if device.type == "cpu" else {}),
                "ours, transformers' beam search": lambda: ours.generate(
                    **inputs, **steps, length_penalty_type="transformers"
                ),
            }
            if device.type == "cpu":  # PyTorch's int8 recipe for CPU inference (both models' nn.Linear layers)
                runs["MarianMTModel.generate, int8 (torch's dynamic quantization)"] = lambda: marian_int8.generate(
                    **inputs, **steps
                )
                runs["ours, paper beam search, int8 (torch's dynamic quantization)"] = lambda: ours_int8.generate(
                    **inputs, **steps
                )
            with torch.no_grad():
                seconds = {name: best_wall_time(run, args.repeats, device) for name, run in runs.items()}
            for compute_type, export in compute_types.items():
                seconds[f"CTranslate2 {compute_type}"] = ctranslate2_seconds(
                    os.path.join(folder, export), device.type, compute_type, threads, token_batch, options, args.repeats
                )
            baseline = seconds["MarianMTModel.generate (transformers' beam search)"]
            for name, value in seconds.items():
                print(f"| {threads} | {name} | {value:.3g} | {args.batch_size / value:.1f} | {baseline / value:.2f}x |")


if __name__ == "__main__":
    main()
