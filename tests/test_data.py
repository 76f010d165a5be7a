"""Parallel data: every input format loads the same pairs, bad input is named, filters are counted,
token batches respect the budget and cover every pair exactly once across ranks, the collator pads correctly."""

import copy
import json

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.data import (
    FILTER_RULES,
    FilterReport,
    ParallelDataError,
    TokenBatchSampler,
    TranslationDataCollator,
    first_pair_line,
    iter_parallel_texts,
    load_parallel_dataset,
    tokenize_parallel_dataset,
)
from vaswani_transformer.tokenization import train_tokenizer

PAIRS = [
    ("A man rides a bike.", "Ein Mann fährt Fahrrad."),
    ("Two  dogs   play", "Zwei  Hunde   spielen"),
    ("Café, 42 € and naïve résumé!", "Café, 42 € und naives Resümee!"),
    ("She says \"hi\" (quietly).", "Sie sagt \"hallo\" (leise)."),
    ("日本語 😀", "Japanisch 😀"),
    ("x", "ein sehr sehr sehr langer Satz mit vielen Wörtern"),
]


def write_formats(folder, pairs, src="en", tgt="de"):
    """The same pairs as side-by-side text, TSV (with and without header) and JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"train.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (folder / f"train.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    (folder / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    (folder / "header.tsv").write_text(f"{tgt}\t{src}\n" + "".join(f"{t}\t{s}\n" for s, t in pairs), encoding="utf-8")
    (folder / "train.jsonl").write_text(
        "".join(json.dumps({"translation": {tgt: t, src: s}}, ensure_ascii=False) + "\n" for s, t in pairs),
        encoding="utf-8",
    )
    return folder


def as_pairs(split, src="en", tgt="de"):
    return [(ex["translation"][src], ex["translation"][tgt]) for ex in split]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [side for pair in PAIRS for side in pair] * 3
    return train_tokenizer(corpus, vocab_size=300, min_frequency=1, show_progress=False)


def test_every_input_format_loads_the_same_dataset(tmp_path):
    data = write_formats(tmp_path / "data", PAIRS)
    cache = str(tmp_path / "cache")
    loaded = {
        "prefix": load_parallel_dataset(train_file=str(data / "train"), cache_dir=cache),
        "source file": load_parallel_dataset(train_file=str(data / "train.en"), cache_dir=cache),
        "tsv": load_parallel_dataset(train_file=str(data / "train.tsv"), cache_dir=cache),
        "tsv header": load_parallel_dataset(train_file=str(data / "header.tsv"), cache_dir=cache),
        "jsonl": load_parallel_dataset(train_file=str(data / "train.jsonl"), cache_dir=cache),
    }
    loaded["prefix"].save_to_disk(str(tmp_path / "saved"))
    loaded["saved"] = load_parallel_dataset(dataset_name=str(tmp_path / "saved"))
    # a folder of data files through datasets.load_dataset (the Hub code path, offline)
    hub_like = tmp_path / "hub_like"
    hub_like.mkdir()
    (hub_like / "train.jsonl").write_bytes((data / "train.jsonl").read_bytes())
    loaded["load_dataset"] = load_parallel_dataset(dataset_name=str(hub_like), cache_dir=cache)
    streamed_hub = load_parallel_dataset(dataset_name=str(hub_like), streaming=True)
    assert as_pairs(streamed_hub["train"]) == PAIRS
    # plain language columns are converted to the translation form
    columns = datasets.Dataset.from_dict({"en": [s for s, _ in PAIRS], "de": [t for _, t in PAIRS]})
    datasets.DatasetDict({"train": columns}).save_to_disk(str(tmp_path / "columns"))
    loaded["columns"] = load_parallel_dataset(dataset_name=str(tmp_path / "columns"))
    for name, ds in loaded.items():
        assert list(ds) == ["train"], name
        assert ds["train"].column_names == ["translation"], name
        assert as_pairs(ds["train"]) == PAIRS, name
    assert isinstance(loaded["prefix"]["train"].features["translation"], datasets.Translation)
    # streaming gives the same pairs without writing a cache
    streamed = load_parallel_dataset(train_file=str(data / "train"), streaming=True)
    assert isinstance(streamed, datasets.IterableDatasetDict)
    assert as_pairs(streamed["train"]) == PAIRS
    assert as_pairs(load_parallel_dataset(train_file=str(data / "train.jsonl"), streaming=True)["train"]) == PAIRS
    # reversed direction and several splits
    both = load_parallel_dataset(train_file=str(data / "train"), validation_file=str(data / "header.tsv"),
                                 test_file=str(data / "train.jsonl"), source_lang="de", target_lang="en",
                                 cache_dir=cache)
    assert list(both) == ["train", "validation", "test"]
    for split in both.values():
        assert as_pairs(split, "de", "en") == [(t, s) for s, t in PAIRS]
    assert list(iter_parallel_texts(loaded["tsv"], "en", "de"))[:4] == [PAIRS[0][0], PAIRS[0][1], *PAIRS[1]]


def test_first_pair_line_names_the_line_of_each_loaded_pair(tmp_path):
    """Pair i of a loaded file is on line i + first_pair_line of it (2 after a TSV header line, which the loader skips;
    empty lines are pairs too), as read back from the file itself: the line that warnings about a pair name."""
    pairs = PAIRS[:2] + [("", "")] + PAIRS[2:]
    data = write_formats(tmp_path / "data", pairs)
    (data / "train.tsv").write_text("".join(f"{s}\t{t}\n" if s else "\n" for s, t in pairs), encoding="utf-8")
    source_of_line = {  # each file's own layout: the source text a line holds
        "train": lambda line: line,  # (train.en)
        "train.tsv": lambda line: line.split("\t")[0],
        "header.tsv": lambda line: line.split("\t")[-1],  # its header: de, en
        "train.jsonl": lambda line: json.loads(line)["translation"]["en"],
    }
    first = {name: first_pair_line(str(data / name), "en", "de") for name in source_of_line}
    assert first == {"train": 1, "train.tsv": 1, "header.tsv": 2, "train.jsonl": 1}
    assert first_pair_line(str(data / "header.tsv"), "en", "fr") == 1  # a first line naming other languages: a pair
    for name, source in source_of_line.items():
        lines = (data / ("train.en" if name == "train" else name)).read_text(encoding="utf-8").split("\n")
        loaded = load_parallel_dataset(train_file=str(data / name), cache_dir=str(tmp_path / "cache"))["train"]
        assert len(loaded) == len(pairs)
        for i, (text, _) in enumerate(as_pairs(loaded)):
            assert source(lines[i + first[name] - 1]) == text, (name, i)  # line i + first, counted from 1


def test_a_data_file_without_pairs_is_an_error_naming_it(tmp_path):
    """An empty file, or a TSV file holding only its header line: an error naming it (datasets' own was 'Instruction
    "train" corresponds to no data!'), also streamed. A single blank line is one (empty) pair, as everywhere."""
    (tmp_path / "a.en").write_text("", encoding="utf-8")
    (tmp_path / "a.de").write_text("", encoding="utf-8")
    (tmp_path / "b.tsv").write_text("de\ten\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text("", encoding="utf-8")
    cases = {
        "a": f"{tmp_path / 'a.en'} and {tmp_path / 'a.de'} hold no pairs: both files are empty.",
        "b.tsv": f"{tmp_path / 'b.tsv'} holds no pairs: only a header line.",
        "c.jsonl": f"{tmp_path / 'c.jsonl'} holds no pairs: it is empty.",
    }
    for name, message in cases.items():
        for streaming in (False, True):
            with pytest.raises(ParallelDataError) as err:
                load_parallel_dataset(validation_file=str(tmp_path / name), cache_dir=str(tmp_path / "cache"),
                                      streaming=streaming)  # fmt: skip
            assert str(err.value) == message
    (tmp_path / "d.jsonl").write_text("\n", encoding="utf-8")
    assert as_pairs(load_parallel_dataset(train_file=str(tmp_path / "d.jsonl"))["train"]) == [("", "")]


def test_changed_files_are_reloaded_not_served_from_cache(tmp_path):
    data = write_formats(tmp_path / "data", PAIRS)
    cache = str(tmp_path / "cache")
    assert as_pairs(load_parallel_dataset(train_file=str(data / "train"), cache_dir=cache)["train"]) == PAIRS
    write_formats(tmp_path / "data", PAIRS[:2])
    assert as_pairs(load_parallel_dataset(train_file=str(data / "train"), cache_dir=cache)["train"]) == PAIRS[:2]


def test_bad_inputs_name_the_file_and_line(tmp_path):
    cache = str(tmp_path / "cache")
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\nzwei", encoding="utf-8")
    with pytest.raises(ParallelDataError) as err:
        load_parallel_dataset(train_file=str(tmp_path / "a"), cache_dir=cache)
    assert f"{tmp_path / 'a.en'} has 3 lines" in str(err.value) and f"{tmp_path / 'a.de'} has 2 lines" in str(err.value)

    (tmp_path / "b.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "b.de").write_bytes(b"eins\nzwei\ndr\xc3\n")
    for streaming in (False, True):
        with pytest.raises(ParallelDataError, match=rf"{tmp_path / 'b.de'}:3: invalid UTF-8"):
            ds = load_parallel_dataset(train_file=str(tmp_path / "b"), cache_dir=cache, streaming=streaming)
            list(ds["train"])

    (tmp_path / "c.tsv").write_bytes(b"one\teins\n\xff\tzwei\n")
    with pytest.raises(ParallelDataError, match=r"c\.tsv:2: invalid UTF-8"):
        load_parallel_dataset(train_file=str(tmp_path / "c.tsv"), cache_dir=cache)
    (tmp_path / "d.tsv").write_text("one\teins\ntwo\tzwei\tdrei\n", encoding="utf-8")
    with pytest.raises(ParallelDataError, match=r"d\.tsv:2: expected 2 tab-separated columns \(en, de\), found 3"):
        load_parallel_dataset(train_file=str(tmp_path / "d.tsv"), cache_dir=cache)

    lines = [{"translation": {"en": "one", "de": "eins"}}, {"translation": {"en": "two", "fr": "deux"}}]
    (tmp_path / "e.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    missing_key = r"e\.jsonl:2: \"translation\" has no 'de' key \(keys: \['en', 'fr'\]\)"
    with pytest.raises(ParallelDataError, match=missing_key):
        load_parallel_dataset(train_file=str(tmp_path / "e.jsonl"), cache_dir=cache)
    (tmp_path / "f.jsonl").write_text('{"translation": {"en": "a", "de": "b"}}\n{"en": "a", "de": "b"}\n{oops\n')
    with pytest.raises(ParallelDataError, match=r'f\.jsonl:2: expected an object with a "translation" object'):
        load_parallel_dataset(train_file=str(tmp_path / "f.jsonl"), cache_dir=cache)
    (tmp_path / "g.jsonl").write_text('{"translation": {"en": "a", "de": "b"}}\n{"translation": {"en": "a", "de": '
                                      '"b", "en": "c"}}\n')  # a key twice: json kept the last one without a word
    with pytest.raises(ParallelDataError, match=r"g\.jsonl:2: 'en' given twice; keep one"):
        load_parallel_dataset(train_file=str(tmp_path / "g.jsonl"), cache_dir=cache)
    # JSON's "\ud800" escape is half of a character: it was a DatasetGenerationError naming no file or line
    (tmp_path / "s.jsonl").write_text('{"translation": {"en": "a", "de": "b"}}\n{"translation": {"en": "a", "de": '
                                      '"x\\ud800y"}}\n')  # fmt: skip
    with pytest.raises(ParallelDataError, match=r"s\.jsonl:2: \"translation\"\['de'\] holds a lone surrogate "
                                                r"\('\\ud800' at character 1\)"):  # fmt: skip
        load_parallel_dataset(train_file=str(tmp_path / "s.jsonl"), cache_dir=cache)

    with pytest.raises(ParallelDataError, match="expected a .jsonl/.json or .tsv file, or a prefix with"):
        load_parallel_dataset(train_file=str(tmp_path / "nothing"), cache_dir=cache)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"en": ["a"], "fr": ["b"]})}).save_to_disk(
        str(tmp_path / "enfr"))
    with pytest.raises(ParallelDataError, match=r"expected a 'translation' column or columns 'en' and 'de'"):
        load_parallel_dataset(dataset_name=str(tmp_path / "enfr"))
    enfr = load_parallel_dataset(dataset_name=str(tmp_path / "enfr"), target_lang="fr")
    enfr.save_to_disk(str(tmp_path / "enfr_translation"))
    with pytest.raises(ParallelDataError, match=r"enfr_translation\[train\]: 'translation' has no \['de'\]"):
        load_parallel_dataset(dataset_name=str(tmp_path / "enfr_translation"))


