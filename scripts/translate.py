#!/usr/bin/env python
"""Translate a text file (or stdin) line for line with a saved model, decoding as the paper did by default.

    python scripts/translate.py --model outputs/run/averaged --input test.en --output test.hyp.de
    echo "A man rides a bike." | python scripts/translate.py --model outputs/run/averaged

One output line per input line, always (an empty line gives an empty line). Batches hold at most --max-tokens source
tokens. Defaults come from the model's generation config (the paper: --beam 4 --alpha 0.6 --max-len-a 1
--max-len-b 50). See `vaswani_transformer.inference.translate_lines`.
"""

import argparse
import sys

from vaswani_transformer.inference import DTYPES, load_model_and_tokenizer, translate_file


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", "--model_name_or_path", required=True, help="Model folder or Hub model id (with its tokenizer)."
    )
    parser.add_argument("--input", "-i", default="-", help="Input text file, one sentence per line ('-': stdin).")
    parser.add_argument("--output", "-o", default="-", help="Output file ('-': stdout).")
    parser.add_argument("--beam", type=int, default=None, help="Beam size (default: the model's, 4 in the paper).")
    parser.add_argument("--alpha", type=float, default=None, help="Length penalty alpha (default: the model's, 0.6).")
    parser.add_argument(
        "--max-len-a", "--max_len_a", type=float, default=None, help="Output limit: a * source length + b (a)."
    )
    parser.add_argument(
        "--max-len-b", "--max_len_b", type=float, default=None, help="Output limit: a * source length + b (b)."
    )
    parser.add_argument(
        "--max-tokens", "--max_tokens", type=int, default=4096, help="Most source tokens per batch, padding included."
    )
    parser.add_argument(
        "--max-source-length",
        "--max_source_length",
        type=int,
        default=None,
        help="Truncate longer sources (with a warning naming the line); see --strict.",
    )
    parser.add_argument("--strict", action="store_true", help="Refuse over-long sources instead of truncating them.")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: cpu).")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="Weights dtype (default: as saved).")
    parser.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit).")
    parser.add_argument(
        "--trust-remote-code",
        "--trust_remote_code",
        action="store_true",
        help="Allow the model's own code (not needed for vaswani_transformer models).",
    )
    parser.add_argument("--no-progress", "--no_progress", action="store_true", help="No progress bar.")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        model, tokenizer = load_model_and_tokenizer(
            args.model,
            device=args.device,
            dtype=args.dtype,
            revision=args.revision,
            trust_remote_code=args.trust_remote_code,
        )
        translate_file(
            model,
            tokenizer,
            args.input,
            args.output,
            max_tokens=args.max_tokens,
            num_beams=args.beam,
            length_penalty=args.alpha,
            max_len_a=args.max_len_a,
            max_len_b=args.max_len_b,
            max_source_length=args.max_source_length,
            strict=args.strict,
            show_progress=False if args.no_progress else None,
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
