"""One shared source/target subword vocabulary, as in the paper (section 5.1).

The paper used a shared byte-pair-encoding vocabulary of about 37,000 tokens for English-German and a 32,000
word-piece vocabulary for English-French. :func:`train_tokenizer` trains either with the `tokenizers` library
and returns a :class:`transformers.PreTrainedTokenizerFast` that is saved with ``save_pretrained`` and loaded
back with ``AutoTokenizer.from_pretrained(folder)``.

Scheme (the same for ``bpe`` and ``wordpiece``):

* **Normalisation: Unicode NFC only.** Nothing is lower-cased, stripped or collapsed; the tokenizer sees the
  NFC form of the text. Consequently ``decode(encode(text)) == unicodedata.normalize("NFC", text)`` for every
  string, which is *exactly* ``text`` for ordinary (already composed) text - including accents, digits,
  punctuation, tabs, newlines, leading/trailing and repeated spaces. Decomposed input (e.g. ``"e" + U+0301``)
  comes back composed (``"é"``).
* **Pre-tokenisation: byte-level** (GPT-2 style, no added prefix space). Every UTF-8 byte has a base token, so
  no text ever maps to ``<unk>`` (``<unk>`` exists only because the shared conventions reserve id 3).
* **Word-pieces** continue a word with the prefix :data:`WORDPIECE_CONTINUATION_PREFIX` (``"＃＃"``, full-width
  number signs). It is deliberately *not* ``"##"``: ``#`` is a byte-level character, so ``"##"`` would make
  ``"##tag"`` ambiguous to decode. Every byte also gets a continuation token, so word-pieces never need
  ``<unk>`` either.
* **Special tokens** ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3 (first in the vocabulary). The
  post-processor appends ``</s>`` to every encoded sequence - sources and ``text_target=`` alike - and adds no
  ``<s>``: the decoder start token ``<s>`` is prepended by the label shift, not by the tokenizer.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from . import cli
from .data import iter_parallel_texts, load_parallel_dataset
from .textio import count_lines, iter_lines, iter_text_files

logger = logging.getLogger(__name__)

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # ids 0, 1, 2, 3 in this order
PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID, UNK_TOKEN_ID = 0, 1, 2, 3
WORDPIECE_CONTINUATION_PREFIX = "\uff03\uff03"  # "＃＃": never produced by the byte-level alphabet
TOKENIZER_MODELS = ("bpe", "wordpiece")
DEFAULT_MODEL_MAX_LENGTH = 1024


def _byte_alphabet() -> list[str]:
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def _base_tokenizer(model: str) -> Tokenizer:
    """An untrained tokenizer with the project's normaliser, pre-tokenizer and decoder."""
    if model == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
        decoder = decoders.ByteLevel()
    elif model == "wordpiece":
        tokenizer = Tokenizer(
            models.WordPiece(
                unk_token=UNK_TOKEN,
                continuing_subword_prefix=WORDPIECE_CONTINUATION_PREFIX,
                # a pre-token is a byte-level word or run of spaces/punctuation: never give up on it
                max_input_chars_per_word=1_000_000,
            )
        )
        decoder = decoders.Sequence(
            [decoders.Replace(Regex("^" + WORDPIECE_CONTINUATION_PREFIX), ""), decoders.ByteLevel()]
        )
    else:
        raise ValueError(f"Unknown tokenizer model {model!r}; expected one of {TOKENIZER_MODELS}.")
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoder
    return tokenizer


def _eos_post_processor() -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"$A:0 {EOS_TOKEN}:0",
        pair=f"$A:0 {EOS_TOKEN}:0 $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, EOS_TOKEN_ID)],
    )


def _wordpiece_continuations() -> list[str]:
    """A continuation piece for every byte (``##`` + the byte's character), so that no word falls back to ``<unk>``."""
    return [WORDPIECE_CONTINUATION_PREFIX + c for c in _byte_alphabet()]


