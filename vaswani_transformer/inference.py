"""Translating many lines: loading a model folder or Hub id, token-based batches, the paper's decoding.

`translate_lines(model, tokenizer, lines, ...)` is the library function behind `scripts/translate.py` and
`vaswani_transformer.evaluation` (its `translate_fn`). It returns exactly one translation per line, in order:

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

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .pipeline import source_length_limit, truncate_source


logger = logging.getLogger(__name__)

DTYPES = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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
        import json

        try:
            shards = sorted(set(json.loads((folder / index_name).read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError) as error:
            raise ValueError(f"{folder / index_name}: not a valid weight index ({error}).") from None
        missing.extend(
            f"{shard} (a weight shard listed in {index_name})" for shard in shards if not (folder / shard).is_file()
        )
    tokenizer_found = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if "tokenizer.json" not in tokenizer_found and not any(folder.glob("*.model")) and not any(folder.glob("vocab.*")):
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
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

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


# ------------------------------------------------------------------------------------------- reading lines


def read_input_lines(path: str | os.PathLike | None = None) -> tuple[list[str], str]:
    """(lines, name) of a UTF-8 text file, or of stdin when `path` is None or "-". Lines keep their text (only the line
    break is removed; empty lines stay, as ""); invalid UTF-8 is a ValueError naming the file and line."""
    from .tokenization import iter_text_files

    if path is None or os.fspath(path) == "-":
        lines = []
        for number, raw in enumerate(sys.stdin.buffer, start=1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                raise ValueError(f"<stdin>:{number}: invalid UTF-8 ({err.reason} at byte {err.start}).") from None
        return lines, "<stdin>"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Input file {path} does not exist.")
    return list(iter_text_files([path])), os.fspath(path)


def one_line(text: str) -> str:
    """`text` with its line breaks (\\r, \\n) turned into spaces, so that one translation stays one output line."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


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
    max_tokens: int = 4096,
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
    from .data import TokenBatchSampler

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
    lines, name = read_input_lines(input_path)
    translations = translate_lines(model, tokenizer, lines, source_name=name, **kwargs)
    if len(translations) != len(lines):  # pragma: no cover - guarded by translate_lines
        raise RuntimeError(f"{len(translations)} translations for {len(lines)} lines.")
    text = "".join(one_line(t) + "\n" for t in translations)
    if output_path is None or os.fspath(output_path) == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))  # UTF-8 whatever the locale
        sys.stdout.buffer.flush()
    else:
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        Path(output_path).write_text(text, encoding="utf-8")
    return len(translations)


__all__ = [
    "check_model_folder",
    "load_model_and_tokenizer",
    "one_line",
    "read_input_lines",
    "resolve_dtype",
    "translate_file",
    "translate_lines",
]
