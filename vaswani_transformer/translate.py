"""Translating many lines: loading a model folder or Hub id, token-based batches, the paper's decoding.

`translate_lines(model, tokenizer, lines, ...)` is the library function behind `vaswani-translate` (`main`, also
`scripts/translate.py`) and `vaswani_transformer.evaluation` (its `translate_fn`). It returns exactly one translation
per line, in order:

- Decoding is the model's generation config - for our models the paper's beam search (beam 4, GNMT length penalty
  alpha 0.6, at most `max_len_a * source length + max_len_b` = source length + 50 tokens) - updated with the given
  `num_beams`, `length_penalty`, `max_len_a`, `max_len_b` and other `generate` keywords. Each batch goes through
  `model.generate` and `tokenizer.batch_decode(..., skip_special_tokens=True)`, like `TranslationPipeline`.
- Batches hold at most `max_tokens` source tokens, padding included (`data.TokenBatchSampler` over the source lengths;
  a sentence longer than `max_tokens` is translated alone).
- An empty or whitespace-only line translates to "" without going through the model.
- A source longer than the limit (`max_source_length`, and for learned positional embeddings the model's
  `max_position_embeddings`) is truncated to it, keeping `</s>`, with a warning naming the line; with `strict=True`
  it is a ValueError naming the line instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from . import cli
from .data import TokenBatchSampler
from .pipeline import source_length_limit, truncate_source
from .textio import is_stdio, read_lines, write_lines


logger = logging.getLogger(__name__)

DTYPES = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEFAULT_MAX_TOKENS = 4096  # most source tokens per batch, padding included


# ------------------------------------------------------------------------------------------- loading models


def check_model_folder(folder: str | os.PathLike) -> None:
    """Raise FileNotFoundError naming everything a model folder lacks: config.json, the weights (safetensors or
    PyTorch, single or sharded, with every shard of the index), the tokenizer files."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Model folder {folder} does not exist.")
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json (the model configuration)")
    weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        missing.append(f"the weights (one of {', '.join(WEIGHT_FILES)})")
    for index_name in (w for w in weights if w.endswith(".index.json")):
        try:
            shards = sorted(set(json.loads((folder / index_name).read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError) as error:
            raise ValueError(f"{folder / index_name}: not a valid weight index ({error}).") from None
        missing.extend(
            f"{shard} (a weight shard listed in {index_name})" for shard in shards if not (folder / shard).is_file()
        )
    tokenizer_found = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    # A fast tokenizer, a sentencepiece model, or vocabulary files (e.g. FSMT's vocab-src.json of fairseq imports).
    if "tokenizer.json" not in tokenizer_found and not any(folder.glob("*.model")) and not any(folder.glob("vocab*")):
        missing.append("the tokenizer (tokenizer.json; save it with tokenizer.save_pretrained(folder))")
    if missing:
        raise FileNotFoundError(f"Model folder {folder} is incomplete; missing: " + "; ".join(missing) + ".")


def resolve_dtype(dtype: str | torch.dtype | None):
    """torch dtype (or "auto") from a name: float32/fp32, bfloat16/bf16, float16/fp16, auto; None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def load_model_and_tokenizer(
    model_name_or_path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
):
    """(model in eval mode, tokenizer) from a local folder (checked with `check_model_folder` first) or a Hub id."""
    name = os.fspath(model_name_or_path)
    if os.path.isdir(name):
        check_model_folder(name)
    elif os.path.exists(name):
        raise ValueError(f"{name} is a file; expected a model folder or a Hub model id.")
    elif name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise FileNotFoundError(f"Model folder {name} does not exist (and it is not a Hub id of the form owner/name).")
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    model_kwargs = dict(kwargs)
    if dtype is not None:
        model_kwargs["dtype"] = resolve_dtype(dtype)
    model = AutoModelForSeq2SeqLM.from_pretrained(name, **model_kwargs)
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------------------------- translating


def _encode(tokenizer, lines: Sequence[str], limit: int | None, strict: bool, source_name: str) -> dict[int, list[int]]:
    """Token ids of the non-empty lines (index -> ids), truncated to `limit` with a warning naming the line."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    encoded = tokenizer([lines[i] for i in todo], add_special_tokens=True)["input_ids"] if todo else []
    ids_by_line = {}
    for i, ids in zip(todo, encoded):
        if limit is not None and len(ids) > limit:
            where = f"{source_name}:{i + 1}: the source has {len(ids)} tokens, more than the limit of {limit}"
            if strict:
                raise ValueError(f"{where} (strict mode: not translated).")
            logger.warning("%s; translating its first %d tokens.", where, limit)
            ids = truncate_source(ids, limit, tokenizer.eos_token_id)
        ids_by_line[i] = ids
    return ids_by_line


def translate_lines(
    model,
    tokenizer,
    lines: Sequence[str] | Iterable[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_len_a: float | None = None,
    max_len_b: float | None = None,
    max_source_length: int | None = None,
    strict: bool = False,
    show_progress: bool | None = None,
    source_name: str = "line",
    **generate_kwargs,
) -> list[str]:
    """Translate `lines`; returns one string per line, in order (see the module docstring for the rules).

    max_tokens: most source tokens in a batch, padding included (the decoder side grows with the beam and output).
    num_beams, length_penalty (alpha), max_len_a, max_len_b: override the model's generation config (None keeps it).
    max_source_length: truncate longer sources (with a warning naming `source_name`:line), or refuse them if `strict`.
    show_progress: tqdm bar over sentences (None: only on a terminal).
    generate_kwargs: anything else `model.generate` accepts (e.g. `length_penalty_type="transformers"`).
    """
    lines = list(lines)
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{source_name} {i + 1} is a {type(line).__name__}, expected a string.")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
    overrides = {"num_beams": num_beams, "length_penalty": length_penalty, "max_len_a": max_len_a,
                 "max_len_b": max_len_b}
    generate_kwargs = {**{k: v for k, v in overrides.items() if v is not None}, **generate_kwargs}

    limit = source_length_limit(model.config, max_source_length)
    ids_by_line = _encode(tokenizer, lines, limit, strict, source_name)
    translations = [""] * len(lines)
    if not ids_by_line:
        return translations
    indices = list(ids_by_line)
    lengths = [min(len(ids_by_line[i]), max_tokens) for i in indices]  # longer ones end up alone in a batch
    batches = TokenBatchSampler(lengths, lengths, max_tokens, shuffle=False).batches
    model.eval()
    disable = None if show_progress is None else not show_progress  # None: a bar only on a terminal
    with torch.inference_mode(), tqdm(total=len(indices), desc="Translating", unit="sent", disable=disable) as bar:
        for batch in batches:
            rows = [indices[j] for j in batch]
            inputs = tokenizer.pad({"input_ids": [ids_by_line[i] for i in rows]}, return_tensors="pt")
            inputs = {k: v.to(model.device) for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
            output = model.generate(**inputs, **generate_kwargs)
            num_return = output.shape[0] // len(rows)
            texts = tokenizer.batch_decode(output, skip_special_tokens=True)
            for k, i in enumerate(rows):
                translations[i] = texts[k * num_return]
            bar.update(len(rows))
    return translations


def translate_file(
    model,
    tokenizer,
    input_path: str | os.PathLike | None = None,
    output_path: str | os.PathLike | None = None,
    **kwargs,
) -> int:
    """Translate a file (or stdin) line for line into a file (or stdout); returns the number of lines written, which
    always equals the number read. Line breaks inside a translation become spaces. kwargs go to `translate_lines`."""
    lines, name = read_lines(input_path)
    translations = translate_lines(model, tokenizer, lines, source_name=name, **kwargs)
    if len(translations) != len(lines):  # pragma: no cover - guarded by translate_lines
        raise RuntimeError(f"{len(translations)} translations for {len(lines)} lines.")
    return write_lines(translations, output_path)


# -------------------------------------------------------------------------------------------- command line

CLI_DESCRIPTION = f"""Translate a text file (or stdin) line for line with a saved model, decoding as the paper did by default.

    %(prog)s --model_name_or_path runs/quickstart/averaged --input test.en --output test.hyp.de
    echo "A man rides a bike." | %(prog)s --model_name_or_path runs/multi30k_cpu/averaged --num_beams 4

One output line per input line, always (an empty line gives an empty line). Batches hold at most --max_tokens source
tokens (default {DEFAULT_MAX_TOKENS}). Decoding defaults come from the model's generation config (the paper's: beam 4,
GNMT length penalty 0.6, at most source length + 50 tokens). Options are spelled as transformers' run_translation.py
spells them (--num_beams, --length_penalty); the first spelling shown is the canonical one, the others (dashes,
the older --beam and --alpha) are accepted aliases. See `vaswani_transformer.translate.translate_lines`.
"""


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """--num_beams, --length_penalty, --max_len_a, --max_len_b: None keeps the model's generation config."""
    parser.add_argument("--num_beams", "--num-beams", "--beam", type=int,
                        help="Beam size (default: the model's, 4 in the paper).")  # fmt: skip
    parser.add_argument("--length_penalty", "--length-penalty", "--alpha", type=float,
                        help="Length penalty alpha (default: the model's, 0.6 in the paper).")  # fmt: skip
    parser.add_argument("--max_len_a", "--max-len-a", type=float, help="Output limit: a * source length + b (a).")
    parser.add_argument("--max_len_b", "--max-len-b", type=float, help="Output limit: a * source length + b (b).")


def decoding_arguments(args: argparse.Namespace) -> dict:
    """The decoding options given on the command line (those left out keep the model's)."""
    names = ("num_beams", "length_penalty", "max_len_a", "max_len_b")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.ArgumentParser(
        description=CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", "--model", required=True,
                        help="Model folder or Hub model id (with its tokenizer).")  # fmt: skip
    parser.add_argument("--engine", choices=("transformers", "ctranslate2"), default="transformers",
                        help="transformers (our generate) or ctranslate2 (a folder written by "
                        "vaswani-export-ctranslate2; beam search with transformers' length penalty).")  # fmt: skip
    parser.add_argument("--input", "-i", default="-", help="Input text file, one sentence per line ('-': stdin).")
    parser.add_argument("--output", "-o", default="-", help="Output file ('-': stdout).")
    add_decoding_arguments(parser)
    parser.add_argument("--max_tokens", "--max-tokens", type=int, help="Most source tokens per batch, padding included.")
    parser.add_argument("--max_source_length", "--max-source-length", type=int,
                        help="Truncate longer sources (with a warning naming the line); see --strict.")  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="Refuse over-long sources instead of truncating them.")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps ... (default: cpu).")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="Weights dtype (default: as saved).")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit).")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true",
                        help="Allow the model's own code (not needed for vaswani_transformer models).")  # fmt: skip
    parser.add_argument("--no_progress", "--no-progress", action="store_true", help="No progress bar.")
    return parser.parse_args(argv)


def check_input_output(input_path: str, output_path: str) -> str | None:
    """Why ``--input``/``--output`` cannot be used (a closed standard stream, a missing file, a directory), or None;
    checked before the model loads."""
    if is_stdio(input_path) and sys.stdin is None:
        return "standard input is closed: pipe the sentences in or give --input FILE."
    if is_stdio(output_path) and sys.stdout is None:
        return "standard output is closed: give --output FILE."
    if not is_stdio(input_path):
        if os.path.isdir(input_path):
            return f"--input {input_path} is a directory, not a text file."
        if not os.path.isfile(input_path):
            return f"--input {input_path}: no such file."
    if not is_stdio(output_path) and os.path.isdir(output_path):
        return f"--output {output_path} is a directory, not a file."
    return None


def main(argv=None) -> int:
    """`vaswani-translate` / `scripts/translate.py`: exit status 0, or 1 with an error line for bad input."""
    args = parse_args(argv)
    if problem := check_input_output(args.input, args.output):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    options = {k: getattr(args, k) for k in ("max_tokens", "max_source_length") if getattr(args, k) is not None}
    try:
        if args.engine == "ctranslate2":
            from .ctranslate2_export import translate_file_ctranslate2  # optional dependency: ctranslate2

            translate_file_ctranslate2(args.model_name_or_path, args.input, args.output, device=args.device,
                                       strict=args.strict, **decoding_arguments(args), **options)  # fmt: skip
            return 0
        model, tokenizer = load_model_and_tokenizer(
            args.model_name_or_path, device=args.device, dtype=args.dtype, revision=args.revision,
            trust_remote_code=args.trust_remote_code,
        )  # fmt: skip
        translate_file(
            model, tokenizer, args.input, args.output, strict=args.strict,
            show_progress=False if args.no_progress else None, **decoding_arguments(args), **options,
        )  # fmt: skip
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "check_model_folder",
    "load_model_and_tokenizer",
    "main",
    "resolve_dtype",
    "translate_file",
    "translate_lines",
]