def _add_wordpiece_continuations(tokenizer: Tokenizer, vocab_size: int) -> Tokenizer:
    """The trained word-piece tokenizer rebuilt as a plain vocabulary holding every byte's continuation piece.

    The trainer is given the continuation pieces as special tokens (fixed ids: it numbers the pieces it makes itself
    in a hash map's order, which differs from process to process and breaks ties between equally frequent merges,
    tokenizers issue #1794); here they become ordinary vocabulary again, so that text containing "##a" is not split
    at a special token. Pieces still missing are added; to stay within ``vocab_size``, the most recently learned
    multi-character pieces make room (a word-piece vocabulary is a plain set: greedy longest-match works with any
    subset that keeps the single characters).
    """
    vocab = tokenizer.get_vocab()
    protected = set(SPECIAL_TOKENS) | set(_byte_alphabet())
    needed = [piece for piece in _wordpiece_continuations() if piece not in vocab]
    protected.update(needed)
    by_id = sorted(vocab, key=vocab.__getitem__)
    overflow = max(0, len(by_id) + len(needed) - vocab_size)
    if overflow:
        removable = [t for t in reversed(by_id) if t not in protected and not (
            t.startswith(WORDPIECE_CONTINUATION_PREFIX) and len(t) == len(WORDPIECE_CONTINUATION_PREFIX) + 1)]
        dropped = set(removable[:overflow])
        by_id = [t for t in by_id if t not in dropped]
    new_vocab = {token: i for i, token in enumerate(by_id + needed)}
    rebuilt = Tokenizer(
        models.WordPiece(
            vocab=new_vocab,
            unk_token=UNK_TOKEN,
            continuing_subword_prefix=WORDPIECE_CONTINUATION_PREFIX,
            max_input_chars_per_word=1_000_000,
        )
    )
    rebuilt.normalizer = tokenizer.normalizer
    rebuilt.pre_tokenizer = tokenizer.pre_tokenizer
    rebuilt.decoder = tokenizer.decoder
    rebuilt.add_special_tokens(list(SPECIAL_TOKENS))
    return rebuilt


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> PreTrainedTokenizerFast:
    """Wrap a trained `tokenizers.Tokenizer` as the project's `PreTrainedTokenizerFast` (special ids checked)."""
    for token, expected in zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS))):
        actual = tokenizer.token_to_id(token)
        if actual != expected:
            raise ValueError(f"Special token {token!r} has id {actual}, expected {expected}.")
    tokenizer.post_processor = _eos_post_processor()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        # explicit so that transformers rebuilds exactly "$A </s>" if it ever regenerates the post-processor
        add_bos_token=False,
        add_eos_token=True,
        clean_up_tokenization_spaces=False,  # decoding must not touch spaces before punctuation
        split_special_tokens=True,  # "<s>" or "</s>" written in the text is text, not a control token
        model_max_length=model_max_length,
        padding_side="right",
    )


def train_tokenizer(
    texts: Iterable[str] | None = None,
    *,
    files: Sequence[str | os.PathLike] | None = None,
    vocab_size: int = 37000,
    model: str = "bpe",
    min_frequency: int = 2,
    length: int | None = None,
    show_progress: bool = True,
    output_dir: str | os.PathLike | None = None,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train one shared source+target vocabulary and return it as a `PreTrainedTokenizerFast`.

    Args:
        texts: any iterable of sentences (both languages mixed); consumed once, never held in memory. Use
            :func:`vaswani_transformer.data.iter_parallel_texts` for a dataset.
        files: plain text files, one sentence per line (both sides, e.g. ``train.en`` and ``train.de``); read
            lazily. May be combined with ``texts``.
        vocab_size: maximum size *including* the 4 special tokens; smaller when the corpus has fewer merges to
            offer. (``wordpiece`` always contains a continuation piece for each of the 256 bytes.)
        model: ``"bpe"`` (paper EN-DE) or ``"wordpiece"`` (paper EN-FR).
        length: number of texts, only for the progress bar (counted automatically for ``files``).
        output_dir: if given, ``save_pretrained`` there.

    See the module docstring for the exact normalisation (NFC only) and the round-trip guarantee.
    """
    if texts is None and not files:
        raise ValueError("train_tokenizer needs `texts` or `files`.")
    if model not in TOKENIZER_MODELS:
        raise ValueError(f"Unknown tokenizer model {model!r}; expected one of {TOKENIZER_MODELS}.")
    # every byte (and for word-pieces every byte as a continuation) is a token, plus the 4 special tokens
    minimum = len(SPECIAL_TOKENS) + 256 * (2 if model == "wordpiece" else 1)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is too small for {model}: the byte alphabet and special tokens "
                         f"alone need {minimum}.")
    for path in files or ():
        if not os.path.exists(path):
            raise FileNotFoundError(f"Tokenizer training file not found: {path}")
        if not os.path.isfile(path):  # (the tokenizers library reads a file by its name, and more than once)
            raise ValueError(f"Tokenizer training file {path} is not a regular file (a pipe or a folder): save the "
                             "text to a file and give that.")
    tokenizer = _base_tokenizer(model)
    common = dict(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        initial_alphabet=_byte_alphabet(),
        show_progress=show_progress,
    )
    if model == "bpe":
        trainer = trainers.BpeTrainer(**common, special_tokens=list(SPECIAL_TOKENS))
    else:  # the continuation pieces first, with fixed ids: the same vocabulary in every process
        trainer = trainers.WordPieceTrainer(**common, special_tokens=list(SPECIAL_TOKENS) + _wordpiece_continuations(),
                                            continuing_subword_prefix=WORDPIECE_CONTINUATION_PREFIX)  # fmt: skip

    def all_texts() -> Iterator[str]:
        if files:
            yield from iter_text_files(files)
        if texts is not None:
            yield from texts

    if length is None and files and texts is None:
        length = sum(count_lines(p) for p in files)
    tokenizer.train_from_iterator(all_texts(), trainer=trainer, length=length)
    if model == "wordpiece":
        tokenizer = _add_wordpiece_continuations(tokenizer, vocab_size)
    hf_tokenizer = wrap_tokenizer(tokenizer, model_max_length=model_max_length)
    if output_dir is not None:
        hf_tokenizer.save_pretrained(output_dir)
        logger.info("Saved a %s tokenizer with %d tokens to %s", model, len(hf_tokenizer), output_dir)
    return hf_tokenizer


def expected_roundtrip(text: str) -> str:
    """What ``decode(encode(text), skip_special_tokens=True)`` returns: the NFC form of ``text``."""
    return unicodedata.normalize("NFC", text)


def config_kwargs_from_tokenizer(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The config fields a tokenizer determines: ``VaswaniTransformerConfig(**config_kwargs_from_tokenizer(tok))``."""
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.bos_token_id,
    }