def test_conflicting_data_sources_and_a_header_of_other_columns_are_errors(tmp_path):
    """Nothing given is silently set aside (before, each of these loaded without a word): files beside a dataset
    (which gives every split), a configuration name for a save_to_disk folder (which has none), and a TSV first line
    that is a header of other columns (one of the languages and another, or source/target), which trained as a pair
    with the other language's column in place of the target's."""
    cache = str(tmp_path / "cache")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"en": ["a"], "de": ["b"]})}).save_to_disk(
        str(tmp_path / "ende"))
    (tmp_path / "v.tsv").write_text("one\teins\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"Both dataset_name \(.*ende\) and validation_file, test_file given"):
        load_parallel_dataset(dataset_name=str(tmp_path / "ende"), validation_file=str(tmp_path / "v.tsv"),
                              test_file=str(tmp_path / "v.tsv"), cache_dir=cache)  # fmt: skip
    with pytest.raises(ValueError, match=r"dataset_config_name \(de-en\) names a configuration of a Hub dataset"):
        load_parallel_dataset(dataset_name=str(tmp_path / "ende"), dataset_config_name="de-en", cache_dir=cache)
    for header in ("en\tfr", "source\ttarget", "Src\tTgt", "EN\tDE", "en \t de"):  # (the last two: read as a pair)
        (tmp_path / "h.tsv").write_text(f"{header}\nHello\tBonjour\n", encoding="utf-8")
        with pytest.raises(ParallelDataError, match=r"h\.tsv:1: the first line .* looks like a header, but a header "
                                                    r"names the two languages, en and de"):  # fmt: skip
            load_parallel_dataset(train_file=str(tmp_path / "h.tsv"), cache_dir=cache)
    (tmp_path / "h.tsv").write_text("Hello\tHallo\nen\tfr\n", encoding="utf-8")  # not the first line: a pair
    assert load_parallel_dataset(train_file=str(tmp_path / "h.tsv"), cache_dir=cache)["train"][1]["translation"] == {
        "en": "en", "de": "fr"}  # fmt: skip


def expected_reasons(pairs, tokenizer, max_src, max_tgt, max_ratio):
    """Brute-force reference for the filter: first broken rule per pair, in FILTER_RULES order."""
    reasons = []
    for s, t in pairs:
        ls, lt = len(tokenizer(s)["input_ids"]), len(tokenizer(t)["input_ids"])
        checks = [not s.strip(), not t.strip(), max_src is not None and ls > max_src,
                  max_tgt is not None and lt > max_tgt,
                  max_ratio is not None and max(ls - 1, lt - 1, 1) / max(min(ls - 1, lt - 1), 1) > max_ratio]
        reasons.append(next((FILTER_RULES[i] for i, c in enumerate(checks) if c), "kept"))
    return reasons


def test_tokenize_and_filters_count_every_dropped_pair(tmp_path, tokenizer):
    pairs = PAIRS + [("", "leer"), ("empty target", "   "), ("", ""), ("word " * 40, "Wort " * 40)]
    (tmp_path / "train.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "train.de").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    raw = load_parallel_dataset(train_file=str(tmp_path / "train"), cache_dir=str(tmp_path / "cache"))
    assert len(raw["train"]) == len(pairs)  # empty lines are kept by the loader ...
    limits = dict(max_source_tokens=30, max_target_tokens=30, max_length_ratio=3.0)
    ds, report = tokenize_parallel_dataset(raw, tokenizer, "en", "de", **limits, keep_text=True)
    expected = expected_reasons(pairs, tokenizer, 30, 30, 3.0)
    assert set(expected) >= {"kept", "empty_source", "empty_target", "source_too_long", "length_ratio"}
    assert isinstance(report, FilterReport)
    assert report.total("train") == len(pairs) and report.kept("train") == expected.count("kept")
    for rule in FILTER_RULES:  # ... and dropped, and counted, by the filter
        assert report.dropped("train", rule) == expected.count(rule), rule
    text = str(report)
    assert "empty_source" in text and "max_length_ratio=3.0" in text
    assert report.to_dict()["splits"]["train"]["kept"] == expected.count("kept")
    kept = [p for p, r in zip(pairs, expected) if r == "kept"]
    assert as_pairs(ds["train"]) == kept
    for row, (s, t) in zip(ds["train"], kept):
        assert row["input_ids"] == tokenizer(s)["input_ids"] and row["labels"] == tokenizer(t)["input_ids"]
        assert row["input_ids"][-1] == row["labels"][-1] == 2
        assert (row["source_length"], row["target_length"]) == (len(row["input_ids"]), len(row["labels"]))

    # without limits only the empty sides go; text columns are dropped by default
    ds2, report2 = tokenize_parallel_dataset(raw, tokenizer, "en", "de")
    assert ds2["train"].column_names == ["input_ids", "labels", "source_length", "target_length"]
    assert report2.dropped("train") == 3 and report2.dropped("train", "empty_source") == 2

    # streaming: same pairs kept, counts fill in while iterating
    streamed = load_parallel_dataset(train_file=str(tmp_path / "train"), streaming=True)
    ds3, report3 = tokenize_parallel_dataset(streamed, tokenizer, "en", "de", **limits)
    assert [r["input_ids"] for r in ds3["train"]] == ds["train"]["input_ids"]
    assert report3.streaming and report3.splits["train"] == report.splits["train"]
    assert len(list(ds3["train"])) == expected.count("kept")  # a second pass (an epoch): counts of that pass
    assert report3.splits["train"] == report.splits["train"]


def test_a_text_that_is_not_a_string_is_an_error_naming_split_row_and_language(tmp_path, tokenizer):
    """A Hub or save_to_disk dataset can hold None (a missing translation): a ParallelDataError, not the
    tokenizer's TypeError."""
    with_none = datasets.Dataset.from_dict({"en": ["a b", "c", "d"], "de": ["x", None, "z"]})
    datasets.DatasetDict({"train": with_none}).save_to_disk(tmp_path / "hub_like")
    for streaming in (False, True):
        raw = load_parallel_dataset(dataset_name=str(tmp_path / "hub_like"), streaming=streaming)
        with pytest.raises(ParallelDataError, match="train split, row 1: the 'de' text is None, not a string"):
            ds, _ = tokenize_parallel_dataset(raw, tokenizer, "en", "de")
            list(ds["train"])  # streaming: read when iterated


def test_filters_apply_only_to_the_splits_named(tmp_path, tokenizer):
    """filter_splits=("train",): the training split is filtered, evaluation splits keep every pair (empty ones too)."""
    pairs = PAIRS + [("", "leer"), ("word " * 40, "Wort")]
    for name in ("train", "test"):
        (tmp_path / f"{name}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (tmp_path / f"{name}.de").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    limits = dict(max_source_tokens=30, max_target_tokens=30, max_length_ratio=3.0)
    expected = expected_reasons(pairs, tokenizer, 30, 30, 3.0)
    for streaming in (False, True):
        raw = load_parallel_dataset(train_file=str(tmp_path / "train"), test_file=str(tmp_path / "test"),
                                    streaming=streaming, cache_dir=str(tmp_path / "cache"))  # fmt: skip
        ds, report = tokenize_parallel_dataset(raw, tokenizer, "en", "de", **limits, keep_text=True,
                                               filter_splits=("train",))  # fmt: skip
        assert as_pairs(ds["train"]) == [p for p, r in zip(pairs, expected) if r == "kept"]
        test_rows = list(ds["test"])  # once: streaming counts fill in while iterating
        assert as_pairs(test_rows) == pairs
        assert [row["input_ids"] for row in test_rows] == [tokenizer(s)["input_ids"] for s, _ in pairs]
        assert report.splits["test"] == {"total": len(pairs), "kept": len(pairs), **{r: 0 for r in FILTER_RULES}}
        assert report.kept("train") == expected.count("kept") < len(pairs)


@pytest.mark.slow
def test_tokenize_with_num_proc_matches_single_process(tmp_path, tokenizer):
    data = write_formats(tmp_path / "data", PAIRS * 20)
    raw = load_parallel_dataset(train_file=str(data / "train"), cache_dir=str(tmp_path / "cache"))
    one, r1 = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_length_ratio=3.0, batch_size=16)
    two, r2 = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_length_ratio=3.0, batch_size=16, num_proc=2,
                                        load_from_cache_file=False)
    assert one["train"].to_dict() == two["train"].to_dict() and r1.splits == r2.splits


def random_lengths(n, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, size=n)
    tgt = np.clip(src + rng.integers(-10, 11, size=n), 1, None)
    return src, tgt


@pytest.mark.parametrize("num_replicas", [1, 2, 3])
def test_sampler_budget_coverage_determinism_and_epochs(num_replicas):
    src, tgt = random_lengths(2000, seed=0)
    src[7], tgt[11] = 500, 300  # two pairs longer than the budget on one side
    max_tokens = 256
    ranks = [TokenBatchSampler(src, tgt, max_tokens, num_replicas=num_replicas, rank=r, seed=3)
             for r in range(num_replicas)]
    assert ranks[0].oversized_indices == [7, 11]
    kept = sorted(set(range(2000)) - {7, 11})
    epochs = []
    for epoch in range(3):
        per_rank = []
        for sampler in ranks:
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(batches) == len(sampler) == len(ranks[0])  # same number of batches on every rank
            for b in batches:
                assert len(b) * max(src[b]) <= max_tokens and len(b) * max(tgt[b]) <= max_tokens
            per_rank.append(batches)
        everything = sorted(i for batches in per_rank for b in batches for i in b)
        assert everything == kept  # every kept pair exactly once per epoch across all ranks
        assert len({i for b in per_rank[0] for i in b} & {i for b in per_rank[-1] for i in b}) == (
            len(everything) if num_replicas == 1 else 0)
        epochs.append(per_rank)
        # deterministic for seed and epoch: a fresh sampler gives the same batches
        fresh = TokenBatchSampler(src, tgt, max_tokens, num_replicas=num_replicas, rank=0, seed=3)
        fresh.set_epoch(epoch)
        assert list(fresh) == per_rank[0]
    # batches (not sentences) are shuffled: same batches, different order across epochs
    assert epochs[0][0] != epochs[1][0]
    as_sets = [sorted(tuple(sorted(b)) for batches in per_rank for b in batches) for per_rank in epochs]
    assert as_sets[0] == as_sets[1] == as_sets[2]
    # a different seed gives different batches
    other = TokenBatchSampler(src, tgt, max_tokens, seed=4)
    assert list(other) != list(TokenBatchSampler(src, tgt, max_tokens, seed=3))
    # batches are tight: similar lengths grouped together
    padded = sum(len(b) * (max(src[b]) + max(tgt[b])) for b in ranks[0].batches)
    assert (src[kept].sum() + tgt[kept].sum()) / padded > 0.9


def test_sampler_edge_cases():
    src, tgt = random_lengths(50, seed=1)
    capped = TokenBatchSampler(src, tgt, 10_000, max_sentences=8, shuffle=False)
    assert all(len(b) <= 8 for b in capped) and sorted(i for b in capped for i in b) == list(range(50))
    assert list(capped) == list(capped)  # no shuffle: stable order
    # everything oversized: no batches, no endless loop
    empty = TokenBatchSampler([50, 60], [5, 5], 40)
    assert len(empty) == 0 and list(empty) == [] and empty.oversized_indices == [0, 1]
    # a single batch split so that 3 ranks get one each
    split = [TokenBatchSampler([2] * 5, [2] * 5, 100, num_replicas=3, rank=r) for r in range(3)]
    assert [len(s) for s in split] == [1, 1, 1] and sorted(i for s in split for b in s for i in b) == list(range(5))
    with pytest.raises(ValueError, match="Cannot give 3 ranks the same number of batches: .* only 2 pair"):
        TokenBatchSampler([2, 2], [2, 2], 100, num_replicas=3)
    # pairs that each fill a batch alone cannot be split further: an error, never an empty batch
    with pytest.raises(ValueError, match=r"3 batch\(es\) of max_tokens=100 would need 4, but there are only 3 pair"):
        TokenBatchSampler([60] * 3, [60] * 3, 100, num_replicas=2)
    lengths = [60] * 3 + [20] * 2  # three batches of one long pair, one of two short ones: 4 for 2 ranks
    two = [TokenBatchSampler(lengths, lengths, 100, num_replicas=2, rank=r) for r in range(2)]
    assert [len(s) for s in two] == [2, 2] and all(len(b) > 0 for s in two for b in s)
    with pytest.raises(ValueError, match="Need 0 <= rank < num_replicas"):
        TokenBatchSampler(src, tgt, 100, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="50 source lengths but 49 target lengths"):
        TokenBatchSampler(src, tgt[:49], 100)


def test_collator_and_dataloader_with_token_batches(tmp_path, tokenizer):
    collator = TranslationDataCollator(tokenizer)
    batch = collator([{"input_ids": [5, 6, 2], "labels": [7, 2], "source_length": 3},
                      {"input_ids": [8, 2], "labels": [9, 10, 11, 2]}])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}  # decoder inputs are the model's to make
    assert batch["input_ids"].tolist() == [[5, 6, 2], [8, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[7, 2, -100, -100], [9, 10, 11, 2]]
    assert all(t.dtype == torch.long for t in batch.values())
    model = VaswaniTransformerForConditionalGeneration(VaswaniTransformerConfig(
        vocab_size=50, d_model=8, d_ff=8, num_heads=2, encoder_layers=1, decoder_layers=1))  # fmt: skip
    # <s> (1), then the labels without their last token, padding (-100) as <pad> (0)
    assert model.prepare_decoder_input_ids_from_labels(batch["labels"]).tolist() == [[1, 7, 2, 0], [1, 9, 10, 11]]
    with_model = TranslationDataCollator(tokenizer, model=model)([{"input_ids": [5, 2], "labels": [7, 2]}])
    assert with_model["decoder_input_ids"].tolist() == [[1, 7]]  # for transformers' own Seq2SeqTrainer
    # a tokenizer saved for left padding (for a decoder-only model, say) pads here on the right all the same: left
    # padded labels put their pads before <s> and moved the tokens' positions (the loss changed, without a word)
    left = copy.copy(tokenizer)
    left.padding_side = "left"
    features = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": [8, 2], "labels": [9, 10, 11, 2]}]
    assert {k: v.tolist() for k, v in TranslationDataCollator(left)(features).items()} == \
        {k: v.tolist() for k, v in batch.items()} and left.padding_side == "left"

    data = write_formats(tmp_path / "data", PAIRS * 30)
    raw = load_parallel_dataset(train_file=str(data / "train"), cache_dir=str(tmp_path / "cache"))
    ds, _ = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_source_tokens=64, max_target_tokens=64)
    sampler = TokenBatchSampler.from_dataset(ds["train"], max_tokens=64, seed=1)
    loader = DataLoader(ds["train"], batch_sampler=sampler, collate_fn=collator)
    seen = 0
    for batch in loader:
        assert batch["input_ids"].numel() <= 64 and batch["labels"].numel() <= 64
        assert (batch["input_ids"][:, -1:] != 0).any() and (batch["labels"][:, -1:] != -100).any()  # no extra padding
        seen += len(batch["input_ids"])
    assert seen == len(ds["train"]) == len(PAIRS) * 30
    # a dataset without the length columns falls back to the token columns
    plain = ds["train"].remove_columns(["source_length", "target_length"])
    assert TokenBatchSampler.from_dataset(plain, max_tokens=64, seed=1).batches == sampler.batches
    # a shuffled dataset (an indices mapping over the same Arrow table): its lengths in its own row order
    shuffled = ds["train"].shuffle(seed=4)
    lengths = [(len(row["input_ids"]), len(row["labels"])) for row in shuffled]
    expected = TokenBatchSampler([s for s, _ in lengths], [t for _, t in lengths], max_tokens=64, seed=1)
    assert TokenBatchSampler.from_dataset(shuffled, max_tokens=64, seed=1).batches == expected.batches


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"seed": 5}, {"seed": 1, "data_seed": 5},
                                      {"seed": 5, "train_sampling_strategy": "sequential"}])  # fmt: skip
