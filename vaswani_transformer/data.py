"""Parallel data for translation: loading, tokenisation with reported filters, token-based batching, collation.

Pipeline (each step usable alone)::

    raw = load_parallel_dataset(train_file="data/train", validation_file="data/val", source_lang="en", target_lang="de")
    tokenized, report = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_source_tokens=256,
                                                  max_target_tokens=256, max_length_ratio=9, num_proc=2)
    print(report)                                       # how many pairs each rule dropped, per split
    sampler = TokenBatchSampler.from_dataset(tokenized["train"], max_tokens=4096, num_replicas=world, rank=rank)
    loader = DataLoader(tokenized["train"], batch_sampler=sampler, collate_fn=TranslationDataCollator(tokenizer))
    # in training, VaswaniSeq2SeqTrainer(..., max_tokens_per_batch=4096) builds the sampler and loader itself

Every dataset is in the ``{"translation": {"en": ..., "de": ...}}`` form of transformers' translation examples.
Tokenised datasets gain ``input_ids`` and ``labels`` (each ending with ``</s>``) and ``source_length`` /
``target_length`` (their lengths, ``</s>`` included), which the sampler uses.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Sampler
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerBase

from .textio import TextFileError, count_lines, decode_line, unique_keys

if TYPE_CHECKING:  # imported where used: `datasets` (with pandas, pyarrow) adds ~0.5 s to vaswani-translate's start
    from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

logger = logging.getLogger(__name__)

SOURCE_LENGTH_COLUMN = "source_length"
TARGET_LENGTH_COLUMN = "target_length"
_DROP_COLUMN = "_drop_reason"
# Filter rules in the order they are applied; a pair is counted under the first rule it breaks.
FILTER_RULES = ("empty_source", "empty_target", "source_too_long", "target_too_long", "length_ratio")


class ParallelDataError(ValueError):
    """Bad parallel input; the message names the file (and line) at fault."""


# --------------------------------------------------------------------------------------------------- reading


def _decode(raw: bytes, path: str, line_number: int) -> str:
    """`textio.decode_line`, its error raised as a ParallelDataError."""
    try:
        return decode_line(raw, path, line_number)
    except TextFileError as error:
        raise ParallelDataError(str(error)) from None


def resolve_text_pair(path: str, source_lang: str, target_lang: str) -> tuple[str, str] | None:
    """``path/train`` (or ``path/train.en``) -> (``path/train.en``, ``path/train.de``) if both exist, else None."""
    for prefix in (path, path[: -len(source_lang) - 1] if path.endswith("." + source_lang) else None):
        if prefix is None:
            continue
        pair = (f"{prefix}.{source_lang}", f"{prefix}.{target_lang}")
        if all(os.path.isfile(p) for p in pair):
            return pair
    return None


def _check_text_pair_files(path: str, source_lang: str, target_lang: str) -> None:
    """``FileNotFoundError`` naming the missing or directory side of a half-present ``prefix.{src,tgt}`` pair, or
    ``path`` itself when it is a directory."""
    for prefix in (path, path[: -len(source_lang) - 1] if path.endswith("." + source_lang) else None):
        if prefix is None:
            continue
        sides = {lang: f"{prefix}.{lang}" for lang in (source_lang, target_lang)}
        if not any(os.path.exists(p) for p in sides.values()):
            continue
        for lang, side in sides.items():
            if os.path.isdir(side):
                raise FileNotFoundError(f"{side} is a directory, not the {lang} text file of the pair {prefix}.")
            if not os.path.isfile(side):
                raise FileNotFoundError(f"{side}: no such file (the {lang} side of the parallel text {prefix}).")
    if os.path.isdir(path):
        raise FileNotFoundError(
            f"{path} is a directory: give the prefix of its files ({os.path.join(path, 'train')} for "
            f"train.{source_lang} and train.{target_lang}) or a .jsonl/.json/.tsv file."
        )


def _file_format(path: str, source_lang: str, target_lang: str) -> str:
    lower = path.lower()
    if lower.endswith((".jsonl", ".json")):
        return "jsonl"
    if lower.endswith(".tsv"):
        return "tsv"
    if resolve_text_pair(path, source_lang, target_lang) is not None:
        return "text"
    _check_text_pair_files(path, source_lang, target_lang)
    raise ParallelDataError(
        f"Cannot read {path!r}: expected a .jsonl/.json or .tsv file, or a prefix with "
        f"{path}.{source_lang} and {path}.{target_lang} side by side."
    )


def check_parallel_text_files(source_path: str, target_path: str) -> int:
    """Number of aligned lines; ``ParallelDataError`` naming both files and counts if they differ."""
    n_source, n_target = count_lines(source_path), count_lines(target_path)
    if n_source != n_target:
        raise ParallelDataError(
            f"Parallel files have different line counts: {source_path} has {n_source} lines, "
            f"{target_path} has {n_target} lines."
        )
    return n_source


def _pair(source_lang: str, target_lang: str, source: str, target: str) -> dict[str, dict[str, str]]:
    return {"translation": {source_lang: source, target_lang: target}}


def _is_tsv_header(fields: list[str], source_lang: str, target_lang: str) -> bool:
    """A TSV file's first line naming its two columns (the languages, in either order)."""
    return len(fields) == 2 and set(fields) == {source_lang, target_lang}


