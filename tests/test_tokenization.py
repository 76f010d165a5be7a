"""Shared-vocabulary tokenizer: exact round trips, AutoTokenizer loading, </s> everywhere, config agreement, CLI."""

import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoTokenizer, MarianConfig

from vaswani_transformer import VaswaniTransformerConfig
from vaswani_transformer.tokenization import (
    WORDPIECE_CONTINUATION_PREFIX,
    check_tokenizer_matches_config,
    config_kwargs_from_tokenizer,
    expected_roundtrip,
    train_tokenizer,
)
from vaswani_transformer.textio import count_lines

REPO = Path(__file__).resolve().parents[1]

WORDS = [
    "Ein", "Mann", "fährt", "Fahrrad", "straße", "Größe", "Übung", "café", "naïve", "résumé", "señor", "ça",
    "Ærø", "Łódź", "İstanbul", "ﬁne", "the", "dog", "runs", "über", "42", "3.14", "1,000", "2017", "#tag",
    "##x", "e-mail", "O'Neil", "\"quoted\"", "(paren)", "[b]", "a/b", "x_y", "100%", "$5", "€20", "日本語",
    "Привет", "مرحبا", "😀", "–", "…", "<s>?", "&amp;",
]
PUNCT = [".", ",", "!", "?", ";", ":", " -", " ...", ""]
SPACES = [" ", " ", " ", "  ", "   ", "\t", " \t "]