def test_sampler_and_collator_plug_into_the_trainer(tmp_path, tokenizer, settings):
    """VaswaniSeq2SeqTrainer(max_tokens_per_batch=...) trains on the sampler's batches, as they are, and sets its
    epoch: what training uses (get_train_dataloader). As transformers' samplers, the batches follow data_seed when
    given (else seed), and train_sampling_strategy="sequential" keeps them in order."""
    from transformers import Seq2SeqTrainingArguments

    from vaswani_transformer.tokenization import check_tokenizer_matches_config, config_kwargs_from_tokenizer
    from vaswani_transformer.trainer import VaswaniSeq2SeqTrainer

    data = write_formats(tmp_path / "data", PAIRS * 8)
    raw = load_parallel_dataset(train_file=str(data / "train"), cache_dir=str(tmp_path / "cache"))
    ds, _ = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_source_tokens=64, max_target_tokens=64)
    train = ds["train"].add_column("index", list(range(len(ds["train"]))))
    sequential = settings.get("train_sampling_strategy") == "sequential"
    sampler = TokenBatchSampler.from_dataset(train, max_tokens=64, seed=5, shuffle=not sequential)  # the trainer's
    collator = TranslationDataCollator(tokenizer)
    seen = []

    def observing_collator(features):  # records which pairs the Trainer's DataLoader delivered
        seen.append([f["index"] for f in features])
        return collator(features)

    torch.manual_seed(0)
    config = VaswaniTransformerConfig(**config_kwargs_from_tokenizer(tokenizer), d_model=16, encoder_layers=1,
                                      decoder_layers=1, num_heads=2, d_ff=32)
    check_tokenizer_matches_config(tokenizer, config)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=2, report_to="none",
                                    save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
                                    **settings)  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=VaswaniTransformerForConditionalGeneration(config), args=args,
                                    train_dataset=train, data_collator=observing_collator, max_tokens_per_batch=64)
    assert len(trainer.get_train_dataloader()) == len(sampler)
    seen.clear()
    trainer.train()
    assert len(seen) == 2 * len(sampler)
    epoch0, epoch1 = seen[: len(sampler)], seen[len(sampler) :]
    for epoch, batches in enumerate((epoch0, epoch1)):
        sampler.set_epoch(epoch)
        assert batches == list(sampler)  # the Trainer set the epoch and used our batches as they are
        assert sorted(i for b in batches for i in b) == list(range(len(train)))
    assert (epoch0 == epoch1) == sequential


def test_transformers_own_seq2seq_trainer_trains_with_the_collator_given_the_model(tmp_path, tokenizer):
    """transformers' `Seq2SeqTrainer` with label smoothing takes the labels out of the model call: the collator
    given the model supplies the decoder inputs (as `DataCollatorForSeq2Seq(tokenizer, model=model)` does)."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    torch.manual_seed(0)
    model = VaswaniTransformerForConditionalGeneration(VaswaniTransformerConfig(
        vocab_size=len(tokenizer), d_model=16, d_ff=16, num_heads=2, encoder_layers=1, decoder_layers=1))  # fmt: skip
    rows = [{"input_ids": tokenizer(s)["input_ids"], "labels": tokenizer(t)["input_ids"]} for s, t in PAIRS]
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=3,
                                    label_smoothing_factor=0.1, report_to="none", use_cpu=True, save_strategy="no")
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                             data_collator=TranslationDataCollator(tokenizer, model=model))  # fmt: skip
    assert np.isfinite(trainer.train().training_loss)