def _check_tsv_first_line(fields: list[str], source_lang: str, target_lang: str, path: str) -> None:
    """A ParallelDataError for a first line that is a header of other columns (one of the languages and another, or
    source/target): read as a pair, it would train on the header and on a column of another language."""
    if len(fields) != 2 or _is_tsv_header(fields, source_lang, target_lang):
        return
    named = [field.strip().lower() for field in fields]  # ("EN", "de " name the languages too: not a pair)
    if {source_lang.lower(), target_lang.lower()} & set(named) or named in (["source", "target"], ["src", "tgt"]):
        raise ParallelDataError(
            f"{path}:1: the first line ({fields[0]!r}, {fields[1]!r}) looks like a header, but a header names the two "
            f"languages, {source_lang} and {target_lang} (in either order), so that the columns can be told apart. "
            "Fix the header (or the --source_lang/--target_lang), or remove the line."
        )


def first_pair_line(path: str, source_lang: str, target_lang: str) -> int:
    """The line of a data file (or of both files of a text pair) that holds its first pair: 2 for a TSV file opened by
    a header line, else 1. Pair *i* of the loaded split (0-based) is on line ``i + first_pair_line(...)``."""
    path = os.fspath(path)
    if _file_format(path, source_lang, target_lang) != "tsv":
        return 1
    with open(path, "rb") as f:
        first = _decode(f.readline(), path, 1)
    return 2 if _is_tsv_header(first.split("\t"), source_lang, target_lang) else 1


def _generate_pairs(spec: str) -> Iterator[dict[str, dict[str, str]]]:
    """Generator behind ``Dataset.from_generator``. ``spec`` is JSON (no list kwargs: datasets would shard them)."""
    args = json.loads(spec)
    fmt, path, src, tgt = args["format"], args["path"], args["source_lang"], args["target_lang"]
    if fmt == "text":
        source_path, target_path = resolve_text_pair(path, src, tgt)
        with open(source_path, "rb") as fs, open(target_path, "rb") as ft:
            for n, (raw_s, raw_t) in enumerate(zip(fs, ft), start=1):
                yield _pair(src, tgt, _decode(raw_s, source_path, n), _decode(raw_t, target_path, n))
    elif fmt == "tsv":
        order = (src, tgt)
        with open(path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                line = _decode(raw, path, n)
                fields = line.split("\t")
                if n == 1 and _is_tsv_header(fields, src, tgt):
                    order = tuple(fields)  # header line naming the columns
                    continue
                if n == 1:
                    _check_tsv_first_line(fields, src, tgt, path)
                if line == "":
                    yield _pair(src, tgt, "", "")
                    continue
                if len(fields) != 2:
                    raise ParallelDataError(
                        f"{path}:{n}: expected 2 tab-separated columns ({order[0]}, {order[1]}), found {len(fields)}."
                    )
                row = dict(zip(order, fields))
                yield _pair(src, tgt, row[src], row[tgt])
    elif fmt == "jsonl":
        with open(path, "rb") as f:
            for n, raw in enumerate(f, start=1):
                line = _decode(raw, path, n)
                if not line.strip():
                    yield _pair(src, tgt, "", "")  # counted as empty by the filter, not silently skipped
                    continue
                try:
                    record = json.loads(line, object_pairs_hook=unique_keys)
                except json.JSONDecodeError as err:
                    raise ParallelDataError(f"{path}:{n}: invalid JSON ({err.msg}).") from None
                except ValueError as err:  # a key twice
                    raise ParallelDataError(f"{path}:{n}: {err}") from None
                translation = record.get("translation") if isinstance(record, dict) else None
                if not isinstance(translation, dict):
                    raise ParallelDataError(f'{path}:{n}: expected an object with a "translation" object.')
                for lang in (src, tgt):
                    if lang not in translation:
                        raise ParallelDataError(
                            f'{path}:{n}: "translation" has no {lang!r} key (keys: {sorted(translation)}).'
                        )
                    if not isinstance(translation[lang], str):
                        raise ParallelDataError(f'{path}:{n}: "translation"[{lang!r}] is not a string.')
                    try:  # JSON's \ud800 escapes decode to lone surrogates, which no text holds (Arrow fails later)
                        translation[lang].encode("utf-8")
                    except UnicodeEncodeError as err:
                        raise ParallelDataError(
                            f'{path}:{n}: "translation"[{lang!r}] holds a lone surrogate ({err.object[err.start]!r} '
                            f"at character {err.start}), an escape that is half of a character: not text."
                        ) from None
                yield _pair(src, tgt, translation[src], translation[tgt])
    else:  # pragma: no cover - formats are validated before
        raise ValueError(fmt)


def _file_signature(path: str) -> list[int]:
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns]