def check_vocabulary_fits(tokenizer, config: Any, where: str) -> None:
    """ValueError naming `where` when the tokenizer has more tokens than the model has embedding rows: its ids would
    fall outside the vocabulary (a tokenizer and a model that do not belong together). The one rule of
    `check_tokenizer_matches_config` that holds for every model, ours or imported."""
    size, config_size = len(tokenizer), getattr(config, "vocab_size", None)
    if config_size is not None and size > config_size:
        raise ValueError(
            f"{where}: the tokenizer has {size} tokens but the model's vocabulary has {config_size} "
            "(config.json vocab_size): they do not belong together."
        )


def check_tokenizer_matches_config(tokenizer: PreTrainedTokenizerFast, config: Any) -> None:
    """Raise ``ValueError`` naming every disagreement between a tokenizer and a model config.

    Rules (decided here, for the whole project):

    * every token id must have an embedding row: ``len(tokenizer) <= config.vocab_size``. A *larger* config
      vocabulary is accepted (e.g. padded to a multiple of 8); its extra rows are never targets, so training
      pushes their logits down. A smaller one is an error.
    * ``pad/bos/eos`` ids must be equal, and ``decoder_start_token_id`` must be the tokenizer's ``<s>`` id.
    * ``</s>`` must be appended by the tokenizer (a model trained without it never learns to stop).
    """
    problems = []
    size = len(tokenizer)
    config_size = getattr(config, "vocab_size", None)
    if config_size is None or size > config_size:
        problems.append(
            f"tokenizer has {size} tokens (ids 0..{size - 1}) but config.vocab_size={config_size}: "
            "ids would fall outside the embedding"
        )
    pairs = [
        ("pad_token_id", tokenizer.pad_token_id),
        ("bos_token_id", tokenizer.bos_token_id),
        ("eos_token_id", tokenizer.eos_token_id),
        ("decoder_start_token_id", tokenizer.bos_token_id),
    ]
    for name, token_id in pairs:
        config_id = getattr(config, name, None)
        if config_id != token_id:
            which = "bos_token_id (<s>)" if name == "decoder_start_token_id" else name
            problems.append(f"config.{name}={config_id} but tokenizer {which}={token_id}")
    probe = tokenizer("a")["input_ids"]
    if not probe or probe[-1] != tokenizer.eos_token_id:
        problems.append(f"tokenizer does not append eos ({tokenizer.eos_token!r}) to encoded text: {probe}")
    if problems:
        raise ValueError("Tokenizer and model config disagree: " + "; ".join(problems) + ".")


# ------------------------------------------------------------------------------------------------ command line

CLI_DESCRIPTION = """Train one shared source+target vocabulary (BPE by default, word-pieces as an option) and save it.

Plain text files (one sentence per line, both languages):

    %(prog)s --files ../shared/data/multi30k/train.en ../shared/data/multi30k/train.de \\
        --vocab_size 37000 --model bpe --output_dir outputs/tokenizer

Or any input `load_parallel_dataset` reads (a Hub dataset, a saved dataset, parallel text / TSV / JSON lines):

    %(prog)s --dataset_name wmt14 --dataset_config_name de-en \\
        --source_lang en --target_lang de --streaming --vocab_size 37000 --output_dir outputs/tokenizer_wmt14
    %(prog)s --train_file ../shared/data/multi30k/train --source_lang en --target_lang de \\
        --vocab_size 8000 --output_dir outputs/tokenizer_multi30k

The result loads with `AutoTokenizer.from_pretrained(output_dir)`. Options are spelled as transformers'
run_translation.py spells them; the dashed spellings are accepted aliases. Defaults are `train_tokenizer`'s.
"""