def varied_sentences(n: int, seed: int) -> list[str]:
    """Sentences with accents, digits, punctuation, repeated spaces, tabs, leading/trailing blanks and emoji."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.choices(WORDS, k=rng.randint(1, 12))
        text = ""
        for i, w in enumerate(words):
            text += (rng.choice(SPACES) if i else "") + w
        text += rng.choice(PUNCT)
        if rng.random() < 0.1:
            text = rng.choice(SPACES) + text
        if rng.random() < 0.1:
            text += rng.choice(SPACES)
        out.append(text)
    return out


@pytest.fixture(scope="module", params=["bpe", "wordpiece"])
def trained(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tok_{request.param}")
    corpus = varied_sentences(400, seed=0)
    tokenizer = train_tokenizer(iter(corpus), vocab_size=600, model=request.param, min_frequency=1,
                                show_progress=False, output_dir=folder)
    return request.param, tokenizer, folder


def test_round_trip_is_exact_on_unseen_varied_text(trained):
    _, tokenizer, folder = trained
    loaded = AutoTokenizer.from_pretrained(folder)
    sentences = varied_sentences(300, seed=1)  # not the training sentences
    sentences += ["", " ", "  leading and trailing  ", "tab\there", "new\nline", "x" * 300, "#", "##", "###tag"]
    for tok in (tokenizer, loaded):
        for text in sentences:
            assert unicodedata.is_normalized("NFC", text)
            ids = tok(text)["input_ids"]
            assert tok.unk_token_id not in ids, text
            assert tok.decode(ids, skip_special_tokens=True) == text
        batch = tok(sentences)["input_ids"]
        assert tok.batch_decode(batch, skip_special_tokens=True) == sentences


def test_only_nfc_normalisation(trained):
    _, tokenizer, _ = trained
    decomposed = "Cafe\u0301 Gro\u0308\u00dfe"  # e + combining acute, o + combining diaeresis
    composed = unicodedata.normalize("NFC", decomposed)
    assert decomposed != composed and expected_roundtrip(decomposed) == composed
    ids = tokenizer(decomposed)["input_ids"]
    assert ids == tokenizer(composed)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == composed
    # nothing else is normalised: case, width and compatibility characters survive
    for text in ["ABC abc", "ﬁ ① ｆｕｌｌ", "ǅ"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_saved_tokenizer_loads_with_auto_and_appends_eos(trained):
    model, tokenizer, folder = trained
    assert sorted(os.listdir(folder)) == ["tokenizer.json", "tokenizer_config.json"]
    loaded = AutoTokenizer.from_pretrained(folder)
    assert loaded.is_fast
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token, loaded.unk_token) == ("<pad>", "<s>", "</s>", "<unk>")
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert loaded.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert len(loaded) == len(tokenizer) <= 600
    texts = ["Ein Mann fährt.", "the dog runs", ""]
    encoded = loaded(texts, text_target=["Zwei Männer", "x", "über 42"])
    for ids in encoded["input_ids"] + encoded["labels"]:
        assert ids[-1] == 2 and ids.count(2) == 1 and 1 not in ids
    assert encoded["input_ids"][2] == [2]
    # special-token strings inside the text are text: one </s>, at the end, and they decode back
    literal = loaded("a </s> b <s> <pad>")["input_ids"]
    assert literal.count(2) == 1 and literal[-1] == 2 and not {0, 1, 3} & set(literal)
    assert loaded.decode(literal, skip_special_tokens=True) == "a </s> b <s> <pad>"
    assert loaded(texts)["input_ids"] == tokenizer(texts)["input_ids"]
    target_only = loaded(text_target="Zwei Männer")["input_ids"]
    assert target_only[-1] == 2 and target_only == loaded("Zwei Männer")["input_ids"]
    if model == "wordpiece":
        pieces = loaded.convert_ids_to_tokens(loaded("Fahrradstraße")["input_ids"])
        assert any(p.startswith(WORDPIECE_CONTINUATION_PREFIX) for p in pieces)


def test_tags_added_as_tokens_encode_as_one_id_and_added_special_tokens_stay_text(trained):
    """Special tokens written in text are text (`split_special_tokens`: a literal `</s>` must not end a sentence), and
    so are special tokens added later; a tag added with `add_tokens` (e.g. a target-language tag) encodes as its id."""
    _, _, folder = trained
    tokenizer = AutoTokenizer.from_pretrained(folder)
    plain = tokenizer(" A man.")["input_ids"]  # (the text after the tag, its space included)
    tokenizer.add_tokens(["<2de>"])
    tag = tokenizer.convert_tokens_to_ids("<2de>")
    assert tag == len(tokenizer) - 1 and tokenizer("<2de> A man.")["input_ids"] == [tag] + plain
    tokenizer.add_special_tokens({"additional_special_tokens": ["<2fr>"]})
    special = tokenizer.convert_tokens_to_ids("<2fr>")
    encoded = tokenizer("<2fr> A man.")["input_ids"]
    assert special not in encoded and tokenizer.decode(encoded, skip_special_tokens=True) == "<2fr> A man."


def test_vocab_size_is_respected_for_both_models(tmp_path):
    corpus = varied_sentences(300, seed=2)
    for model, size in (("bpe", 300), ("wordpiece", 600)):
        tok = train_tokenizer(corpus, vocab_size=size, model=model, min_frequency=1, show_progress=False)
        assert len(tok) == size
        assert sorted(tok.get_vocab().values()) == list(range(size))
    with pytest.raises(ValueError, match="vocab_size=100 is too small for bpe: .* need 260"):
        train_tokenizer(corpus, vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size=400 is too small for wordpiece: .* need 516"):
        train_tokenizer(corpus, vocab_size=400, model="wordpiece", show_progress=False)
    with pytest.raises(ValueError, match="Unknown tokenizer model 'unigram'"):
        train_tokenizer(corpus, vocab_size=300, model="unigram", show_progress=False)


DETERMINISM_SCRIPT = """
import random, sys
from vaswani_transformer.tokenization import train_tokenizer
rng = random.Random(0)
syllables = ["ka", "to", "ri", "men", "sa", "lo", "vi", "der", "un", "ba", "ge", "ist", "ch", "au", "el", "ne", "ß"]
words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
weights = [1 / (i + 1) for i in range(len(words))]
texts = [" ".join(rng.choices(words, weights, k=rng.randint(3, 12))) for _ in range(4000)]
tokenizer = train_tokenizer(texts, vocab_size=1000, model=sys.argv[1], show_progress=False)
sys.stdout.write(tokenizer.backend_tokenizer.to_str())
"""


def test_the_same_corpus_trains_the_same_word_piece_tokenizer_in_every_process():
    """Word pieces were numbered in a hash map's order (tokenizers issue #1794), which breaks ties between equally
    frequent merges: each process (another PYTHONHASHSEED) trained another vocabulary, so a run was not reproducible.
    (BPE numbers its pieces in a fixed order.)"""
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
        result = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, "wordpiece"], capture_output=True, text=True,
                                env=env, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_training_from_files_streams_lines_and_reports_bad_utf8(tmp_path):
    en, de = tmp_path / "train.en", tmp_path / "train.de"
    en.write_text("\n".join(varied_sentences(50, seed=3)) + "\n", encoding="utf-8")
    de.write_text("\n".join(varied_sentences(50, seed=4)), encoding="utf-8")  # no final newline
    assert count_lines(en) == count_lines(de) == 50
    tok = train_tokenizer(files=[en, de], vocab_size=400, min_frequency=1, show_progress=False)
    for text in varied_sentences(20, seed=5):
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text

    bad = tmp_path / "bad.de"
    bad.write_bytes("gut\nauch gut\n".encode() + b"kaputt \xff\xfe\n")
    with pytest.raises(ValueError, match=r"bad\.de:3: invalid UTF-8"):
        train_tokenizer(files=[en, bad], vocab_size=400, show_progress=False)
    with pytest.raises(FileNotFoundError, match="missing.en"):
        train_tokenizer(files=[tmp_path / "missing.en"], vocab_size=400, show_progress=False)
    # a pipe (`--files <(cat train.en)`) or a folder exists: "not found" was the wrong reason
    os.mkfifo(tmp_path / "pipe.en")
    for path in (tmp_path / "pipe.en", tmp_path):
        with pytest.raises(ValueError, match=f"{path} is not a regular file \\(a pipe or a folder\\)"):
            train_tokenizer(files=[en, path], vocab_size=400, show_progress=False)


def test_check_tokenizer_matches_config(trained):
    _, tok, _ = trained
    n = len(tok)
    config = VaswaniTransformerConfig(**config_kwargs_from_tokenizer(tok))
    assert config.vocab_size == n
    check_tokenizer_matches_config(tok, config)
    check_tokenizer_matches_config(tok, VaswaniTransformerConfig(vocab_size=n + 8))  # padded vocab: fine
    check_tokenizer_matches_config(tok, MarianConfig(vocab_size=n, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                     decoder_start_token_id=1))
    with pytest.raises(ValueError, match=f"tokenizer has {n} tokens .* config.vocab_size={n - 1}"):
        check_tokenizer_matches_config(tok, VaswaniTransformerConfig(vocab_size=n - 1))
    bad = VaswaniTransformerConfig(vocab_size=n, pad_token_id=5, eos_token_id=0)
    with pytest.raises(ValueError) as err:
        check_tokenizer_matches_config(tok, bad)
    assert "config.pad_token_id=5 but tokenizer pad_token_id=0" in str(err.value)
    assert "config.eos_token_id=0 but tokenizer eos_token_id=2" in str(err.value)
    with pytest.raises(ValueError, match=r"config.decoder_start_token_id=2 but tokenizer bos_token_id \(<s>\)=1"):
        check_tokenizer_matches_config(tok, VaswaniTransformerConfig(vocab_size=n, decoder_start_token_id=2))


def _run_cli(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_CACHE": str(cwd / "hf_datasets")}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "train_tokenizer.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_trains_from_files_and_from_parallel_data(tmp_path):
    (tmp_path / "train.en").write_text("\n".join(varied_sentences(60, seed=6)) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(varied_sentences(60, seed=7)) + "\n", encoding="utf-8")
    result = _run_cli("--files", "train.en", "train.de", "--vocab-size", "600", "--model", "wordpiece",
                      "--min-frequency", "1", "--output-dir", "tok", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Saved a wordpiece tokenizer with 600 tokens" in result.stdout
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    text = varied_sentences(1, seed=8)[0]
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text

    # canonical spellings (run_translation's); the call above uses the dashed aliases
    result = _run_cli("--train_file", "train", "--source_lang", "en", "--target_lang", "de", "--vocab_size", "400",
                      "--min_frequency", "1", "--output_dir", "tok_bpe", "--no_progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Saved a bpe tokenizer with 400 tokens" in result.stdout
    assert AutoTokenizer.from_pretrained(tmp_path / "tok_bpe")(text)["input_ids"][-1] == 2

    (tmp_path / "short.de").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "short.en").write_text("one\n", encoding="utf-8")
    result = _run_cli("--train_file", "short", "--vocab-size", "400", "--output-dir", "tok2", cwd=tmp_path)
    assert result.returncode == 2
    assert "short.en has 1 lines" in result.stderr and "short.de has 2 lines" in result.stderr
    assert "Traceback" not in result.stderr

    # an empty corpus, dataset options beside --files alone, a vocabulary smaller than asked: said (before, the first
    # two gave a bytes-only or an unchanged tokenizer and the last only its count, all with status 0)
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    result = _run_cli("--files", "blank.txt", "--output-dir", "tok3", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == "error: blank.txt holds no text: a vocabulary needs " \
        "sentences to learn from.", result.stderr
    result = _run_cli("--files", "train.en", "--target_lang", "fr", "--streaming", "--output-dir", "tok3", cwd=tmp_path)
    assert result.returncode == 2 and "--target_lang, --streaming read --dataset_name or --train_file; with --files " \
        "alone they would be ignored" in result.stderr
    result = _run_cli("--files", "short.de", "--vocab_size", "8000", "--output-dir", "tok3", "--no_progress",
                      cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0 and "fewer than the 8000 asked" in result.stderr, result.stderr

    # an output folder that is a file: named before training (save_pretrained would only log it, saving nothing)
    result = _run_cli("--files", "train.en", "--vocab-size", "400", "--output-dir", "short.de", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == "error: --output_dir short.de is a file, not a folder."
    assert "Saved" not in result.stdout and (tmp_path / "short.de").read_text(encoding="utf-8") == "eins\nzwei\n"
    # a model's folder: its tokenizer would be replaced, and the model would translate garbage without a word
    (tmp_path / "tok_bpe" / "config.json").write_text("{}", encoding="utf-8")
    before = (tmp_path / "tok_bpe" / "tokenizer.json").read_bytes()
    result = _run_cli("--files", "train.en", "--vocab-size", "400", "--output-dir", "tok_bpe", cwd=tmp_path)
    assert result.returncode == 2 and "holds a model (config.json): a new tokenizer would replace" in result.stderr
    assert (tmp_path / "tok_bpe" / "tokenizer.json").read_bytes() == before