def _load_file(
    path: str, source_lang: str, target_lang: str, split: str, streaming: bool, cache_dir: str | None
) -> Dataset | IterableDataset:
    path = os.fspath(path)
    fmt = _file_format(path, source_lang, target_lang)
    if fmt == "text":
        files = resolve_text_pair(path, source_lang, target_lang)
        if check_parallel_text_files(*files) == 0:
            raise ParallelDataError(f"{files[0]} and {files[1]} hold no pairs: both files are empty.")
    else:
        if os.path.isdir(path):
            raise FileNotFoundError(f"Data file {path} is a directory, not a {fmt} file.")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Data file not found: {path}")
        files = (path,)
        first = first_pair_line(path, source_lang, target_lang)
        with open(path, "rb") as f:
            if not [f.readline() for _ in range(first)][-1]:  # (datasets' own error: 'corresponds to no data')
                what = "only a header line" if first > 1 else "it is empty"
                raise ParallelDataError(f"{path} holds no pairs: {what}.")
    spec = json.dumps(
        {
            "format": fmt,
            "path": os.path.abspath(path),
            "source_lang": source_lang,
            "target_lang": target_lang,
            # the cache key must change when a file changes
            "signature": [_file_signature(p) for p in files],
        }
    )
    from datasets import Dataset, Features, IterableDataset, Translation
    from datasets.exceptions import DatasetGenerationError

    features = Features({"translation": Translation(languages=[source_lang, target_lang])})
    if streaming:
        return IterableDataset.from_generator(_generate_pairs, features=features, gen_kwargs={"spec": spec})
    try:
        return Dataset.from_generator(
            _generate_pairs, features=features, gen_kwargs={"spec": spec}, cache_dir=cache_dir, split=split
        )
    except DatasetGenerationError as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, ParallelDataError):
            cause = cause.__cause__
        if cause is not None:
            raise ParallelDataError(str(cause)) from None
        raise


def _to_translation_form(ds: Dataset | IterableDataset, source_lang: str, target_lang: str, where: str):
    if ds.features is not None:
        columns = list(ds.features)
        feature = ds.features.get("translation")
        languages = list(getattr(feature, "languages", None) or (feature.keys() if isinstance(feature, dict) else []))
    else:  # a streamed dataset whose features are unknown until read: look at the first example
        first = next(iter(ds), None) or {}
        columns = list(first)
        languages = list(first["translation"]) if isinstance(first.get("translation"), dict) else []
    if "translation" in columns:
        missing = [lang for lang in (source_lang, target_lang) if lang not in languages]
        if missing:
            raise ParallelDataError(f"{where}: 'translation' has no {missing} (languages: {languages}).")
        return ds
    if source_lang in columns and target_lang in columns:
        return ds.map(
            lambda ex: _pair(source_lang, target_lang, ex[source_lang], ex[target_lang]),
            remove_columns=columns,
        )
    raise ParallelDataError(
        f"{where}: expected a 'translation' column or columns {source_lang!r} and {target_lang!r}; found {columns}."
    )


