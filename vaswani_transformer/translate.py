"""Translating many lines: loading a model folder or Hub id, token-based batches, the paper's decoding.

`translate_lines(model, tokenizer, lines, ...)` is the library function behind `vaswani_transformer.evaluation` (its
`translate_fn`); `translate_file` (behind `vaswani-translate`: `main`, also `scripts/translate.py`) streams a file.
Both go through `iter_translations`, which yields exactly one translation per line, in order (its engine-independent
part, `translation_chunks`, also serves `--engine ctranslate2`):

- The input is read `window` lines at a time (DEFAULT_WINDOW); a window is sorted by length into batches and its
  translations come out in input order as soon as they are done, so memory is flat in the input size and a run
  killed half-way has written every finished line (`translate_file(..., resume=True)` continues it).
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
import itertools
import json
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer
from transformers.hf_argparser import string_to_bool

from . import cli
from .checkpoints import load_trained_model
from .data import TokenBatchSampler
from .generation import config_sets_a_length
from .hardware import keep_freed_cpu_memory, warn_if_emulated
from .pipeline import source_length_limit, truncate_source
from .textio import (
    STDIN_NAME,
    LineWriter,
    count_lines,
    drop_partial_line,
    is_regular_file,
    is_same_file,
    is_stdio,
    iter_lines,
)
from .tokenization import check_vocabulary_fits


logger = logging.getLogger(__name__)

DTYPES = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEFAULT_MAX_TOKENS = 4096  # most source tokens per batch, padding included
DEFAULT_WINDOW = 1000  # lines read, sorted by length and batched together; memory is flat in the input size


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


QUANTIZATIONS = ("int8",)
try:  # the layer `quantize_linear_layers` puts in (torch imports it itself; torch.ao announces a move to torchao)
    from torch.ao.nn.quantized.dynamic import Linear as _INT8_LINEAR
except ImportError:
    _INT8_LINEAR = None


def quantize_linear_layers(model, quantization: str = "int8"):
    """`model` (float32, on a CPU) with every `nn.Linear` in int8, in place, by PyTorch's dynamic quantization for CPU
    inference, `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`: int8 weights, each
    call's inputs quantized as they come (fbgemm's kernels; VNNI where the CPU has it). An approximation, as bf16 is:
    for inference only, and not batch-invariant (an input's int8 scale is one per product, over the batch: a line's
    translation may change with the lines batched with it, `--max_tokens`, or where `--resume` starts). Another
    quantization, device or dtype is a ValueError naming it; a torch without `torch.ao.quantization` an ImportError."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}.")
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu":
        raise ValueError(f"--quantization {quantization} is PyTorch's dynamic quantization for CPUs; the model is on "
                         f"{weight.device}: use --device cpu, or leave --quantization out.")
    if weight.dtype != torch.float32:
        raise ValueError(f"--quantization {quantization} quantizes float32 weights; this model's are "
                         f"{str(weight.dtype).removeprefix('torch.')}: give --dtype float32 or leave --dtype out.")
    ao_quantization = getattr(getattr(torch, "ao", None), "quantization", None)
    if not hasattr(ao_quantization, "quantize_dynamic"):
        raise ImportError(f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic (--quantization "
                          f"{quantization}); translate without --quantization.")  # fmt: skip
    with warnings.catch_warnings():  # torch's notices that these APIs will move to torchao: nothing to act on here
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")
        return ao_quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def quantization_of(model) -> str | None:
    """"int8" where `quantize_linear_layers` quantized `model`'s linear layers, else None."""
    return "int8" if _INT8_LINEAR is not None and any(isinstance(m, _INT8_LINEAR) for m in model.modules()) else None


def load_model_and_tokenizer(
    model_name_or_path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    quantization: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    tokenizer=None,
    remedy: str = "translate in float32 (--dtype float32)",
):
    """(model in eval mode, tokenizer) from a local folder (checked with `check_model_folder` first) or a Hub id; the
    tokenizer from the same place unless given. `quantization` ("int8"): the linear layers quantized
    (`quantize_linear_layers`). `remedy`: what the emulated-precision warning advises."""
    name = os.fspath(model_name_or_path)
    if os.path.isdir(name):
        check_model_folder(name)
    elif os.path.exists(name):
        raise ValueError(f"{name} is a file; expected a model folder or a Hub model id.")
    elif name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise FileNotFoundError(f"Model folder {name} does not exist (and it is not a Hub id of the form owner/name).")
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    model_kwargs = dict(kwargs)
    if dtype is not None:
        model_kwargs["dtype"] = resolve_dtype(dtype)
    model = load_trained_model(name, **model_kwargs)  # one-line errors: unsafe pickle, truncated, other shapes/names
    check_vocabulary_fits(tokenizer, model.config, name)  # before translating anything
    if device is not None:
        model.to(device)
    warn_if_emulated(model, f"The model {name}", remedy)
    if quantization is not None:
        model = quantize_linear_layers(model.eval(), quantization)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------------------------- translating


def _encode(tokenizer, lines: Sequence[str], limit: int | None, strict: bool, source_name: str,
            first_line: int = 1) -> dict[int, list[int]]:
    """Token ids of the non-empty lines (index -> ids), truncated to `limit` with a warning naming the line (numbered
    from `first_line`)."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    encoded = tokenizer([lines[i] for i in todo], add_special_tokens=True)["input_ids"] if todo else []
    ids_by_line = {}
    for i, ids in zip(todo, encoded):
        if limit is not None and len(ids) > limit:
            where = f"{source_name}:{first_line + i}: the source has {len(ids)} tokens, more than the limit of {limit}"
            if strict:
                raise ValueError(f"{where} (strict mode: not translated).")
            logger.warning("%s; translating its first %d tokens.", where, limit)
            ids = truncate_source(ids, limit, tokenizer.eos_token_id)
        ids_by_line[i] = ids
    return ids_by_line


def _windows(lines: Iterable[str], window: int | None, source_name: str) -> Iterator[list[str]]:
    """Consecutive lists of `window` lines (all of them for None), read lazily; a non-string is a TypeError."""
    lines = iter(lines)
    number = 0
    while chunk := list(itertools.islice(lines, window)):
        for line in chunk:
            number += 1
            if not isinstance(line, str):
                raise TypeError(f"{source_name} {number} is a {type(line).__name__}, expected a string.")
        yield chunk
        if window is None:
            return


# `translation_chunks`' keywords besides the engine's: how lines are read, batched and reported, not translated
CHUNKING_KEYWORDS = ("window", "max_tokens", "strict", "show_progress", "total", "source_name", "first_line")


def translation_chunks(
    translate_batch: Callable[[list[list[int]]], list[str]],
    tokenizer,
    lines: Iterable[str],
    *,
    limit: int | None,
    window: int | None = DEFAULT_WINDOW,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    strict: bool = False,
    show_progress: bool | None = None,
    total: int | None = None,
    source_name: str = "line",
    first_line: int = 1,
) -> Iterator[list[str]]:
    """What every engine shares (the module docstring's rules): windows of `lines`, their sources encoded and cut to
    `limit`, empty lines as "", token batches of at most `max_tokens`, a progress bar; `translate_batch` turns one
    batch's source ids into its translations. After each batch, yields the translations that extend the finished
    prefix of the window, in input order (an empty list yields nothing); reads the next window only once this one is
    yielded."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
    if window is not None and window < 1:
        raise ValueError(f"window must be positive, got {window}.")
    disable = None if show_progress is None else not show_progress  # None: a bar only on a terminal
    with tqdm(total=total, desc="Translating", unit="sent", disable=disable) as bar:
        for chunk in _windows(lines, window, source_name):
            ids_by_line = _encode(tokenizer, chunk, limit, strict, source_name, first_line)
            first_line += len(chunk)
            translations: list[str | None] = [None] * len(chunk)
            for i in range(len(chunk)):
                if i not in ids_by_line:  # empty or whitespace-only: "" without the model
                    translations[i] = ""
            done = 0  # translations[:done] have been yielded

            def finished_prefix() -> list[str]:
                nonlocal done
                start = done
                while done < len(chunk) and translations[done] is not None:
                    done += 1
                return translations[start:done]

            if prefix := finished_prefix():
                yield prefix
            indices = list(ids_by_line)
            lengths = [min(len(ids_by_line[i]), max_tokens) for i in indices]  # longer ones end up alone in a batch
            batches = TokenBatchSampler(lengths, lengths, max_tokens, shuffle=False).batches if indices else []
            for batch in batches:
                rows = [indices[j] for j in batch]
                for i, text in zip(rows, translate_batch([ids_by_line[i] for i in rows]), strict=True):
                    translations[i] = text
                bar.update(len(rows))
                if prefix := finished_prefix():
                    yield prefix
            bar.update(len(chunk) - len(indices))


def iter_translation_chunks(
    model,
    tokenizer,
    lines: Iterable[str],
    *,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_len_a: float | None = None,
    max_len_b: float | None = None,
    max_source_length: int | None = None,
    **kwargs,
) -> Iterator[list[str]]:
    """`iter_translations`, in lists (`translation_chunks` with `model.generate` as the engine): kwargs named in
    `CHUNKING_KEYWORDS` go to `translation_chunks`, the others to `generate`."""
    batching = {k: kwargs.pop(k) for k in CHUNKING_KEYWORDS if k in kwargs}
    if kwargs.get("num_return_sequences") not in (None, 1):
        raise ValueError(
            f"num_return_sequences={kwargs['num_return_sequences']}: translating gives one translation per line, so "
            "the others would be thrown away; for n-best lists call model.generate(..., num_return_sequences=N)."
        )
    overrides = {"num_beams": num_beams, "length_penalty": length_penalty, "max_len_a": max_len_a,
                 "max_len_b": max_len_b}
    generate_kwargs = {**{k: v for k, v in overrides.items() if v is not None}, **kwargs}
    limit = source_length_limit(model.config, max_source_length)
    model.eval()

    def translate_batch(sources: list[list[int]]) -> list[str]:
        with torch.inference_mode():
            inputs = tokenizer.pad({"input_ids": sources}, return_tensors="pt")
            inputs = {k: v.to(model.device) for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
            output = model.generate(**inputs, **generate_kwargs)
        if not isinstance(output, torch.Tensor):  # return_dict_in_generate: a ModelOutput with .sequences
            output = output.sequences
        num_return = output.shape[0] // len(sources)
        return tokenizer.batch_decode(output[::num_return], skip_special_tokens=True)

    yield from translation_chunks(translate_batch, tokenizer, lines, limit=limit, **batching)


def iter_translations(model, tokenizer, lines: Iterable[str], **kwargs) -> Iterator[str]:
    """Translate `lines` (any iterable, read lazily) in windows of `window` lines (default DEFAULT_WINDOW; None: all
    at once): each window is sorted by length into token batches and its translations are yielded in input order as
    they are done, so memory stays flat in the number of lines. Same keywords as `translate_lines`."""
    for chunk in iter_translation_chunks(model, tokenizer, lines, **kwargs):
        yield from chunk


def translate_lines(
    model,
    tokenizer,
    lines: Sequence[str] | Iterable[str],
    *,
    window: int | None = DEFAULT_WINDOW,
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

    window: lines sorted and batched together (`iter_translations`; None: all of them).
    max_tokens: most source tokens in a batch, padding included (the decoder side grows with the beam and output).
    num_beams, length_penalty (alpha), max_len_a, max_len_b: override the model's generation config (None keeps it).
    max_source_length: truncate longer sources (with a warning naming `source_name`:line), or refuse them if `strict`.
    show_progress: tqdm bar over sentences (None: only on a terminal).
    generate_kwargs: anything else `model.generate` accepts (e.g. `length_penalty_type="transformers"`).
    """
    lines = list(lines)
    return list(iter_translations(
        model, tokenizer, lines, window=window, max_tokens=max_tokens, num_beams=num_beams,
        length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b, max_source_length=max_source_length,
        strict=strict, show_progress=show_progress, total=len(lines), source_name=source_name, **generate_kwargs,
    ))  # fmt: skip


class TranslationInterrupted(KeyboardInterrupt):
    """A run of `translate_file` stopped by SIGINT/SIGTERM (or Ctrl-C); everything finished is in the output."""

    def __init__(self, signum: int, written: int | None = None, total: int | None = None, output: str | None = None):
        super().__init__(signum)
        self.signum, self.written, self.total, self.output = signum, written, total, output

    def __str__(self) -> str:
        if self.written is None:  # raised before translating began (e.g. while the model loads)
            return "interrupted before any line was written"
        of = f" of {self.total}" if self.total is not None else ""
        resume = " (resume with --resume)" if self.output != "standard output" else ""
        return f"interrupted: {self.written}{of} lines written to {self.output}{resume}"


def prepare_resume(output_path: str | os.PathLike) -> int:
    """The number of complete lines an unfinished output file already holds (0 if it does not exist), after cutting
    off a partial last line (a process killed while writing) with a warning."""
    if is_stdio(output_path):
        raise ValueError("--resume needs --output FILE (the file to continue); standard output cannot be resumed.")
    if not os.path.exists(output_path):
        logger.warning("--resume: %s does not exist yet; translating from the first line.", output_path)
        return 0
    if dropped := drop_partial_line(output_path):
        logger.warning("--resume: dropped the partial last line of %s (%d bytes, no line break).", output_path, dropped)
    return count_lines(output_path)


RUN_RECORD_SUFFIX = ".translate.json"  # beside an output file while it is being written; removed when it is done
PIPE_INPUT = "a pipe or standard input"
BATCHING_OPTIONS = ("window", "max_tokens", "show_progress", "strict", "total")  # they do not change a line's output


def recorded_input(input_path) -> str:
    """The input as a run record names it: a regular file's absolute path, else `PIPE_INPUT`."""
    return os.path.abspath(input_path) if is_regular_file(input_path) else PIPE_INPUT


def decoding_options_given(options: dict) -> dict:
    """The options given to a run that decide its lines (not those of `BATCHING_OPTIONS`), sorted, None left out."""
    return {k: v for k, v in sorted(options.items()) if k not in BATCHING_OPTIONS and v is not None}


def run_record(model, input_path, options: dict) -> dict:
    """What decides an output file's lines: the engine, the model (its folder or Hub id), its dtype and quantization,
    the input, and the decoding (the generation config with the options given over it; `--resume` refuses to
    continue a file begun otherwise)."""
    model_name = getattr(model, "name_or_path", "") or ""
    generation = model.generation_config.to_dict() if getattr(model, "generation_config", None) else {}
    generation = {k: v for k, v in generation.items() if v is not None and k != "transformers_version"}
    given = decoding_options_given(options)
    return {
        "engine": "transformers",
        "model": os.path.abspath(model_name) if os.path.isdir(model_name) else model_name,
        "revision": getattr(getattr(model, "config", None), "_commit_hash", None),  # a Hub model's commit
        "dtype": str(getattr(model, "dtype", "")).removeprefix("torch."),
        "quantization": quantization_of(model),
        "input": recorded_input(input_path),
        # what decodes: the generation config with the options given over it (num_beams=4 given = the model's 4)
        "decoding": {**generation, **given},
        # a length rule given beats a length saved in the generation config, even at the config's own values
        "length_rule_given": any(given.get(name) is not None for name in ("max_len_a", "max_len_b"))
        and config_sets_a_length(generation),
    }


def check_run_record(record_path: str, record: dict, output_name: str) -> None:
    """`--resume`: the run that wrote the output's first lines must be this one (model, dtype, decoding, and the
    input where both runs read a file)."""
    if not os.path.exists(record_path):
        logger.warning("--resume: no %s beside %s (written before runs were recorded, or removed): whether its lines "
                       "came from this model and options cannot be checked.", os.path.basename(record_path),
                       output_name)  # fmt: skip
        return
    try:
        with open(record_path, encoding="utf-8") as file:
            earlier = json.load(file)
    except (OSError, ValueError) as error:  # e.g. cut short by a kill or a full disk while it was written
        raise ValueError(f"--resume: the run record {record_path} cannot be read ({error}); delete it to continue "
                         "anyway (what began the output is then not checked).") from error
    earlier.setdefault("engine", "transformers")  # a record written before `--engine ctranslate2` kept one
    pipe = PIPE_INPUT in (earlier.get("input"), record["input"])  # a pipe's lines cannot be told apart from a file's
    changed = []
    for key in [*record, *(key for key in earlier if key not in record)]:  # another engine's record has other keys
        then, value = earlier.get(key), record.get(key)
        if then == value or (key == "input" and pipe):
            continue
        if isinstance(then, dict) and isinstance(value, dict):  # name the fields that differ, not the whole config
            changed += [f"{key}.{field}: {then.get(field)!r} then, {value.get(field)!r} now"
                        for field in sorted(set(then) | set(value)) if then.get(field) != value.get(field)]  # fmt: skip
        else:
            changed.append(f"{key}: {then!r} then, {value!r} now")
    if changed:
        raise ValueError(f"--resume: {output_name} was begun by another run ({'; '.join(changed)}); its lines would "
                         f"mix two translations. Resume with the same model, input and options, or delete "
                         f"{record_path} to continue anyway.")  # fmt: skip


def translate_file(
    model,
    tokenizer,
    input_path: str | os.PathLike | None = None,
    output_path: str | os.PathLike | None = None,
    *,
    resume: bool = False,
    **kwargs,
) -> int:
    """Translate a file (or stdin, or a pipe) line for line into a file (or stdout), streaming: windows of lines are
    read, translated and written as they finish (`iter_translations`), each write flushed. Returns the number of
    lines the output holds, which always equals the number read (otherwise a ValueError: the input changed while it
    was read). Line breaks inside a translation become spaces. An output that is the input file is a ValueError.

    resume: continue an output file that holds the first K translations (a partial last line is cut off first):
    skip the first K input lines (of a pipe too: the first K it delivers) and append. While a regular output file is
    written, `<output>.translate.json` beside it records the run (`run_record`: model, dtype, input, decoding);
    resuming with another is a ValueError naming what changed, and the record is removed once the file is complete.
    KeyboardInterrupt (Ctrl-C, or the signals `main` turns into it) becomes `TranslationInterrupted`, saying how
    many lines the output holds.
    kwargs go to `iter_translations`."""

    def chunks(lines: Iterable[str], **where) -> Iterator[list[str]]:
        return iter_translation_chunks(model, tokenizer, lines, **where, **kwargs)

    return stream_translations(chunks, run_record(model, input_path, kwargs), input_path, output_path, resume=resume)


def stream_translations(
    chunks: Callable[..., Iterator[list[str]]],
    record: dict,
    input_path: str | os.PathLike | None = None,
    output_path: str | os.PathLike | None = None,
    *,
    resume: bool = False,
) -> int:
    """`translate_file` for any engine: `chunks(lines, total=, source_name=, first_line=)` yields the translations of
    `lines` in order, in lists (`translation_chunks`); `record` (`run_record`) is what `--resume` checks."""
    record = json.loads(json.dumps(record, default=repr))  # as it reads back from the file
    name = STDIN_NAME if is_stdio(input_path) else os.fspath(input_path)
    output_name = "standard output" if is_stdio(output_path) else os.fspath(output_path)
    if is_same_file(input_path, output_path):
        raise ValueError(same_file_problem(input_path, output_path))
    skip = prepare_resume(output_path) if resume else 0
    # a record beside a regular file only (not /dev/null, a pipe or `>(...)`: nothing to resume there)
    record_path = output_name + RUN_RECORD_SUFFIX if is_regular_file(output_path) or (
        not is_stdio(output_path) and not os.path.exists(output_path)) else None  # fmt: skip
    if record_path and skip:
        check_run_record(record_path, record, output_name)
    total = count_lines(input_path) if is_regular_file(input_path) else None  # a pipe can be read only once
    if total is not None and skip > total:
        raise ValueError(f"--resume: {output_name} holds {skip} lines but {name} only {total}: not its translation.")
    read = 0

    def counted(lines: Iterable[str]) -> Iterator[str]:
        nonlocal read
        _stop_if_signalled()
        for line in lines:
            read += 1
            yield line
            _stop_if_signalled()  # before reading on: a stdin left open would never end the run

    lines = counted(iter_lines(input_path))
    skipped = sum(1 for _ in itertools.islice(lines, skip))
    if skipped < skip:
        raise ValueError(f"--resume: {output_name} holds {skip} lines but {name} only {skipped}: not its translation.")
    if skip:
        logger.warning("--resume: %s holds %d lines; translating from line %d of %s.", output_name, skip, skip + 1,
                       name)  # fmt: skip
    writer = LineWriter(output_path, append=resume)  # makes the output's folder
    try:
        if record_path:
            try:
                with open(record_path, "w", encoding="utf-8") as file:
                    json.dump(record, file, indent=2)
            except OSError as error:  # (a folder one may write files in but not create them)
                logger.warning("Could not write the run record %s (%s): --resume will not check what began %s.",
                               record_path, error, output_name)  # fmt: skip
                record_path = None
        todo = None if total is None else total - skip  # the progress bar's total
        for chunk in chunks(lines, total=todo, source_name=name, first_line=skip + 1):
            writer.write(chunk)
            _stop_if_signalled()
    except KeyboardInterrupt as stop:
        writer.close()
        written = count_lines(output_path) if not is_stdio(output_path) else writer.lines
        raise TranslationInterrupted(getattr(stop, "signum", signal.SIGINT), written, total, output_name) from None
    finally:
        writer.close()
    written = skip + writer.lines
    if written != read or (total is not None and read != total):  # one output line per input line, or an error
        began = f" ({total} when the run began)" if total is not None else ""
        raise ValueError(f"{name}: {read} lines read{began} but {written} in {output_name}: the input changed while "
                         "it was translated (is something writing to it?); translate it again.")
    if record_path:
        os.remove(record_path)
    return written


# -------------------------------------------------------------------------------------------- command line

CLI_DESCRIPTION = f"""Translate a text file (or stdin) line for line with a saved model, decoding as the paper did by default.

    %(prog)s --model_name_or_path runs/quickstart --input test.en --output test.hyp.de
    echo "A man rides a bike." | %(prog)s --model_name_or_path runs/multi30k_cpu/averaged --num_beams 4

One output line per input line, always (an empty line gives an empty line). The input is read --window lines at a
time (default {DEFAULT_WINDOW}), sorted by length into batches of at most --max_tokens source tokens (default
{DEFAULT_MAX_TOKENS}), and the translations are written in input order as they finish, so memory stays flat and an
interrupted run (Ctrl-C, SIGTERM) keeps every finished line: --resume continues such an --output file. Decoding
defaults come from the model's generation config (the paper's: beam 4, GNMT length penalty 0.6, at most source
length + 50 tokens). Options are spelled as transformers' run_translation.py spells them (--num_beams,
--length_penalty); the first spelling shown is the canonical one, the others (dashes, the older --beam and --alpha)
are accepted aliases. See `vaswani_transformer.translate.translate_file`.
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


def transformers_only_options(args: argparse.Namespace) -> str | None:
    """With `--engine ctranslate2` (vaswani-translate, vaswani-evaluate): the problem of any option given that only
    our engine honours, else None. Refused, not ignored: a CTranslate2 folder computes in its exported type."""
    names = ("dtype", "quantization", "revision", "trust_remote_code")
    given = [f"--{name}" for name in names if getattr(args, name, None) not in (None, False)]
    if not given:
        return None
    typed = "--dtype" in given or "--quantization" in given
    why = " (with ctranslate2 the weight type is chosen by vaswani-export-ctranslate2 --quantization)" if typed else ""
    return f"{', '.join(given)} need --engine transformers{why}."


def add_quantization_argument(parser: argparse.ArgumentParser) -> None:
    """`--quantization int8` (vaswani-translate, vaswani-evaluate): `quantize_linear_layers` after loading."""
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="int8: the linear layers in int8 on a CPU (PyTorch's dynamic quantization; float32 "
                        "weights), faster than float32 and an approximation of it (default: none).")  # fmt: skip


def add_memory_argument(parser: argparse.ArgumentParser) -> None:
    """`--keep_freed_cpu_memory` (vaswani-translate, vaswani-evaluate; `keep_freed_memory_on_cpu` applies it)."""
    parser.add_argument("--keep_freed_cpu_memory", "--keep-freed-cpu-memory", type=string_to_bool, default=True,
                        metavar="{true,false}", help="On a CPU, keep freed memory in the process instead of returning "
                        "it to the OS and faulting it back in (decoding and packing weights allocate the same large "
                        "tensors again and again), as training does (default: true).")  # fmt: skip


def keep_freed_memory_on_cpu(keep: bool, device: str | None) -> None:
    """`hardware.keep_freed_cpu_memory()` where `keep` and the device is a CPU (None: the CPU)."""
    if keep and torch.device(device or "cpu").type == "cpu":
        keep_freed_cpu_memory()


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
    parser.add_argument("--max_tokens", "--max-tokens", type=cli.positive_int,
                        help="Most source tokens per batch, padding included.")  # fmt: skip
    parser.add_argument("--window", type=cli.positive_int,
                        help=f"Lines read, sorted by length and batched together (default {DEFAULT_WINDOW}).")
    parser.add_argument("--resume", action="store_true",
                        help="Continue --output FILE: keep its complete lines, skip as many input lines, append.")
    parser.add_argument("--max_source_length", "--max-source-length", type=int,
                        help="Truncate longer sources (with a warning naming the line); see --strict.")  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="Refuse over-long sources instead of truncating them.")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps ... (default: cpu).")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="Weights dtype (default: as saved).")
    add_quantization_argument(parser)
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit).")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true",
                        help="Allow the model's own code (not needed for vaswani_transformer models).")  # fmt: skip
    add_memory_argument(parser)
    parser.add_argument("--no_progress", "--no-progress", action="store_true", help="No progress bar.")
    return parser.parse_args(argv)


def same_file_problem(input_path, output_path) -> str:
    """The error for an output that is the input file (writing it would empty the input before it is read)."""
    read = "standard input" if is_stdio(input_path) else f"--input {os.fspath(input_path)}"
    written = "standard output" if is_stdio(output_path) else f"--output {os.fspath(output_path)}"
    return f"{written} is the same file as {read}: writing it would destroy the input; write to another file."


def check_input_output(input_path: str, output_path: str, resume: bool = False) -> str | None:
    """Why ``--input``/``--output`` cannot be used (a closed standard stream, a missing or unreadable file, a
    directory, an output that is the input, --resume without an output file), or None; checked before the model
    loads. A pipe (`<(cat f)`, /dev/stdin) is an input like stdin."""
    if is_stdio(input_path) and sys.stdin is None:
        return "standard input is closed: pipe the sentences in or give --input FILE."
    if is_stdio(output_path) and sys.stdout is None:
        return "standard output is closed: give --output FILE."
    if not is_stdio(input_path):
        if os.path.isdir(input_path):
            return f"--input {input_path} is a directory, not a text file."
        if not os.path.exists(input_path):
            return f"--input {input_path}: no such file."
        if not os.access(input_path, os.R_OK):
            return f"--input {input_path}: no permission to read it."
    if is_same_file(input_path, output_path):
        return same_file_problem(input_path, output_path)
    if not is_stdio(output_path) and os.path.isdir(output_path):
        return f"--output {output_path} is a directory, not a file."
    if not is_stdio(output_path) and (problem := cli.output_path_problem(output_path, "--output")):
        return problem  # a file where a parent folder must be, or no write permission
    if resume and is_stdio(output_path):
        return "--resume needs --output FILE (the file to continue); standard output cannot be resumed."
    return None


# The signal `main`'s handler received, checked by `translate_file` before each line it reads and after each write:
# a handler's exception raised while Python runs a finalizer (a generator's cleanup, a weakref callback) is only
# printed, and the run would go on, and wait on an open stdin for good.
_stop_signal: int | None = None


def _stop_on_signal(signum, frame):
    """SIGINT/SIGTERM handler of `main`: stop where the program is (a second signal ends it at once)."""
    global _stop_signal
    signal.signal(signum, signal.SIG_DFL)
    _stop_signal = signum
    raise TranslationInterrupted(signum)


def _stop_if_signalled() -> None:
    """Raise the stop `main`'s handler asked for, if an exception of its did not get through (`_stop_signal`)."""
    if _stop_signal is not None:
        raise TranslationInterrupted(_stop_signal)


def _quiet_swallowed_stop(previous_hook):
    """A sys.unraisablehook for `main`: a stop swallowed in a finalizer is no error (`_stop_signal` carries it)."""

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, TranslationInterrupted):
            previous_hook(unraisable)

    return hook


def _interrupt_only(signum, frame):
    """The handler of `_StopSignals`'s nudge: none; the signal only ends the main thread's blocking call."""


class _StopSignals:
    """`main`'s SIGINT/SIGTERM handling while it runs: `_stop_on_signal`, and the guards that make its stop happen.

    Python runs a handler only when the main thread next runs bytecode. A main thread blocked in a read (stdin) or a
    write (a pipe) that began just after the signal came, or while another thread took it, would wait for good: a
    helper thread wakes up with every signal (`signal.set_wakeup_fd`) and interrupts the main thread's call with
    SIGURG (handled by nothing) until the handler has run. A stop raised inside a finalizer stays in `_stop_signal`,
    without a printed traceback (`_quiet_swallowed_stop`)."""

    def __enter__(self) -> "_StopSignals":
        global _stop_signal
        _stop_signal = None
        handled = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]  # nohup
        self.previous = {s: signal.signal(s, _stop_on_signal) for s in handled}
        self.previous_hook, sys.unraisablehook = sys.unraisablehook, _quiet_swallowed_stop(sys.unraisablehook)
        self.helper = None
        if handled and hasattr(signal, "pthread_kill") and hasattr(signal, "SIGURG"):  # POSIX
            self.read_end, self.write_end = os.pipe()
            os.set_blocking(self.write_end, False)  # set_wakeup_fd's rule
            self.previous_wakeup_fd = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
            self.previous_nudge = signal.signal(signal.SIGURG, _interrupt_only)
            self.ended = threading.Event()
            self.helper = threading.Thread(target=self._nudge_until_handled, args=(threading.get_ident(), handled),
                                           name="translate-stop-signals", daemon=True)  # fmt: skip
            self.helper.start()
        return self

    def _nudge_until_handled(self, main_thread: int, handled: list[int]) -> None:
        """The helper thread: after each stop signal, SIGURG to the main thread every 50 ms until the handler ran."""
        while not self.ended.is_set():
            received = os.read(self.read_end, 64)  # a byte per signal: its number
            if any(number in handled for number in received):
                while _stop_signal is None and not self.ended.is_set():
                    signal.pthread_kill(main_thread, signal.SIGURG)
                    self.ended.wait(0.05)

    def __exit__(self, *exc) -> None:
        global _stop_signal
        if self.helper is not None:
            signal.set_wakeup_fd(self.previous_wakeup_fd)
            self.ended.set()
            os.write(self.write_end, b"\0")
            self.helper.join()
            os.close(self.read_end)
            os.close(self.write_end)
            signal.signal(signal.SIGURG, self.previous_nudge)
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        sys.unraisablehook, _stop_signal = self.previous_hook, None


def main(argv=None) -> int:
    """`vaswani-translate` / `scripts/translate.py`: exit status 0; 1 with an error line for bad input; 130/143 with
    the line "interrupted: N of M lines written to <path> (resume with --resume)" after SIGINT/SIGTERM."""
    args = parse_args(argv)
    if problem := check_input_output(args.input, args.output, args.resume):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if args.engine == "ctranslate2" and (problem := transformers_only_options(args)):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    names = ("max_tokens", "max_source_length", "window")
    options = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    with _StopSignals():
        return _run(args, options)


def _run(args: argparse.Namespace, options: dict) -> int:
    """`main` once the arguments are checked, with its stop signals handled."""
    try:
        if args.engine == "ctranslate2":
            from .ctranslate2_export import translate_file_ctranslate2  # optional dependency: ctranslate2

            translate_file_ctranslate2(
                args.model_name_or_path, args.input, args.output, device=args.device, resume=args.resume,
                strict=args.strict, show_progress=False if args.no_progress else None, **decoding_arguments(args),
                **options,
            )  # fmt: skip
            return 0
        keep_freed_memory_on_cpu(args.keep_freed_cpu_memory, args.device)
        model, tokenizer = load_model_and_tokenizer(
            args.model_name_or_path, device=args.device, dtype=args.dtype, quantization=args.quantization,
            revision=args.revision, trust_remote_code=args.trust_remote_code,
        )  # fmt: skip
        translate_file(
            model, tokenizer, args.input, args.output, resume=args.resume, strict=args.strict,
            show_progress=False if args.no_progress else None, **decoding_arguments(args), **options,
        )  # fmt: skip
    except TranslationInterrupted as stop:
        print(stop, file=sys.stderr)
        return 128 + stop.signum
    except BrokenPipeError:  # e.g. `| head`: whatever reads our output has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python exits
        print("error: standard output was closed before every line was written.", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "DEFAULT_WINDOW",
    "TranslationInterrupted",
    "check_model_folder",
    "iter_translation_chunks",
    "iter_translations",
    "load_model_and_tokenizer",
    "main",
    "prepare_resume",
    "quantization_of",
    "quantize_linear_layers",
    "run_record",
    "resolve_dtype",
    "translate_file",
    "translate_lines",
]


if __name__ == "__main__":  # python -m vaswani_transformer.translate, as the console script
    sys.exit(main())