def _train_from_args(args, parser) -> PreTrainedTokenizerFast:
    texts = length = None
    if not (args.dataset_name or args.train_file):  # options of a dataset would be ignored with --files alone
        given = [flag for flag, value in (("--dataset_config_name", args.dataset_config_name), ("--source_lang",
                 args.source_lang), ("--target_lang", args.target_lang), ("--streaming", args.streaming)) if value]
        if given:
            parser.error(f"{', '.join(given)} read --dataset_name or --train_file; with --files alone they would be "
                         "ignored")
    for path in args.files or ():
        if not any(line.strip() for line in iter_lines(path)):
            raise ValueError(f"{path} holds no text: a vocabulary needs sentences to learn from.")
    args.source_lang, args.target_lang = args.source_lang or "en", args.target_lang or "de"
    if args.dataset_name or args.train_file:
        dataset = load_parallel_dataset(
            dataset_name=args.dataset_name, dataset_config_name=args.dataset_config_name, train_file=args.train_file,
            source_lang=args.source_lang, target_lang=args.target_lang, streaming=args.streaming,
        )  # fmt: skip
        if "train" not in dataset:
            parser.error(f"the dataset has no 'train' split (splits: {list(dataset)})")
        texts = iter_parallel_texts(dataset, args.source_lang, args.target_lang, split="train")
        if not args.streaming:  # for the progress bar
            length = 2 * len(dataset["train"]) + sum(count_lines(f) for f in args.files or ())
    options = {k: getattr(args, k) for k in ("vocab_size", "model", "min_frequency") if getattr(args, k) is not None}
    return train_tokenizer(
        texts, files=args.files, length=length, show_progress=not args.no_progress, output_dir=args.output_dir,
        **options,
    )  # fmt: skip


def main(argv=None) -> int:
    """`vaswani-train-tokenizer` / `scripts/train_tokenizer.py`: exit status 0, or 2 with an error line."""
    parser = cli.ArgumentParser(
        description=CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", nargs="+", help="plain text files, one sentence per line")
    parser.add_argument("--dataset_name", "--dataset-name", help="Hub dataset name or a folder from save_to_disk")
    parser.add_argument("--dataset_config_name", "--dataset-config-name")
    parser.add_argument("--train_file", "--train-file", help="parallel prefix (path/train), .tsv or .jsonl")
    parser.add_argument("--source_lang", "--source-lang", help="default: en")
    parser.add_argument("--target_lang", "--target-lang", help="default: de")
    parser.add_argument("--streaming", action="store_true", help="read the dataset lazily")
    parser.add_argument("--vocab_size", "--vocab-size", type=int, help="size including the 4 special tokens")
    parser.add_argument("--model", choices=TOKENIZER_MODELS, help="bpe (paper EN-DE) or wordpiece (paper EN-FR)")
    parser.add_argument("--min_frequency", "--min-frequency", type=int)
    parser.add_argument("--output_dir", "--output-dir", required=True)
    parser.add_argument("--no_progress", "--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if not args.files and not args.dataset_name and not args.train_file:
        parser.error("give --files, --dataset_name or --train_file")
    if problem := cli.output_path_problem(args.output_dir, "--output_dir", directory=True):
        print(f"error: {problem}", file=sys.stderr)  # before training: save_pretrained only logs it
        return 2
    held = [f for f in ("config.json", "model.safetensors") if os.path.isfile(os.path.join(args.output_dir, f))]
    if held:  # its model's ids are the old tokenizer's: translations would silently be garbage
        print(f"error: --output_dir {args.output_dir} holds a model ({', '.join(held)}): a new tokenizer would replace "
              "the one it was trained with. Choose another folder.", file=sys.stderr)  # fmt: skip
        return 2
    try:
        tokenizer = _train_from_args(args, parser)
    except (ValueError, FileNotFoundError) as err:  # bad input: a clear message, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    model = type(tokenizer.backend_tokenizer.model).__name__.lower()
    print(f"Saved a {model} tokenizer with {len(tokenizer)} tokens to {args.output_dir}")
    if args.vocab_size is not None and len(tokenizer) < args.vocab_size:
        print(f"warning: {len(tokenizer)} tokens, fewer than the {args.vocab_size} asked: the text had no more "
              "merges to learn (more text, or a smaller --vocab_size).", file=sys.stderr)
    return 0


if __name__ == "__main__":  # python -m vaswani_transformer.tokenization, as the console script
    sys.exit(main())