def load_parallel_dataset(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    source_lang: str = "en",
    target_lang: str = "de",
    streaming: bool = False,
    cache_dir: str | None = None,
) -> DatasetDict | IterableDatasetDict:
    """Load parallel data as a ``DatasetDict`` of ``{"translation": {source_lang: ..., target_lang: ...}}``.

    Sources (names as in transformers' ``run_translation.py``):

    * ``dataset_name`` (+ ``dataset_config_name``): a Hub dataset (e.g. ``"wmt14"``, ``"de-en"``) or a local
      folder written by ``save_to_disk``. Datasets with plain ``source_lang``/``target_lang`` columns are
      converted to the translation form.
    * ``train_file`` / ``validation_file`` / ``test_file``, each one of:
        - a prefix of side-by-side plain text files: ``data/train`` -> ``data/train.en`` + ``data/train.de``
          (``data/train.en`` itself is accepted too); line *i* of one is the translation of line *i* of the other;
        - ``.tsv``: ``source<TAB>target`` per line; a first line naming the two languages is a header that
          sets the column order;
        - ``.jsonl``/``.json`` (JSON lines): ``{"translation": {"en": ..., "de": ...}}`` per line.

    Nothing is dropped here: empty lines become pairs with empty sides, which
    :func:`tokenize_parallel_dataset` drops and counts. Errors (:class:`ParallelDataError`) name the file and,
    where it applies, the line: different line counts, invalid UTF-8, wrong column count, missing language key.
    ``streaming=True`` returns an ``IterableDatasetDict`` that reads lazily (for corpora larger than memory);
    otherwise pairs are written once to the datasets cache (keyed by file size and modification time).
    """
    import datasets
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    if dataset_name is None and not (train_file or validation_file or test_file):
        raise ValueError("Need `dataset_name` or at least one of `train_file`, `validation_file`, `test_file`.")
    files = [name for name, path in (("train_file", train_file), ("validation_file", validation_file),
                                     ("test_file", test_file)) if path]  # fmt: skip
    if dataset_name is not None and files:
        raise ValueError(
            f"Both dataset_name ({dataset_name}) and {', '.join(files)} given: the dataset gives every split, so the "
            "files would be ignored. Give one or the other (a split of your own: save the dataset with it, or convert "
            "the dataset's splits to files)."
        )
    if source_lang == target_lang:
        raise ValueError(f"source_lang and target_lang are both {source_lang!r}.")
    if dataset_name is not None:
        if os.path.isdir(dataset_name) and any(
            os.path.isfile(os.path.join(dataset_name, f)) for f in ("dataset_dict.json", "state.json")
        ):
            if dataset_config_name is not None:
                raise ValueError(
                    f"dataset_config_name ({dataset_config_name}) names a configuration of a Hub dataset; "
                    f"{dataset_name} is a folder written by save_to_disk, which has none."
                )
            loaded = datasets.load_from_disk(dataset_name)
            if isinstance(loaded, Dataset):
                loaded = DatasetDict({"train": loaded})
            if streaming:
                loaded = IterableDatasetDict({k: v.to_iterable_dataset() for k, v in loaded.items()})
        else:
            loaded = datasets.load_dataset(
                dataset_name, dataset_config_name, cache_dir=cache_dir, streaming=streaming
            )
        result = {
            split: _to_translation_form(ds, source_lang, target_lang, f"{dataset_name}[{split}]")
            for split, ds in loaded.items()
        }
    else:
        result = {}
        for split, path in (("train", train_file), ("validation", validation_file), ("test", test_file)):
            if path is not None:
                result[split] = _load_file(os.fspath(path), source_lang, target_lang, split, streaming, cache_dir)
    return IterableDatasetDict(result) if streaming else DatasetDict(result)


