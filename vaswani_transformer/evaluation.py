"""BLEU evaluation: sacreBLEU + chrF with signatures, and the paper's tokenized BLEU.

The scores come from the `evaluate` module shipped in this package (`metrics/paper_bleu/paper_bleu.py`, loaded
offline by path with `evaluate.load`); its docstring states exactly how the paper-comparable tokenized BLEU
is computed: tensor2tensor's `get_ende_bleu.sh`, i.e. the Moses tokenizer (sacremoses) with the target
language's rules, ##AT## compound splitting for German targets, and multi-bleu.perl's corpus BLEU.

- `compute_translation_metrics(hypotheses, references, target_lang=...)`: all scores as a dict.
- `make_compute_metrics(tokenizer, target_lang)`: `compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`.
- `evaluate_model(model_or_path, sources, references, ...)`: translate a test set and write the JSON report
  that the model card reads (`evaluation_report` builds it from hypotheses alone; `read_test_set` and
  `report_translations` are the steps every engine shares, `ctranslate2_export.evaluate_ctranslate2` the other).
- `choose_length_penalty(score, values)`: the length penalty with the best validation score, as the paper chose its.
- `main(argv)`: the command line `vaswani-evaluate` (also `scripts/evaluate_model.py`).
"""

from __future__ import annotations

import argparse
import functools
import importlib.resources
import inspect
import json
import logging
import os
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import evaluate
import numpy as np
import torch
from sacrebleu.metrics import BLEU

from . import cli
from .card import is_evaluation_report
from .data import check_parallel_text_files, resolve_text_pair
from .generation import PAPER_GENERATION_DEFAULTS
from .hardware import warn_if_emulated
from .metrics.paper_bleu.paper_bleu import (
    _reference_streams,
    moses_tokenize,
    multi_bleu,
    split_compounds,
    tokenized_bleu,
)
from .textio import is_same_file, iter_lines, write_lines
from .translate import (
    DTYPES,
    add_decoding_arguments,
    add_memory_argument,
    add_quantization_argument,
    decoding_arguments,
    keep_freed_memory_on_cpu,
    load_model_and_tokenizer,
    quantization_of,
    transformers_only_options,
    translate_lines,
)

logger = logging.getLogger(__name__)


PathLike = str | os.PathLike


def paper_bleu_path() -> str:
    """Path of the packaged `paper_bleu` evaluate module (works from a source tree and an installed wheel)."""
    path = importlib.resources.files("vaswani_transformer") / "metrics" / "paper_bleu" / "paper_bleu.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"The packaged metric module {path} is missing; reinstall vaswani-transformer (package-data "
            "must include metrics/*/*.py)."
        )
    return str(path)


@functools.cache
def load_paper_bleu():
    """The `paper_bleu` metric, loaded once per process with `evaluate.load(<local path>)` (no network)."""
    return evaluate.load(paper_bleu_path(), keep_in_memory=True)


def compute_translation_metrics(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    target_lang: str = "",
    tokenize: str | None = None,
    lowercase: bool = False,
    compound_split: bool | None = None,
) -> dict[str, Any]:
    """sacreBLEU (`bleu`, `bleu_signature`), chrF (`chrf`, `chrf_signature`) and the paper's tokenized BLEU
    (`tokenized_bleu`, `tokenized_bleu_signature`, `tokenized_bleu_details`), plus sacreBLEU's
    counts/totals/precisions/bp/sys_len/ref_len and `num_sentences`. Scores are on a 0-100 scale.

    `references` holds one string per hypothesis, or a list of the same number of strings per hypothesis.
    `target_lang` selects sacreBLEU's tokenizer for that language (13a unless zh/ja/ko; `tokenize` overrides it)
    and the Moses tokenizer's rules for the tokenized BLEU (with ##AT## compound splitting for "de" unless
    `compound_split` says otherwise).
    """
    hypotheses, references = list(hypotheses), list(references)
    _reference_streams(hypotheses, references)  # clear errors before `evaluate` converts to Arrow
    return load_paper_bleu().compute(
        predictions=hypotheses,
        references=references,
        target_lang=target_lang or "",
        tokenize=tokenize,
        lowercase=lowercase,
        compound_split=compound_split,
    )


