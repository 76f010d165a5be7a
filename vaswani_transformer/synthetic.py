"""Small translation tasks the package generates itself, so that the whole training loop runs offline.

Like the Annotated Transformer's copy task, these give a fresh machine something to learn in minutes, but they
are real *translation* tasks with a tokenizer, BLEU and beam search:

* ``numbers``: a number written with digits -> the same number in English words
  (``"4821"`` -> ``"four thousand eight hundred twenty-one"``); source language ``num``, target ``en``.
* ``reverse``: a sentence of a toy language -> its word-for-word translation into a second toy language, in
  reverse order (``"ka lo mi"`` -> ``"MIX LOX KAX"``-style words); source ``src``, target ``tgt``.
* ``copy``: a sentence of the toy language -> itself; source ``src``, target ``tgt``.

Everything is a pure function of ``seed``: :func:`generate_pairs` returns the pairs and
:func:`write_synthetic_task` writes ``train/validation/test`` as JSON lines that
:func:`vaswani_transformer.data.load_parallel_dataset` reads (``train_file=folder/train.jsonl`` etc.).
The three splits are disjoint (no source appears in two splits).
"""

from __future__ import annotations

import json
import os
import random

SYNTHETIC_TASKS = ("numbers", "reverse", "copy")
# (source_lang, target_lang) of each task.
TASK_LANGUAGES = {"numbers": ("num", "en"), "reverse": ("src", "tgt"), "copy": ("src", "tgt")}

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
        "seventeen eighteen nineteen".split()  # fmt: skip
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70 toy "words"


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 10**9 (``1205`` -> ``"one thousand two hundred five"``)."""
    if not 0 <= n < 10**9:
        raise ValueError(f"number_to_words handles 0 <= n < 10**9, got {n}.")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_to_words(rest))
    for size, name in ((10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return number_to_words(n // size) + " " + name + ("" if rest == 0 else " " + number_to_words(rest))
    raise AssertionError  # pragma: no cover


def _toy_translation(word: str) -> str:
    # A fixed bijection of the toy lexicon: shift consonant and vowel, upper-case.
    consonant, vowel = word[0], word[1]
    c = "bdfgklmnprstvz"[("bdfgklmnprstvz".index(consonant) + 5) % 14]
    v = "aeiou"[("aeiou".index(vowel) + 2) % 5]
    return (c + v + "x").upper()


def _make_example(task: str, rng: random.Random, max_words: int, max_number: int) -> tuple[str, str]:
    if task == "numbers":
        digits = rng.randint(1, len(str(max_number)))
        n = rng.randint(0 if digits == 1 else 10 ** (digits - 1), min(10**digits - 1, max_number))
        return str(n), number_to_words(n)
    words = [rng.choice(_SYLLABLES) for _ in range(rng.randint(1, max_words))]
    if task == "copy":
        return " ".join(words), " ".join(words)
    return " ".join(words), " ".join(_toy_translation(w) for w in reversed(words))


def generate_pairs(
    task: str,
    sizes: dict[str, int],
    seed: int = 0,
    max_words: int = 10,
    max_number: int = 999_999,
) -> dict[str, list[tuple[str, str]]]:
    """``{split: [(source, target), ...]}`` with ``sizes[split]`` distinct pairs per split, splits disjoint.

    The splits come from one random stream in the order of ``sizes`` (train first), so a held-out split holds only
    examples the splits before it did not draw (with 20,000 training numbers every number under 1,000 is in training,
    and the quickstart's test numbers have 4-6 digits), and it changes with their sizes. A smaller training set is
    the start of a larger one, so the largest run's test set is disjoint from every smaller run's training set: score
    runs of several ``synthetic_train_size`` on that one file (``--test_file``). Drawing held-out splits first would
    take the few small numbers away from training.
    Raises ``ValueError`` for an unknown task or when the task has fewer distinct examples than requested.
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"Unknown synthetic task {task!r}. Valid tasks: {', '.join(SYNTHETIC_TASKS)}.")
    for split, size in sizes.items():
        if size < 0:
            raise ValueError(f"Size of split {split!r} must be >= 0, got {size}.")
    total = sum(sizes.values())
    capacity = max_number + 1 if task == "numbers" else sum(len(_SYLLABLES) ** k for k in range(1, max_words + 1))
    if total > capacity // 2:
        raise ValueError(f"Task {task!r} has only {capacity} distinct examples; {total} requested (max half).")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[tuple[str, str]]] = {}
    for split, size in sizes.items():
        pairs = []
        while len(pairs) < size:
            source, target = _make_example(task, rng, max_words, max_number)
            if source not in seen:
                seen.add(source)
                pairs.append((source, target))
        out[split] = pairs
    return out


def write_synthetic_task(
    output_dir: str | os.PathLike,
    task: str,
    train_size: int = 20_000,
    validation_size: int = 200,
    test_size: int = 200,
    seed: int = 0,
    **kwargs,
) -> dict[str, str]:
    """Write ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` in the translation form; returns their paths.

    Each line is ``{"translation": {source_lang: ..., target_lang: ...}}`` with the languages of
    :data:`TASK_LANGUAGES`. Files are rewritten only when their content would change (keeps the datasets cache).
    """
    source_lang, target_lang = TASK_LANGUAGES.get(task, (None, None))
    splits = generate_pairs(
        task, {"train": train_size, "validation": validation_size, "test": test_size}, seed=seed, **kwargs
    )
    os.makedirs(output_dir, exist_ok=True)
    paths = {}
    for split, pairs in splits.items():
        path = os.path.join(os.fspath(output_dir), f"{split}.jsonl")
        text = "".join(
            json.dumps({"translation": {source_lang: s, target_lang: t}}, ensure_ascii=False) + "\n" for s, t in pairs
        )
        if not (os.path.isfile(path) and open(path, encoding="utf-8").read() == text):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        paths[split] = path
    return paths


__all__ = ["SYNTHETIC_TASKS", "TASK_LANGUAGES", "generate_pairs", "number_to_words", "write_synthetic_task"]