def iter_parallel_texts(
    dataset: DatasetDict | IterableDatasetDict | Dataset | IterableDataset,
    source_lang: str,
    target_lang: str,
    split: str = "train",
) -> Iterator[str]:
    """Yield source then target text of every pair (lazily; for tokenizer training on a loaded dataset)."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    if isinstance(dataset, (DatasetDict, IterableDatasetDict)):
        dataset = dataset[split]
    if isinstance(dataset, Dataset):
        for batch in dataset.iter(batch_size=1000):
            for pair in batch["translation"]:
                yield pair[source_lang]
                yield pair[target_lang]
    else:
        for example in dataset:
            yield example["translation"][source_lang]
            yield example["translation"][target_lang]


# ---------------------------------------------------------------------------------------- tokenise + filter


@dataclass
class FilterReport:
    """How many pairs each filter rule dropped, per split (a pair counts under the first rule it breaks).

    ``str(report)`` is a table; ``report.to_dict()`` is for loggers. For streaming datasets the counts fill in
    as the data is iterated (``streaming=True``), and start again with each pass over it.
    """

    rules: dict[str, Any] = field(default_factory=dict)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    streaming: bool = False

    def total(self, split: str) -> int:
        return self.splits[split]["total"]

    def kept(self, split: str) -> int:
        return self.splits[split]["kept"]

    def dropped(self, split: str, rule: str | None = None) -> int:
        counts = self.splits[split]
        return counts[rule] if rule is not None else counts["total"] - counts["kept"]

    def to_dict(self) -> dict[str, Any]:
        return {"rules": dict(self.rules), "splits": {k: dict(v) for k, v in self.splits.items()}}

    def __str__(self) -> str:
        rules = ", ".join(f"{k}={v}" for k, v in self.rules.items() if v is not None) or "empty sides only"
        header = ["split", "total", "kept", *FILTER_RULES]
        rows = [[s, *(str(c[h]) for h in header[1:])] for s, c in self.splits.items()]
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        lines = [f"Filter report ({rules}){' [streaming: counts so far]' if self.streaming else ''}"]
        lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
        return "\n".join(lines)


def _drop_reasons(
    sources: Sequence[str],
    targets: Sequence[str],
    source_lengths: np.ndarray,
    target_lengths: np.ndarray,
    max_source_tokens: int | None,
    max_target_tokens: int | None,
    max_length_ratio: float | None,
) -> np.ndarray:
    """0 = keep, else 1 + index into FILTER_RULES of the first rule broken."""
    content_s, content_t = np.maximum(source_lengths - 1, 1), np.maximum(target_lengths - 1, 1)
    broken = [
        np.array([not s.strip() for s in sources], dtype=bool),
        np.array([not t.strip() for t in targets], dtype=bool),
        source_lengths > max_source_tokens if max_source_tokens is not None else np.zeros(len(sources), bool),
        target_lengths > max_target_tokens if max_target_tokens is not None else np.zeros(len(sources), bool),
        (np.maximum(content_s, content_t) / np.minimum(content_s, content_t) > max_length_ratio)
        if max_length_ratio is not None
        else np.zeros(len(sources), bool),
    ]
    reasons = np.zeros(len(sources), dtype=np.int8)
    for code in range(len(FILTER_RULES), 0, -1):  # reverse so that the first broken rule wins
        reasons[broken[code - 1]] = code
    return reasons


def numpy_columns(dataset: Dataset, names: list[str]) -> dict[str, np.ndarray]:
    """Whole columns of ``dataset`` as numpy arrays, in the dataset's row order, read as one slice.

    Indexing a column by name (``dataset[name]``) converts row by row (~1 s per 29k rows, minutes for WMT14), and
    the Arrow table alone (``dataset.data``) ignores an indices mapping (after ``select`` or ``shuffle``).
    """
    return dataset.select_columns(names).with_format("numpy")[:]


def tokenize_parallel_dataset(
    dataset: DatasetDict | IterableDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    source_lang: str,
    target_lang: str,
    *,
    max_source_tokens: int | None = None,
    max_target_tokens: int | None = None,
    max_length_ratio: float | None = None,
    num_proc: int | None = None,
    batch_size: int = 1000,
    keep_text: bool = False,
    load_from_cache_file: bool = True,
    filter_splits: Collection[str] | None = None,
) -> tuple[DatasetDict | IterableDatasetDict, FilterReport]:
    """Tokenise both sides (``datasets.map(batched=True, num_proc=...)``, cached) and apply the filters.

    Adds ``input_ids``, ``labels`` (each ending with ``</s>``, no truncation) and ``source_length`` /
    ``target_length`` (token counts including ``</s>``). Rules, in order (first broken rule is counted):

    ``empty_source`` / ``empty_target``: the text is empty or whitespace only;
    ``source_too_long`` / ``target_too_long``: more than ``max_source_tokens`` / ``max_target_tokens`` tokens
    (``</s>`` included; set them to the batch ``max_tokens`` so that no pair is too long to batch);
    ``length_ratio``: longer / shorter side > ``max_length_ratio``, counted without ``</s>``.

    ``filter_splits``: the splits the rules apply to (None: all). Training passes ``("train",)``: evaluation sets
    are scored whole, every pair kept (reported with ``kept == total``).

    Returns the filtered dataset and a :class:`FilterReport`; the counts are also logged at INFO level.
    """
    from datasets import DatasetDict, IterableDatasetDict

    if tokenizer.eos_token_id is None:
        raise ValueError("The tokenizer has no eos token; every encoded sequence must end with one.")
    rules = {
        "max_source_tokens": max_source_tokens,
        "max_target_tokens": max_target_tokens,
        "max_length_ratio": max_length_ratio,
    }
    streaming = isinstance(dataset, IterableDatasetDict)
    report = FilterReport(rules=rules, streaming=streaming)

    def encode(batch: dict[str, list], rows: list[int], split: str) -> dict[str, Any]:
        sources = [pair[source_lang] for pair in batch["translation"]]
        targets = [pair[target_lang] for pair in batch["translation"]]
        for lang, texts in ((source_lang, sources), (target_lang, targets)):
            for row, text in zip(rows, texts):
                if not isinstance(text, str):  # e.g. None in a Hub or save_to_disk dataset
                    raise ParallelDataError(f"{split} split, row {row}: the {lang!r} text is {text!r}, not a string.")
        encoded = tokenizer(sources, text_target=targets, add_special_tokens=True, truncation=False)
        source_lengths = np.fromiter((len(x) for x in encoded["input_ids"]), dtype=np.int64, count=len(sources))
        target_lengths = np.fromiter((len(x) for x in encoded["labels"]), dtype=np.int64, count=len(sources))
        return {
            "input_ids": encoded["input_ids"],
            "labels": encoded["labels"],
            SOURCE_LENGTH_COLUMN: source_lengths,
            TARGET_LENGTH_COLUMN: target_lengths,
            _DROP_COLUMN: _drop_reasons(
                sources, targets, source_lengths, target_lengths, max_source_tokens, max_target_tokens, max_length_ratio
            ),
        }

    out = {}
    for split, ds in dataset.items():
        remove = [] if keep_text else ["translation"]
        filtered = filter_splits is None or split in filter_splits
        if streaming:
            counts = report.splits.setdefault(split, {"total": 0, "kept": 0, **{r: 0 for r in FILTER_RULES}})

            def keep(reasons: list[int], rows: list[int], counts=counts, filtered: bool = filtered) -> list[bool]:
                if rows and rows[0] == 0:  # a new pass over the stream: the counts are of this pass
                    counts.update({k: 0 for k in counts})
                for r in reasons:
                    counts["total"] += 1
                    counts["kept" if r == 0 or not filtered else FILTER_RULES[r - 1]] += 1
                return [r == 0 or not filtered for r in reasons]

            mapped = ds.map(encode, batched=True, batch_size=batch_size, remove_columns=remove, with_indices=True,
                            fn_kwargs={"split": split})  # fmt: skip
            out[split] = mapped.filter(keep, input_columns=_DROP_COLUMN, batched=True, with_indices=True).remove_columns(
                _DROP_COLUMN
            )
            continue
        mapped = ds.map(
            encode,
            batched=True,
            batch_size=batch_size,
            with_indices=True,
            fn_kwargs={"split": split},
            num_proc=num_proc,
            remove_columns=remove,
            load_from_cache_file=load_from_cache_file,
            desc=f"Tokenizing {split}",
        )
        reasons = np.asarray(numpy_columns(mapped, [_DROP_COLUMN])[_DROP_COLUMN], dtype=np.int64)
        if not filtered:
            reasons = np.zeros_like(reasons)  # an evaluation set: every pair kept
        histogram = np.bincount(reasons, minlength=len(FILTER_RULES) + 1)
        report.splits[split] = {
            "total": len(reasons),
            "kept": int(histogram[0]),
            **{rule: int(histogram[i + 1]) for i, rule in enumerate(FILTER_RULES)},
        }
        if histogram[0] < len(reasons):
            mapped = mapped.filter(
                lambda r: [x == 0 for x in r],
                input_columns=_DROP_COLUMN,
                batched=True,
                batch_size=batch_size,
                num_proc=num_proc,
                load_from_cache_file=load_from_cache_file,
                desc=f"Filtering {split}",
            )
        out[split] = mapped.remove_columns(_DROP_COLUMN)
    if not streaming:
        logger.info("%s", report)
    return (IterableDatasetDict(out) if streaming else DatasetDict(out)), report


# ------------------------------------------------------------------------------------------------ batching


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of pairs of similar length holding at most ``max_tokens`` tokens on *each* side, padding included.

    Pairs are sorted by the length of their longer side, then by ``target - source`` length (ascending for even,
    descending for odd lengths: a "snake" order, so that neighbouring groups meet with similar shapes), then by
    a ``seed``-ed permutation, and packed greedily while ``batch_size * longest <= max_tokens`` holds on both
    sides (and ``batch_size <= max_sentences`` if given). This pads less than sorting by target then source length
    (fairseq's order); ``benchmarks/batching_efficiency.py`` measures both. The batches are fixed; each epoch
    shuffles their *order* with ``(seed, epoch)``, so ``len()`` is constant and iteration is deterministic for a
    seed and epoch.

    Distributed: batch *j* of the epoch's order goes to rank ``j % num_replicas``. If the number of batches is not
    a multiple of ``num_replicas``, the batches with the most pairs are split in two (halving their tokens) until
    it is, so every rank gets the same number of batches and every kept pair appears exactly once per epoch across
    all ranks (no padding by repetition, nothing dropped). Give each rank its ``rank``, call ``set_epoch(epoch)``
    before each epoch, and use it as a DataLoader ``batch_sampler``.

    Pairs longer than ``max_tokens`` on either side cannot be batched: they are excluded, listed in
    ``oversized_indices`` and reported with a warning (filter them first with ``tokenize_parallel_dataset(...,
    max_source_tokens=max_tokens, max_target_tokens=max_tokens)`` to count them in the filter report).

    Training: ``VaswaniSeq2SeqTrainer(..., max_tokens_per_batch=N)`` builds it in its ``get_train_dataloader`` from
    the tokenised dataset's length columns with ``num_replicas=args.world_size``, ``rank=args.process_index`` and
    ``seed=args.data_seed`` (else ``args.seed``; ``shuffle=False`` for ``train_sampling_strategy="sequential"``),
    uses it as the DataLoader's ``batch_sampler`` and keeps accelerate from sharding its batches
    again; the Trainer calls ``set_epoch`` on it every epoch.
    """

    def __init__(
        self,
        source_lengths: Sequence[int] | np.ndarray,
        target_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        max_sentences: int | None = None,
    ) -> None:
        src = np.asarray(source_lengths, dtype=np.int64).reshape(-1)
        tgt = np.asarray(target_lengths, dtype=np.int64).reshape(-1)
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source lengths but {len(tgt)} target lengths.")
        if len(src) and (src.min() < 1 or tgt.min() < 1):
            raise ValueError("Every length must be >= 1 (sequences end with </s>).")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be positive, got {max_sentences}.")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"Need 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}.")
        self.max_tokens, self.max_sentences = int(max_tokens), max_sentences
        self.num_replicas, self.rank, self.seed, self.shuffle = num_replicas, rank, seed, shuffle
        self.epoch = 0
        self.source_lengths, self.target_lengths = src, tgt

        oversized = (src > max_tokens) | (tgt > max_tokens)
        self.oversized_indices: list[int] = np.flatnonzero(oversized).tolist()
        if self.oversized_indices:
            logger.warning(
                "TokenBatchSampler: %d pair(s) longer than max_tokens=%d excluded (first indices: %s).",
                len(self.oversized_indices), max_tokens, self.oversized_indices[:10],
            )
        kept = np.flatnonzero(~oversized)
        tiebreak = np.random.default_rng(seed).permutation(len(kept))
        longest, difference = np.maximum(src[kept], tgt[kept]), tgt[kept] - src[kept]
        snake = np.where(longest % 2 == 0, difference, -difference)
        order = kept[np.lexsort((tiebreak, snake, longest))]
        self.batches = self._split_for_replicas(self._pack(order, src, tgt))

    def _pack(self, order: np.ndarray, src: np.ndarray, tgt: np.ndarray) -> list[list[int]]:
        batches, current, max_s, max_t = [], [], 0, 0
        cap = self.max_sentences or math.inf
        for i, s, t in zip(order.tolist(), src[order].tolist(), tgt[order].tolist()):
            new_s, new_t, n = max(max_s, s), max(max_t, t), len(current) + 1
            if current and (n * new_s > self.max_tokens or n * new_t > self.max_tokens or n > cap):
                batches.append(current)
                current, new_s, new_t = [], s, t
            current.append(i)
            max_s, max_t = new_s, new_t
        if current:
            batches.append(current)
        return batches

    def _split_for_replicas(self, batches: list[list[int]]) -> list[list[int]]:
        r = self.num_replicas
        if not batches or len(batches) % r == 0:
            if not batches:
                logger.warning("TokenBatchSampler: no pairs to batch.")
            return batches
        # Splitting a batch in two adds one batch; a batch of one pair cannot be split (no empty batches).
        n_pairs, needed = sum(len(b) for b in batches), -(-len(batches) // r) * r
        if n_pairs < needed:
            raise ValueError(
                f"Cannot give {r} ranks the same number of batches: {len(batches)} batch(es) of max_tokens="
                f"{self.max_tokens} would need {needed}, but there are only {n_pairs} pair(s) to split them into. "
                f"Use a number of processes that divides {len(batches)}, a larger max_tokens, or more data."
            )
        batches = list(batches)
        while len(batches) % r:
            j = max(range(len(batches)), key=lambda k: (len(batches[k]), -k))
            big = batches.pop(j)
            half = len(big) // 2
            batches[j:j] = [big[:half], big[half:]]
        return batches

    @classmethod
    def from_dataset(
        cls,
        dataset: Dataset,
        max_tokens: int,
        *,
        source_length_column: str = SOURCE_LENGTH_COLUMN,
        target_length_column: str = TARGET_LENGTH_COLUMN,
        **kwargs: Any,
    ) -> TokenBatchSampler:
        """Build from a tokenised dataset's length columns (or from ``input_ids``/``labels`` if absent)."""
        columns = dataset.column_names
        if source_length_column in columns and target_length_column in columns:
            table = numpy_columns(dataset, [source_length_column, target_length_column])
            src, tgt = table[source_length_column], table[target_length_column]
        elif "input_ids" in columns and "labels" in columns:
            src = [len(x) for x in dataset["input_ids"]]
            tgt = [len(x) for x in dataset["labels"]]
        else:
            raise ValueError(
                f"Dataset needs {source_length_column!r}/{target_length_column!r} or 'input_ids'/'labels' columns; "
                f"has {columns}."
            )
        return cls(np.asarray(src), np.asarray(tgt), max_tokens, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.batches) // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.batches))
        else:
            order = np.arange(len(self.batches))
        for j in order[self.rank :: self.num_replicas].tolist():
            yield list(self.batches[j])

    def padded_tokens(self, batch: Sequence[int]) -> tuple[int, int]:
        """(source, target) tokens of a batch counted with padding."""
        idx = np.asarray(batch)
        return len(idx) * int(self.source_lengths[idx].max()), len(idx) * int(self.target_lengths[idx].max())


# ----------------------------------------------------------------------------------------------- collation


@dataclass
class TranslationDataCollator:
    """Pad a list of tokenised pairs into ``input_ids``, ``attention_mask`` and ``labels``.

    Padding is done by transformers' ``DataCollatorForSeq2Seq`` (right side; ``input_ids`` with the pad id 0,
    ``labels`` with -100, which the loss ignores). The decoder inputs are the model's to make from the labels
    (``prepare_decoder_input_ids_from_labels``: shifted right behind ``<s>``), as ``VaswaniSeq2SeqTrainer``'s loss
    and ``forward`` do. Given ``model`` (as ``DataCollatorForSeq2Seq(tokenizer, model=model)``), the batch also holds
    that function's ``decoder_input_ids``: transformers' own ``Seq2SeqTrainer`` with label smoothing keeps the labels
    from the model and needs them. Other columns (``source_length``, text) are ignored.
    """

    tokenizer: PreTrainedTokenizerBase
    pad_to_multiple_of: int | None = None
    model: Any = None

    def __post_init__(self) -> None:
        if self.tokenizer.pad_token_id is None:
            raise ValueError("The collator needs a tokenizer with a pad token.")
        tokenizer = self.tokenizer
        if tokenizer.padding_side != "right":  # a tokenizer saved for left padding: labels behind pads shift
            tokenizer = copy.copy(tokenizer)  # the decoder's inputs and positions (the caller's is left as it is)
            tokenizer.padding_side = "right"
        self._pad = DataCollatorForSeq2Seq(
            tokenizer, model=self.model, label_pad_token_id=-100, pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors="pt",
        )

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return dict(self._pad([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features]))