def make_compute_metrics(tokenizer, target_lang: str = "", tokenize: str | None = None) -> Callable:
    """A `compute_metrics` for `Seq2SeqTrainer` run with `predict_with_generate=True`.

    Decodes generated ids and labels (-100, the Trainer's padding and the ignored label positions, become the
    pad id; special tokens are skipped) and returns `bleu` (sacreBLEU), `chrf`, `tokenized_bleu` and `gen_len`
    (mean number of non-pad generated tokens), which the Trainer logs as `eval_bleu`, ...
    """
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("The tokenizer has no pad token; make_compute_metrics needs one to decode -100 padding.")

    def compute_metrics(eval_pred) -> dict[str, float]:
        predictions, labels = eval_pred[0], eval_pred[1]
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions, labels = np.asarray(predictions), np.asarray(labels)
        if predictions.ndim != 2 or not np.issubdtype(predictions.dtype, np.integer):
            raise ValueError(
                f"compute_metrics expects generated token ids (2-D integers), got an array of shape "
                f"{predictions.shape} and dtype {predictions.dtype}: run Seq2SeqTrainer with "
                "predict_with_generate=True."
            )
        predictions = np.where(predictions < 0, pad_id, predictions)
        labels = np.where(labels < 0, pad_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        scores = compute_translation_metrics(hypotheses, references, target_lang=target_lang, tokenize=tokenize)
        return {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "tokenized_bleu": scores["tokenized_bleu"],
            "gen_len": float(np.mean(np.count_nonzero(predictions != pad_id, axis=1))),
        }

    return compute_metrics


# ----------------------------------------------------------------------------------------------- reading text


def read_segments(path: PathLike, allow_empty: bool = False) -> list[str]:
    """The segments of a test file: its lines (`textio`), stripped of surrounding whitespace.

    Invalid UTF-8 and empty lines are ValueErrors naming the file and line (a test set with an empty segment
    is malformed; dropping it would silently change the test set). `allow_empty` keeps empty lines: a system's
    translation may be empty, and scores as such.
    """
    lines = []
    for number, text in enumerate(iter_lines(path), start=1):  # a missing file: FileNotFoundError naming it
        text = text.strip()
        if not text and not allow_empty:
            raise ValueError(f"{path}:{number}: empty line; every test segment needs text.")
        lines.append(text)
    if not lines:
        raise ValueError(f"{path}: the file is empty.")
    return lines


def _as_lines(value, what: str) -> tuple[list[str], str | None]:
    """(lines, file name or None) from a path or a sequence of strings."""
    if isinstance(value, (str, os.PathLike)):
        return read_segments(value), str(value)
    lines = list(value)
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{what} {i} is a {type(line).__name__}, expected a string.")
        if not line.strip():
            raise ValueError(f"{what} {i} is empty; every test segment needs text.")
    return lines, None


def _from_dataset(dataset, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """Sources and references from a `datasets.Dataset` in the `{"translation": {lang: text}}` form."""
    if isinstance(dataset, dict):  # DatasetDict
        raise ValueError(f"Got a dataset with splits {sorted(dataset)}; pass one split, e.g. dataset['test'].")
    if "translation" not in dataset.column_names:
        raise ValueError(
            f"The dataset has columns {dataset.column_names}; expected a 'translation' column of "
            "{language: text} dicts."
        )
    if not source_lang or not target_lang:
        raise ValueError("source_lang and target_lang are required to read a translation dataset.")
    sources, references = [], []
    for i, pair in enumerate(dataset["translation"]):
        for lang in (source_lang, target_lang):
            if lang not in pair or pair[lang] is None:
                raise ValueError(f"Dataset row {i} has no {lang!r} text (keys: {sorted(pair)}).")
        sources.append(pair[source_lang])
        references.append(pair[target_lang])
    return sources, references


# ------------------------------------------------------------------------------------------------ translating


_GENERATION_FIELDS = (*PAPER_GENERATION_DEFAULTS, "max_length", "max_new_tokens", "do_sample", "num_return_sequences")


def decoding_settings(translate_fn: Callable, decoding: dict | None = None, model=None) -> dict[str, Any]:
    """What decoded a test set, for the report: the translate function's qualified name and keyword defaults
    (JSON-representable ones), the decoding fields of `model.generation_config` (under "generation_config"),
    then the explicit `decoding` arguments, which take precedence."""
    name = getattr(translate_fn, "__qualname__", type(translate_fn).__name__)
    settings: dict[str, Any] = {"translate_fn": f"{getattr(translate_fn, '__module__', '?')}.{name}"}
    try:
        parameters = list(inspect.signature(translate_fn).parameters.values())[3:]
    except (TypeError, ValueError):
        parameters = []
    for parameter in parameters:
        if parameter.default is not inspect.Parameter.empty and isinstance(
            parameter.default, (bool, int, float, str, type(None))
        ):
            settings[parameter.name] = parameter.default
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        values = generation_config.to_dict()
        settings["generation_config"] = {k: values[k] for k in _GENERATION_FIELDS if values.get(k) is not None}
    settings.update(decoding or {})
    return settings


# -------------------------------------------------------------------------------------------------- reporting


def evaluation_report(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    source_lang: str = "",
    target_lang: str = "",
    model: str | None = None,
    decoding: dict | None = None,
    tokenize: str | None = None,
    output_json: PathLike | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Score `hypotheses` and return (and write to `output_json`) the report the model card reads.

    Fields: model, source_lang, target_lang, num_sentences, sacrebleu, sacrebleu_signature, chrf,
    chrf_signature, tokenized_bleu, tokenized_bleu_signature, bleu_details (sacreBLEU's counts, totals,
    precisions, bp, sys_len, ref_len), tokenized_bleu_details (the same for the tokenized BLEU), decoding,
    plus any `extra` fields (e.g. source_file, reference_file; `evaluate_model` adds model_dtype, the weights' dtype).
    An `output_json` holding something else than a report (a Trainer's `eval_results.json`) is refused
    (`other_results_problem`).
    """
    scores = compute_translation_metrics(hypotheses, references, target_lang=target_lang, tokenize=tokenize)
    if warning := unlike_normal_forms_warning(hypotheses, references, extra.get("reference_file")):
        logger.warning(warning)
    report = {
        "model": model,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "num_sentences": scores["num_sentences"],
        "sacrebleu": scores["bleu"],
        "sacrebleu_signature": scores["bleu_signature"],
        "chrf": scores["chrf"],
        "chrf_signature": scores["chrf_signature"],
        "tokenized_bleu": scores["tokenized_bleu"],
        "tokenized_bleu_signature": scores["tokenized_bleu_signature"],
        "bleu_details": {k: scores[k] for k in ("counts", "totals", "precisions", "bp", "sys_len", "ref_len")},
        "tokenized_bleu_details": scores["tokenized_bleu_details"],
        "decoding": decoding,
        **extra,
    }
    if output_json is not None:
        check_report_destination(output_json)
        output_json = Path(output_json)
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


def unlike_normal_forms_warning(hypotheses: Sequence[str], references: Sequence, reference_name=None) -> str | None:
    """A warning where every hypothesis is in Unicode NFC (our tokenizers decode to NFC) and some references are not:
    sacreBLEU and chrF compare characters as written, so a decomposed "u + diaeresis" counts against a composed "ü",
    and the same translations score lower (a perfect one 81 BLEU against NFD references). None otherwise."""
    if not all(unicodedata.is_normalized("NFC", h) for h in hypotheses):
        return None
    lines = [i for i, r in enumerate(references, 1)
             if not all(unicodedata.is_normalized("NFC", t) for t in ([r] if isinstance(r, str) else r))]  # fmt: skip
    if not lines:
        return None
    where = f"{reference_name}:{lines[0]}" if reference_name else f"reference {lines[0]}"
    return (f"{len(lines)} of {len(references)} references are not in Unicode NFC (the first: {where}) while the "
            "translations are: sacreBLEU and chrF count their decomposed characters as mismatches, so the scores are "
            "lower than for the same text in NFC. Normalise the references to NFC (unicodedata.normalize).")


class EvaluationSet(NamedTuple):
    """A test set's aligned segments and, where they came from files, the files' names."""

    sources: list[str]
    references: list[str]
    source_file: str | None
    reference_file: str | None


def read_test_set(sources=None, references=None, *, dataset=None, source_lang: str = "",
                  target_lang: str = "") -> EvaluationSet:  # fmt: skip
    """`sources` and `references` (files, one segment per line, or lists of strings), or `dataset` (a
    `datasets.Dataset` with a `translation` column) with `source_lang`/`target_lang`: checked to be aligned line by
    line, every segment with text (errors name the files and their counts)."""
    if dataset is not None:
        if sources is not None or references is not None:
            raise ValueError("Give either `dataset` or `sources` and `references`, not both.")
        sources, references = _from_dataset(dataset, source_lang, target_lang)
        (sources, source_name), (references, reference_name) = (
            _as_lines(sources, "Source"), _as_lines(references, "Reference")
        )
    else:
        if sources is None or references is None:
            raise ValueError("Both `sources` and `references` are required (or a `dataset`).")
        if all(isinstance(v, (str, os.PathLike)) for v in (sources, references)):
            check_parallel_text_files(os.fspath(sources), os.fspath(references))  # names both files and counts
        sources, source_name = _as_lines(sources, "Source")
        references, reference_name = _as_lines(references, "Reference")
    if len(sources) != len(references):
        raise ValueError(
            f"{source_name or 'sources'} has {len(sources)} segments but {reference_name or 'references'} has "
            f"{len(references)}: they must be aligned line by line."
        )
    return EvaluationSet(sources, references, source_name, reference_name)


def report_translations(
    hypotheses: Sequence[str],
    test_set: EvaluationSet,
    *,
    model: str,
    decoding: dict,
    hypotheses_file: PathLike | None = None,
    **report: Any,
) -> dict[str, Any]:
    """`evaluation_report` of an engine's translations of `test_set` (one per source, else a RuntimeError), with
    where the test set came from, its first source line (for a model card's attention picture) and the written
    `hypotheses_file`; `report`: `evaluation_report`'s other keywords and extra fields."""
    if len(hypotheses) != len(test_set.sources):
        raise RuntimeError(f"The translate function returned {len(hypotheses)} translations for "
                           f"{len(test_set.sources)} sources.")  # fmt: skip
    if hypotheses_file is not None:
        write_lines(hypotheses, hypotheses_file)
        report["hypotheses_file"] = str(hypotheses_file)
    first = next((line.strip() for line in test_set.sources if line.strip()), None)
    return evaluation_report(
        hypotheses, test_set.references, model=model, decoding=decoding, source_file=test_set.source_file,
        reference_file=test_set.reference_file, first_source_line=first, **report,
    )  # fmt: skip


def evaluate_model(
    model_or_path,
    sources=None,
    references=None,
    *,
    tokenizer=None,
    dataset=None,
    source_lang: str = "",
    target_lang: str = "",
    translate_fn: Callable | None = None,
    decoding: dict | None = None,
    tokenize: str | None = None,
    output_json: PathLike | None = None,
    hypotheses_file: PathLike | None = None,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    quantization: str | None = None,
) -> dict[str, Any]:
    """Translate a test set and score it (see `evaluation_report` for the returned/written fields).

    model_or_path: a seq2seq model, or a folder that `AutoModelForSeq2SeqLM`/`AutoTokenizer` load (then the
        tokenizer comes from the same folder unless given).
    sources, references: files (one segment per line, UTF-8) or lists of strings, aligned line by line; or
        give `dataset`, a `datasets.Dataset` with a `translation` column, plus `source_lang`/`target_lang`.
    translate_fn: `translate_fn(model, tokenizer, lines, **decoding) -> list[str]`; default
        `vaswani_transformer.translate.translate_lines` (the model's generation config: the paper's decoding).
    hypotheses_file: where to write the translations, one per line.
    device: move the model there first (default: leave it where it is).
    dtype: load a model folder's weights in this dtype ("bfloat16", torch.bfloat16; default: as saved), with a
        warning where the device only emulates it.
    quantization: "int8", a model folder's linear layers in int8 on a CPU (`translate.quantize_linear_layers`); the
        report then has `model_quantization`.
    """
    test_set = read_test_set(sources, references, dataset=dataset, source_lang=source_lang,
                             target_lang=target_lang)  # fmt: skip
    check_report_destination(output_json)  # before translating

    remedy = "evaluate in float32 (--dtype float32)"
    if isinstance(model_or_path, (str, os.PathLike)):
        model_name = str(model_or_path)
        model, tokenizer = load_model_and_tokenizer(
            model_or_path, device=device, dtype=dtype, quantization=quantization, tokenizer=tokenizer, remedy=remedy
        )
    else:
        if dtype is not None:
            raise ValueError("`dtype` is for a model folder; convert a model object with `model.to(dtype)`.")
        if quantization is not None:
            raise ValueError("`quantization` is for a model folder; quantize a model object with "
                             "`translate.quantize_linear_layers(model)`.")  # fmt: skip
        model = model_or_path
        model_name = getattr(model, "name_or_path", None) or type(model).__name__
        if tokenizer is None:
            raise ValueError("Pass `tokenizer` when `model_or_path` is a model object.")
        if device is not None:
            model.to(device)
        model.eval()
        warn_if_emulated(model, f"The model {model_name}", remedy)

    named = {"source_name": test_set.source_file} if translate_fn is None and test_set.source_file else {}
    translate_fn = translate_fn or translate_lines
    with torch.inference_mode():  # (warnings about a source cut to the limit name its file and line)
        hypotheses = list(translate_fn(model, tokenizer, test_set.sources, **{**named, **(decoding or {})}))
    extra = {"engine": "transformers", "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    if (quantized := quantization_of(model)) is not None:
        extra["model_quantization"] = quantized
    return report_translations(
        hypotheses, test_set, model=model_name, decoding=decoding_settings(translate_fn, decoding, model),
        source_lang=source_lang, target_lang=target_lang, tokenize=tokenize, output_json=output_json,
        hypotheses_file=hypotheses_file, **extra,
    )  # fmt: skip


def choose_length_penalty(score: Callable[[float], float], values: Sequence[float]) -> dict[str, Any]:
    """The paper's choice of the length penalty on the development set ("beam size 4 and length penalty alpha = 0.6
    ... chosen after experimentation on the development set"): `score(alpha)` (validation sacreBLEU of the model
    decoded with that alpha) for each of `values`; the best wins, the first listed on a tie.

    Returns ``{"chosen": alpha, "validation_bleu": {alpha: score, ...}}``.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("choose_length_penalty needs at least one length penalty to try.")
    scores: dict[float, float] = {}
    for value in dict.fromkeys(values):  # each value decoded once
        scores[value] = float(score(value))
    return {"chosen": max(scores, key=scores.__getitem__), "validation_bleu": scores}


# ------------------------------------------------------------------------------------------------ command line

CLI_DESCRIPTION = """Translate a test set and report sacreBLEU (with signature), chrF and the paper's tokenized BLEU as JSON.

    %(prog)s --model_name_or_path runs/base/averaged \\
        --test_file ../shared/data/multi30k/test_2016_flickr --source_lang en --target_lang de \\
        --output_json runs/base/averaged/eval_test.json --hypotheses_file runs/base/averaged/test.hyp.de

    # Score existing translations without a model:
    %(prog)s --hypotheses test.hyp.de --reference test.de --target_lang de --output_json r.json

Decoding defaults are the model's generation config (the paper's: beam 4, length penalty 0.6, at most input
length + 50 tokens); --num_beams, --length_penalty, --max_len_a, --max_len_b and --decoding KEY=VALUE override them.
Options are spelled as transformers' run_translation.py spells them; the first spelling shown is the canonical one,
the others (dashes, --test-prefix, --model) are accepted aliases. The JSON fields are described in
`vaswani_transformer.evaluation.evaluation_report`; how the tokenized BLEU relates to the paper's `get_ende_bleu.sh`
is documented in `vaswani_transformer/metrics/paper_bleu/paper_bleu.py`.
"""


def _decoding_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.ArgumentParser(
        description=CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model_name_or_path", "--model", help="Model folder (with its tokenizer) to translate with.")
    what.add_argument("--hypotheses", help="Score this file of translations instead of translating.")
    parser.add_argument("--engine", choices=("transformers", "ctranslate2"),
                        help="With --model_name_or_path: transformers (our generate; the default) or ctranslate2 (a "
                        "folder written by vaswani-export-ctranslate2; beam search with transformers' length "
                        "penalty; --device default cpu).")  # fmt: skip
    parser.add_argument("--source", help="Source file, one segment per line.")
    parser.add_argument("--reference", help="Reference file, aligned with --source line by line.")
    parser.add_argument("--test_file", "--test-prefix", "--test_prefix",
                        help="PREFIX for PREFIX.<source_lang> + PREFIX.<target_lang>.")  # fmt: skip
    parser.add_argument("--source_lang", "--source-lang", default="", help="Source language code (e.g. en).")
    parser.add_argument("--target_lang", "--target-lang", default="", help="Target language code (e.g. de).")
    parser.add_argument("--output_json", "--output-json", help="Where to write the results JSON.")
    parser.add_argument("--hypotheses_file", "--hypotheses-file", help="Where to write the translations.")
    parser.add_argument("--tokenize", help="sacreBLEU tokenizer (default: sacreBLEU's choice for --target_lang).")
    add_decoding_arguments(parser)
    parser.add_argument(
        "--decoding", action="append", default=[], metavar="KEY=VALUE",
        help="Extra keyword for the translate function (VALUE parsed as JSON when possible); repeatable.",
    )  # fmt: skip
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available, else cpu).")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="Weights dtype (default: as saved).")
    add_quantization_argument(parser)
    add_memory_argument(parser)
    args = parser.parse_args(argv)

    if args.test_file:
        if args.source or args.reference:
            parser.error("give --test_file or --source/--reference, not both.")
        if not (args.source_lang and args.target_lang):
            parser.error("--test_file needs --source_lang and --target_lang.")
        pair = resolve_text_pair(args.test_file, args.source_lang, args.target_lang)
        if pair is None:
            parser.error(
                f"--test_file: {args.test_file}.{args.source_lang} and {args.test_file}.{args.target_lang} "
                "do not both exist."
            )
        args.source, args.reference = pair
    if args.reference is None:
        parser.error("--reference (or --test_file) is required.")
    if args.model_name_or_path and args.source is None:
        parser.error("--model_name_or_path needs --source (or --test_file).")
    for option in ("dtype", "quantization", "engine"):
        if args.hypotheses and getattr(args, option):
            parser.error(f"--{option} is for translating with --model_name_or_path, not for scoring --hypotheses.")
    if args.engine == "ctranslate2" and (problem := transformers_only_options(args)):
        parser.error(problem)
    decoding = {}
    for item in args.decoding:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--decoding expects KEY=VALUE, got {item!r}.")
        decoding[key] = _decoding_value(value)
    args.decoding = {**decoding, **decoding_arguments(args)}
    return args


def sacrebleu_tokenizer_problem(target_lang: str, tokenize: str | None) -> str | None:
    """Why sacreBLEU cannot score `target_lang` with `tokenize` (not one of its tokenizers, or one whose extra
    packages are missing, such as MeCab for ja and ko), or None."""
    if tokenize is not None and tokenize not in BLEU.TOKENIZERS:
        return f"--tokenize {tokenize!r} is not a sacreBLEU tokenizer (one of: {', '.join(BLEU.TOKENIZERS)})."
    if tokenize in (None, "ja-mecab", "ko-mecab"):  # (the sentencepiece ones would download their model here)
        try:
            BLEU(tokenize=tokenize, trg_lang=target_lang or "")
        except RuntimeError as error:  # sacreBLEU's message names the extra to install
            return f"sacreBLEU cannot tokenize --target_lang {target_lang!r}: {' '.join(str(error).split())}"
    return None


def other_results_problem(path: PathLike, option: str = "--output_json") -> str | None:
    """Why `option` (where a report goes) must not replace `path`, or None: a non-empty file that is not an
    evaluation report (`card.is_evaluation_report`), such as the Trainer's `eval_results.json` in a run's or an
    average's folder, whose validation score the model card reads. A report is replaced, as a new run of the same
    command does."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        held = None
    if is_evaluation_report(held):
        return None
    what = f"other results ({', '.join(list(held)[:3])})" if isinstance(held, dict) and held else "no evaluation report"
    return f"{option} {path} holds {what}, which the report would replace: choose another file."


def check_report_destination(output_json: PathLike | None) -> None:
    """Raises FileExistsError where a report must not be written to `output_json` (`other_results_problem`)."""
    if output_json is not None and (problem := other_results_problem(output_json, "output_json")):
        raise FileExistsError(problem)


def main(argv=None) -> int:
    """`vaswani-evaluate` / `scripts/evaluate_model.py`: prints the report; exit status 1 with an error line for
    bad input (checked before translating anything: an output that is an input, a scorer that cannot run)."""
    args = parse_args(argv)
    outputs = {"--output_json": args.output_json, "--hypotheses_file": args.hypotheses_file}
    inputs = {"--source": args.source, "--reference": args.reference, "--hypotheses": args.hypotheses}
    for option, path in outputs.items():
        if path is None:
            continue
        problem = cli.output_path_problem(path, option)
        for name, read in inputs.items():
            if problem is None and read is not None and is_same_file(read, path):
                problem = f"{option} {path} is the {name} file: writing it would destroy the input."
        if problem is None and option == "--output_json":
            problem = other_results_problem(path)
        if problem is None and option == "--hypotheses_file" and args.output_json is not None and \
                os.path.realpath(path) == os.path.realpath(args.output_json):  # fmt: skip
            problem = f"--hypotheses_file and --output_json are the same file ({path}): one would replace the other."
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 1
    if problem := sacrebleu_tokenizer_problem(args.target_lang, args.tokenize):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        if args.hypotheses:
            check_parallel_text_files(args.hypotheses, args.reference)  # error naming both files and counts
            hypotheses, references = read_segments(args.hypotheses, allow_empty=True), read_segments(args.reference)
            report = evaluation_report(
                hypotheses, references, source_lang=args.source_lang, target_lang=args.target_lang,
                tokenize=args.tokenize, output_json=args.output_json, hypotheses_file=args.hypotheses,
                reference_file=args.reference,
            )  # fmt: skip
        elif args.engine == "ctranslate2":
            from .ctranslate2_export import evaluate_ctranslate2  # optional dependency: ctranslate2

            report = evaluate_ctranslate2(
                args.model_name_or_path, args.source, args.reference, source_lang=args.source_lang,
                target_lang=args.target_lang, decoding=args.decoding, tokenize=args.tokenize,
                output_json=args.output_json, hypotheses_file=args.hypotheses_file, device=args.device,
            )  # fmt: skip
        else:
            # int8 (PyTorch's dynamic quantization) runs on a CPU: no GPU by default then
            device = args.device or ("cuda" if torch.cuda.is_available() and not args.quantization else "cpu")
            keep_freed_memory_on_cpu(args.keep_freed_cpu_memory, device)
            report = evaluate_model(
                args.model_name_or_path, args.source, args.reference, source_lang=args.source_lang,
                target_lang=args.target_lang, decoding=args.decoding, tokenize=args.tokenize,
                output_json=args.output_json, hypotheses_file=args.hypotheses_file, device=device, dtype=args.dtype,
                quantization=args.quantization,
            )  # fmt: skip
    except (ValueError, FileNotFoundError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


__all__ = [
    "EvaluationSet",
    "choose_length_penalty",
    "compute_translation_metrics",
    "decoding_settings",
    "evaluate_model",
    "evaluation_report",
    "load_paper_bleu",
    "main",
    "make_compute_metrics",
    "moses_tokenize",
    "multi_bleu",
    "paper_bleu_path",
    "read_segments",
    "read_test_set",
    "report_translations",
    "split_compounds",
    "tokenized_bleu",
]


if __name__ == "__main__":  # python -m vaswani_transformer.evaluation, as the console script
    sys.exit(main())
