#!/usr/bin/env python
"""Translate a test set and report sacreBLEU (with signature), chrF and the paper's tokenized BLEU as JSON.

    python scripts/evaluate.py --model runs/base/averaged \\
        --test-prefix ../shared/data/multi30k/test_2016_flickr --source-lang en --target-lang de \\
        --output-json runs/base/averaged/eval_results.json --hypotheses-file runs/base/averaged/test.hyp.de

    # Score existing translations without a model:
    python scripts/evaluate.py --hypotheses test.hyp.de --reference test.de --target-lang de --output-json r.json

Decoding defaults are those of the translate function (the paper's: beam 4, length penalty 0.6, at most
input length + 50 tokens); --num-beams, --length-penalty and --decoding KEY=VALUE override them. The JSON
fields are described in `vaswani_transformer.evaluation.evaluation_report`; how the tokenized BLEU relates to
the paper's `get_ende_bleu.sh` is documented in `vaswani_transformer/metrics/paper_bleu/paper_bleu.py`.
"""

import os
import sys


# This file is named like the `evaluate` library; as a script its folder comes first on sys.path and
# `import evaluate` (inside vaswani_transformer.evaluation) would import this file. Drop the folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402

from vaswani_transformer.data import check_parallel_text_files, resolve_text_pair  # noqa: E402
from vaswani_transformer.evaluation import evaluate_model, evaluation_report, read_lines  # noqa: E402


def _decoding_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", "--model_name_or_path", help="Model folder (with its tokenizer) to translate with.")
    what.add_argument("--hypotheses", help="Score this file of translations instead of translating.")
    parser.add_argument("--source", help="Source file, one segment per line.")
    parser.add_argument("--reference", help="Reference file, aligned with --source line by line.")
    parser.add_argument("--test-prefix", "--test_file", help="PREFIX for PREFIX.<source-lang> + PREFIX.<target-lang>.")
    parser.add_argument("--source-lang", "--source_lang", default="", help="Source language code (e.g. en).")
    parser.add_argument("--target-lang", "--target_lang", default="", help="Target language code (e.g. de).")
    parser.add_argument("--output-json", "--output_json", help="Where to write the results JSON.")
    parser.add_argument("--hypotheses-file", "--hypotheses_file", help="Where to write the translations.")
    parser.add_argument("--tokenize", help="sacreBLEU tokenizer (default: sacreBLEU's choice for --target-lang).")
    parser.add_argument("--num-beams", "--num_beams", type=int, help="Beam size (default: the translate function's).")
    parser.add_argument("--length-penalty", "--length_penalty", type=float, help="Length penalty alpha.")
    parser.add_argument(
        "--decoding", action="append", default=[], metavar="KEY=VALUE",
        help="Extra keyword for the translate function (VALUE parsed as JSON when possible); repeatable.",
    )  # fmt: skip
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available, else cpu).")
    args = parser.parse_args(argv)

    if args.test_prefix:
        if args.source or args.reference:
            parser.error("give --test-prefix or --source/--reference, not both.")
        if not (args.source_lang and args.target_lang):
            parser.error("--test-prefix needs --source-lang and --target-lang.")
        pair = resolve_text_pair(args.test_prefix, args.source_lang, args.target_lang)
        if pair is None:
            parser.error(
                f"--test-prefix: {args.test_prefix}.{args.source_lang} and {args.test_prefix}.{args.target_lang} "
                "do not both exist."
            )
        args.source, args.reference = pair
    if args.reference is None:
        parser.error("--reference (or --test-prefix) is required.")
    if args.model and args.source is None:
        parser.error("--model needs --source (or --test-prefix).")
    decoding = {}
    for item in args.decoding:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--decoding expects KEY=VALUE, got {item!r}.")
        decoding[key] = _decoding_value(value)
    if args.num_beams is not None:
        decoding["num_beams"] = args.num_beams
    if args.length_penalty is not None:
        decoding["length_penalty"] = args.length_penalty
    args.decoding = decoding
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.hypotheses:
            check_parallel_text_files(args.hypotheses, args.reference)  # error naming both files and counts
            hypotheses, references = read_lines(args.hypotheses, allow_empty=True), read_lines(args.reference)
            report = evaluation_report(
                hypotheses, references, source_lang=args.source_lang, target_lang=args.target_lang,
                tokenize=args.tokenize, output_json=args.output_json, hypotheses_file=args.hypotheses,
                reference_file=args.reference,
            )  # fmt: skip
        else:
            import torch

            device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
            report = evaluate_model(
                args.model, args.source, args.reference, source_lang=args.source_lang,
                target_lang=args.target_lang, decoding=args.decoding, tokenize=args.tokenize,
                output_json=args.output_json, hypotheses_file=args.hypotheses_file, device=device,
            )  # fmt: skip
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
