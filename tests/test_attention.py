"""Attention maps, pictures, the HTML page and word alignments (vaswani_transformer.attention,
scripts/plot_attention.py, scripts/align.py): the numbers against output_attentions and a float64 brute force,
alignments against pairs worked out by hand, pictures of the documented pixel sizes, the CLIs as real subprocesses,
bad input."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import vaswani_transformer  # noqa: F401
from vaswani_transformer.attention import (
    align_main,
    alignments,
    attention_maps,
    default_alignment_layer,
    pharaoh,
    plot_attention,
    plot_attention_heads,
    plot_attention_lines,
    plot_attention_main,
    sentence_alignments,
    write_attention_html,
    write_card_attention_picture,
)
from vaswani_transformer.translate import load_model_and_tokenizer

from helpers import CORPUS, SINGLE_THREAD_ENV, save_tiny_model


ROOT = Path(__file__).resolve().parents[1]
ENCODER_LAYERS, DECODER_LAYERS, HEADS = 2, 3, 2
SOURCE = "A man is riding a bicycle down the street."
TARGET = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
NON_LATIN = "Grüße aus Köln, schöne  Straße! 東京\u3000Tokio\u2009ja\u202f!"  # split characters, a double space,
# spaces of several bytes (ideographic, thin, narrow no-break) that the vocabulary splits into byte tokens


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    save_tiny_model(folder, encoder_layers=ENCODER_LAYERS, decoder_layers=DECODER_LAYERS, num_heads=HEADS)
    model, tokenizer = load_model_and_tokenizer(folder)  # sdpa, as users load it
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def own(saved):
    """The maps of SOURCE and the model's own translation."""
    folder, model, tokenizer = saved
    return attention_maps(model, tokenizer, SOURCE)


def sinusoids(length: int, d_model: int) -> torch.Tensor:
    """Section 3.5 in float64: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(0, d_model, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / d_model))
            pe[pos, i + 1] = math.cos(pos / 10000 ** (i / d_model))
    return pe


def test_maps_are_the_models_attention_probabilities(saved, own):
    folder, model, tokenizer = saved
    maps = own
    source_ids = tokenizer(SOURCE)["input_ids"]
    with torch.no_grad():  # the model's own translation: generate with its generation config, <s> dropped
        generated = model.generate(input_ids=torch.tensor([source_ids]))[0].tolist()
    assert maps.source_ids == source_ids and maps.target_ids == generated[1:]
    S, T = len(source_ids), len(maps.target_ids)
    assert maps.encoder.shape == (ENCODER_LAYERS, HEADS, S, S)
    assert maps.decoder.shape == (DECODER_LAYERS, HEADS, T, T)
    assert maps.cross.shape == (DECODER_LAYERS, HEADS, T, S)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.double().sum(-1), torch.ones(weights.shape[:-1], dtype=torch.float64))
    assert (torch.triu(maps.decoder, diagonal=1) == 0).all()  # causal: nothing from later positions
    assert (maps.decoder[..., 0, 0] == 1).all()
    assert model.config._attn_implementation == "sdpa"  # switched to eager for the pass, then back

    # Equal to output_attentions of a model loaded on eager attention, with the labels as the target.
    eager = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        labels = torch.tensor([maps.target_ids])
        out = eager(input_ids=torch.tensor([source_ids]), labels=labels, output_attentions=True)
    torch.testing.assert_close(maps.encoder, torch.stack(out.encoder_attentions)[:, 0])
    torch.testing.assert_close(maps.decoder, torch.stack(out.decoder_attentions)[:, 0])
    torch.testing.assert_close(maps.cross, torch.stack(out.cross_attentions)[:, 0])

    # Layer 0 of the encoder by brute force in float64: softmax(Q K^T / sqrt(d_k)) per head (no embedding scale here).
    x = model.model.shared.weight.double()[source_ids] + sinusoids(S, model.config.d_model)
    attn = model.model.encoder.layers[0].self_attn
    q = (x @ attn.q_proj.weight.double().T + attn.q_proj.bias.double()).view(S, HEADS, -1).transpose(0, 1)
    k = (x @ attn.k_proj.weight.double().T + attn.k_proj.bias.double()).view(S, HEADS, -1).transpose(0, 1)
    expected = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
    torch.testing.assert_close(maps.encoder[0].double(), expected, atol=1e-5, rtol=1e-4)


def test_given_target_and_readable_tokens(saved):
    folder, model, tokenizer = saved
    maps = attention_maps(model, tokenizer, NON_LATIN, target=TARGET)
    assert maps.target_ids == tokenizer(text_target=TARGET)["input_ids"]
    assert maps.decoder_input_tokens[0] == "<s>" and maps.target_tokens[-1] == maps.source_tokens[-1] == "</s>"
    assert maps.decoder_input_tokens[1:] == maps.target_tokens[:-1]
    assert maps.cross.shape[-2:] == (len(maps.target_ids), len(maps.source_ids))
    for text, tokens, words in ((NON_LATIN, maps.source_tokens, maps.source_word_ids),
                                (TARGET, maps.target_tokens, maps.target_word_ids)):  # fmt: skip
        assert "\ufffd" not in "".join(tokens)  # split characters shown whole on their first token
        # "▁" marks a space (a word start), "·" the further tokens of a split character: the text comes back.
        assert "".join(tokens[:-1]).replace("▁", " ").replace("·", "") == text
        # word ids number the words as fast_align counts them (spaces and tabs separate them, not U+3000, U+2009,
        # U+202F); the tokens of word w spell it
        split = [word for word in re.split("[ \t]", text) if word]
        assert max(w for w in words if w is not None) == len(split) - 1 and words[-1] is None
        for w, word in enumerate(split):
            spelled = "".join(t for t, i in zip(tokens, words) if i == w).replace("▁", "").replace("·", "")
            assert spelled == word
    assert {"東", "京", "\u3000"} <= set(maps.source_tokens)  # each character whole on its first token


def _word_level_tokenizer(pieces: list[str], decoder):
    """A tokenizer whose vocabulary is <pad> <s> </s> <unk> and `pieces` (ids 4...), with the `tokenizers` decoder of
    a subword convention."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *pieces])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")  # fmt: skip


def test_word_ids_and_word_starts_follow_every_subword_convention():
    """Words as text.split() counts them in the decoded text, whichever way the subwords mark them: "▁" word starts
    (SentencePiece), "##" continuations (BERT's WordPiece), "</w>" word ends (subword-nmt, fairseq's FSMT); <unk> is a
    word of its own. Before, only "Ġ"/"▁" starts and leading spaces counted: the other conventions put a whole
    sentence into word 0, and an <unk> took no word, numbering the later ones one short."""
    from tokenizers import decoders

    from vaswani_transformer.attention import readable_tokens, word_ids

    sentencepiece = _word_level_tokenizer(["▁the", "▁d", "og", "s", "▁sat", "▁.", "▁"], decoders.Metaspace())
    wordpiece = _word_level_tokenizer(["the", "d", "##og", "##s", "sat", "."], decoders.WordPiece(cleanup=False))
    subword_nmt = _word_level_tokenizer(["the</w>", "d", "og", "s</w>", "sat</w>", ".</w>"],
                                        decoders.BPEDecoder(suffix="</w>"))  # fmt: skip
    for tokenizer in (sentencepiece, wordpiece, subword_nmt):  # "the dogs sat ." and </s>
        ids = [4, 5, 6, 7, 8, 9, 2]
        assert tokenizer.decode(ids, skip_special_tokens=True).split() == ["the", "dogs", "sat", "."]
        assert word_ids(tokenizer, ids) == [0, 1, 1, 1, 2, 3, None], type(tokenizer.backend_tokenizer.decoder)
        labels = readable_tokens(tokenizer, ids)  # "▁": a space before the token in the text
        assert [label.startswith("▁") for label in labels[:-1]] == [False, True, False, False, True, True], labels
        if tokenizer is not wordpiece:  # (a lone "##og" decodes as it is)
            assert "".join(labels[:-1]).replace("▁", " ") == "the dogs sat .", labels
    # SentencePiece's "a 你 b" with 你 unknown: ▁a ▁ <unk> ▁b </s>; words a, <unk>, b
    unknown = _word_level_tokenizer(["▁a", "▁", "▁b"], decoders.Metaspace())
    assert word_ids(unknown, [4, 5, 3, 6, 2]) == [0, None, 1, 2, None]
    # the text written beside the alignments (`vaswani-align --translations_file`) is the one whose words they number:
    # its <unk> stays (decoded with skip_special_tokens, it went, and "b" was numbered 2 in a text of 2 words)
    from vaswani_transformer.attention import text_of

    assert text_of(unknown, [4, 5, 3, 6, 2]).split() == ["a", "<unk>", "b"]  # words 0, 1, 2 above
    # and words are separated by spaces and tabs alone, as fast_align separates them: a no-break space before French
    # punctuation is part of a word (Python's split made it two: indices past fast_align's words)
    french = _word_level_tokenizer(["▁est-il", "\u00a0?", "▁Quelle"], decoders.Metaspace())
    assert word_ids(french, [6, 4, 5, 2]) == [0, 1, 1, None]


# Hand-built alignment case. Source "the small house": subwords ▁the ▁sm all ▁house </s> (words 0 1 1 2 -).
# Target "das kleine Haus": subwords das ▁klein e ▁Haus </s> (words 0 1 1 2 -). Rows = target subwords.
SOURCE_WORDS = [0, 1, 1, 2, None]
TARGET_WORDS = [0, 1, 1, 2, None]
HAND = [
    [0.50, 0.10, 0.10, 0.20, 0.10],  # das: the .5, small .2, house .2
    [0.10, 0.20, 0.20, 0.35, 0.15],  # klein: best subword ▁house .35, but small gets .4 in all
    [0.10, 0.30, 0.10, 0.20, 0.30],  # e: best ▁sm .3 (</s> .3 ignored); small .4
    [0.05, 0.10, 0.10, 0.60, 0.15],  # Haus: house .6
    [0.10, 0.10, 0.10, 0.10, 0.60],  # </s>: not a word
]
# merge: word 1 (kleine) = mean of rows 1, 2 summed per source word: the .1, small .4, house .275 -> small.


@pytest.mark.parametrize("kwargs, expected", [
    ({}, "0-0 1-1 2-2"),
    ({"method": "subwords"}, "0-0 1-1 2-1 2-2"),  # klein -> house (2-1), e -> small (1-1)
    ({"threshold": 0.22}, "0-0 1-1 2-1 2-2"),  # kleine: small .4 and house .275 both >= .22
    ({"threshold": 0.7}, ""),  # no word gets that much
])  # fmt: skip
def test_alignments_of_a_hand_built_matrix(kwargs, expected):
    assert pharaoh(alignments(torch.tensor(HAND), SOURCE_WORDS, TARGET_WORDS, **kwargs)) == expected
    assert pharaoh(alignments(HAND, SOURCE_WORDS, TARGET_WORDS, **kwargs)) == expected  # nested lists too


def test_alignments_source_first_and_bad_shapes():
    # Two source words, three target words, crossing: target 0 <- source 1, targets 1, 2 <- source 0.
    matrix = [[0.2, 0.8], [0.9, 0.1], [0.6, 0.4]]
    assert alignments(matrix, [0, 1], [0, 1, 2]) == [(1, 0), (0, 1), (0, 2)]
    assert pharaoh([(1, 0), (0, 1), (0, 2)]) == "1-0 0-1 0-2"
    with pytest.raises(ValueError, match=r"shape \(3, 2\); expected \[target tokens, source tokens\] = \[2, 2\]"):
        alignments(matrix, [0, 1], [0, 1])
    with pytest.raises(ValueError, match="Unknown alignment method 'max'"):
        alignments(matrix, [0, 1], [0, 1, 2], method="max")


def test_sentence_alignments_default_to_the_penultimate_layer_mean_of_heads(own):
    assert [default_alignment_layer(n) for n in (1, 2, 3, 6)] == [0, 0, 1, 4]
    layer = DECODER_LAYERS - 2
    by_hand = alignments(own.cross[layer].mean(0), own.source_word_ids, own.target_word_ids)
    assert sentence_alignments(own) == by_hand
    assert sentence_alignments(own, layer=-1, head=1) == alignments(own.cross[-1, 1], own.source_word_ids,
                                                                    own.target_word_ids)  # fmt: skip
    words = len(SOURCE.split())
    assert by_hand and all(0 <= i < words for i, _ in by_hand)


def read_png(path):
    import matplotlib.image

    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image[..., :3].std() > 0  # something is drawn
    return image.shape[:2]  # (height, width) in pixels


def test_pictures_have_the_documented_pixel_sizes(own, tmp_path):
    maps = own
    S, T = len(maps.source_ids), len(maps.target_ids)
    # Heat map: 0.25-inch cells (at least 8 a side) + 3 inches across, + 2.5 down; 100 dpi.
    path = plot_attention(maps, tmp_path / "cross.png", "cross", 1, head=None, alignment=sentence_alignments(maps))
    assert read_png(path) == (100 * (2.5 + 0.25 * max(T, 8)), 100 * (3.0 + 0.25 * max(S, 8)))
    assert read_png(plot_attention(maps, tmp_path / "dec.png", "decoder", 0, head=1, dpi=50)) == (
        50 * (2.5 + 0.25 * max(T, 8)), 50 * (3.0 + 0.25 * max(T, 8)))  # fmt: skip
    # All heads of a layer: up to 4 panels across, each 1.3 inches + 0.16-inch cells; + 0.6 inches of title.
    path = plot_attention_heads(maps, tmp_path / "grid.png", "encoder", -1)
    assert read_png(path) == (round(100 * (0.6 + 1 * (1.3 + 0.16 * max(S, 8)))),
                              round(100 * HEADS * (1.3 + 0.16 * max(S, 8))))  # fmt: skip
    # Figure 3-5 view: 6 inches across, 1.5 + 0.25 per token of the longer side down.
    path = plot_attention_lines(maps, tmp_path / "lines.png", "cross", 0, token_index=T - 1)
    assert read_png(path) == (100 * (1.5 + 0.25 * max(S, T, 8)), 600)


def test_the_heads_of_a_layer_share_one_colour_scale(own, tmp_path):
    """A head whose weights are half another's is drawn darker: each panel was scaled to its own maximum, so both
    showed viridis' brightest yellow and the heads could not be compared."""
    import dataclasses

    import matplotlib.image

    encoder = own.encoder.clone()
    encoder[-1, 1] = encoder[-1, 0] * 0.5
    path = plot_attention_heads(dataclasses.replace(own, encoder=encoder), tmp_path / "grid.png", "encoder", -1)
    image = matplotlib.image.imread(path)[..., :3]
    yellow = (abs(image - torch.tensor([0.993, 0.906, 0.144]).numpy()).max(axis=-1) < 0.03).nonzero()[1]
    second_panel = round(100 * (1.3 + 0.16 * max(len(own.source_ids), 8)))  # x of head 1's panel, in pixels
    assert len(yellow) > 0 and yellow.max() < second_panel


def test_control_characters_in_tokens_are_drawn_escaped_without_font_warnings(own, tmp_path):
    """A byte-level token can be a control character (U+001C is even whitespace to Python): labels show it escaped,
    "\\x1c", which every font draws, instead of a missing glyph and matplotlib's warning."""
    import dataclasses
    import warnings

    maps = dataclasses.replace(own, source_tokens=["\x1c", "a\x01b", *own.source_tokens[2:]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_attention(maps, tmp_path / "cross.png", "cross", 0)
        plot_attention_lines(maps, tmp_path / "lines.png", "cross", 0, token_index=0)
    assert not [w for w in caught if "missing from font" in str(w.message)], [str(w.message) for w in caught]


def test_card_picture(saved, tmp_path):
    folder, model, tokenizer = saved
    path = write_card_attention_picture(model, tokenizer, CORPUS[2], tmp_path / "card.png")
    assert path == str(tmp_path / "card.png")
    maps = attention_maps(model, tokenizer, CORPUS[2])  # the same translation and sizes
    S, T = len(maps.source_ids), len(maps.target_ids)
    assert read_png(path) == (100 * (2.5 + 0.25 * max(T, 8)), 100 * (3.0 + 0.25 * max(S, 8)))


def page_data(page: str) -> dict:
    found = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1))


def test_html_page_holds_every_layer_and_head_and_no_url(own, tmp_path):
    maps = own
    page = Path(write_attention_html(maps, tmp_path / "a.html")).read_text(encoding="utf-8")
    assert not re.search(r"https?://", page)
    assert page.count("</script>") == 2  # the "</s>" tokens did not end the data early
    data = page_data(page)
    for kind in ("encoder", "decoder", "cross"):
        weights = torch.tensor(data["kinds"][kind]["weights"])
        assert weights.shape == maps.weights(kind).shape  # every layer and head
        torch.testing.assert_close(weights, maps.weights(kind), atol=6e-5, rtol=0)
        assert (data["kinds"][kind]["rows"], data["kinds"][kind]["columns"]) == maps.axes(kind)
    assert data["alignment"]["pharaoh"] == pharaoh(sentence_alignments(maps))


def run_script(name, *args, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **SINGLE_THREAD_ENV}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_plot_attention_cli(saved, tmp_path):
    folder, model, tokenizer = saved
    out = tmp_path / "pictures"
    done = run_script("plot_attention.py", "--model_name_or_path", folder, "--source", SOURCE, "--target", TARGET,
                      "--output_dir", out, "--kind", "cross", "--layer", "-1", "--head", "0", "--token_index", "2",
                      "--html", "--dpi", "40")  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = {"cross_layer2_heads.png", "cross_layer2_head0.png", "cross_layer2_token2_lines.png",
                "cross_alignment_layer1.png", "attention.html"}  # fmt: skip
    assert {p.name for p in out.iterdir()} == expected
    assert {Path(line).name for line in done.stdout.splitlines() if line.startswith(str(out))} == expected
    maps = attention_maps(model, tokenizer, SOURCE, TARGET)
    for name in expected - {"attention.html"}:
        read_png(out / name)
    S, T = len(maps.source_ids), len(maps.target_ids)
    assert read_png(out / "cross_layer2_head0.png") == (40 * (2.5 + 0.25 * max(T, 8)), 40 * (3.0 + 0.25 * max(S, 8)))
    torch.testing.assert_close(torch.tensor(page_data((out / "attention.html").read_text("utf-8"))["kinds"]["cross"]
                                            ["weights"]), maps.cross, atol=6e-5, rtol=0)  # fmt: skip


@pytest.mark.slow
def test_align_cli_with_targets_and_with_translations(saved, tmp_path):
    folder, model, tokenizer = saved
    sources = [SOURCE, "", CORPUS[2], NON_LATIN]
    targets = [TARGET, "", CORPUS[3], CORPUS[1]]
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt.de").write_text("\n".join(targets) + "\n", encoding="utf-8")
    done = run_script("align.py", "--model_name_or_path", folder, "--source_file", tmp_path / "src.en",
                      "--target_file", tmp_path / "tgt.de", "--output", tmp_path / "out.align",
                      "--layer", "-1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out.align").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == len(sources) + 1 and lines[1] == ""
    for source, target, line in zip(sources, targets, lines):
        if source:
            maps = attention_maps(model, tokenizer, source, target)
            assert line == pharaoh(sentence_alignments(maps, layer=-1))
            assert re.fullmatch(r"\d+-\d+( \d+-\d+)*", line)
            assert all(int(i) < len(re.split("[ \t]+", source)) and int(j) < len(re.split("[ \t]+", target))
                       for i, j in (p.split("-") for p in line.split()))  # fmt: skip
    # Without targets (the same main, in this process): the model's translations are written, and the alignments
    # index their words.
    assert align_main(["--model_name_or_path", str(folder), "--source_file", str(tmp_path / "src.en"), "--output",
                       str(tmp_path / "hyp.align"), "--translations_file", str(tmp_path / "hyp.de"),
                       "--method", "subwords"]) == 0  # fmt: skip
    translations = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")[:-1]
    lines = (tmp_path / "hyp.align").read_text(encoding="utf-8").split("\n")[:-1]
    assert lines[1] == translations[1] == "" and len(translations) == len(lines) == len(sources)
    for source, translation, line in zip(sources, translations, lines):
        if source:
            maps = attention_maps(model, tokenizer, source)
            assert translation == maps.target_text
            assert line == pharaoh(sentence_alignments(maps, method="subwords"))
            assert max(w for w in maps.target_word_ids if w is not None) == len(translation.split()) - 1


def test_bad_input_is_a_clear_error(saved, own, tmp_path, capsys):
    folder, model, tokenizer = saved
    with pytest.raises(ValueError, match=r"Token index 40 is outside the sentence: the source has \d+ tokens"):
        plot_attention_lines(own, tmp_path / "x.png", "encoder", 0, token_index=40)
    with pytest.raises(ValueError, match=r"Token index -1 is outside the sentence"):
        plot_attention_lines(own, tmp_path / "x.png", "cross", 0, token_index=-1)
    with pytest.raises(ValueError, match=r"Layer 3 does not exist: the decoder has 3 layers \(0\.\.2"):
        plot_attention(own, tmp_path / "x.png", "cross", 3)
    with pytest.raises(ValueError, match=r"Layer -3 does not exist: the encoder has 2 layers"):
        plot_attention_heads(own, tmp_path / "x.png", "encoder", -3)
    with pytest.raises(ValueError, match=r"Head 2 does not exist: the model has 2 heads"):
        sentence_alignments(own, head=2)
    with pytest.raises(ValueError, match="Unknown attention kind 'self'"):
        own.weights("self")
    with pytest.raises(ValueError, match="Alignment pair 99-0: no such source or target word"):
        plot_attention(own, tmp_path / "x.png", "cross", 0, alignment=[(0, 0), (99, 0)])
    with pytest.raises(ValueError, match="Alignment points belong on the cross"):
        plot_attention(own, tmp_path / "x.png", "encoder", 0, alignment=[(0, 0)])
    with pytest.raises(ValueError, match="source sentence is empty"):
        attention_maps(model, tokenizer, "  ")
    assert not list(tmp_path.iterdir())  # nothing half-drawn was left behind

    # The command line: a folder without its tokenizer, an unknown layer, a token index outside the sentence.
    bare = tmp_path / "no_tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(folder / name, bare / name)
    argv = ["--model_name_or_path", str(bare), "--source", SOURCE, "--output_dir", str(tmp_path / "o")]
    assert plot_attention_main(argv) == 1
    assert "missing: the tokenizer (tokenizer.json" in capsys.readouterr().err
    argv[1] = str(folder)
    assert plot_attention_main(argv + ["--layer", "7"]) == 1
    assert "error: Layer 7 does not exist: the encoder has 2 layers" in capsys.readouterr().err
    assert plot_attention_main(argv + ["--token_index", "99", "--kind", "encoder"]) == 1
    assert "error: Token index 99 is outside the sentence: the source has" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    source_file = tmp_path / "s.txt"
    source_file.write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("a\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(folder), "--source_file", str(source_file)]
    assert align_main(argv) == 1
    assert "Give --target_file (the translations to align) or --translations_file" in capsys.readouterr().err
    assert align_main(argv + ["--target_file", str(tmp_path / "t.txt")]) == 1
    assert f"{source_file} has 2 lines but {tmp_path / 't.txt'} has 1" in capsys.readouterr().err


def test_align_cli_refuses_bad_thresholds_both_target_options_and_unwritable_outputs(saved, tmp_path, capsys):
    folder, model, tokenizer = saved
    (tmp_path / "s.txt").write_text(f"{SOURCE}\n{CORPUS[2]}\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text(f"{TARGET}\n{CORPUS[3]}\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(folder), "--source_file", str(tmp_path / "s.txt")]
    with_targets = [*argv, "--target_file", str(tmp_path / "t.txt"), "--output", str(tmp_path / "out.align")]
    # --threshold is a share of the attention mass: in (0, 1] (0 would align every pair); an argparse error otherwise.
    for value in ("nan", "inf", "2", "-1", "0"):
        with pytest.raises(SystemExit) as exit_info:
            align_main([*with_targets, "--threshold", value])
        assert exit_info.value.code == 2
        assert f"argument --threshold: must be a number in (0, 1], got {value}" in capsys.readouterr().err
    # 1 is kept: only a source word receiving all of the mass.
    assert align_main([*with_targets, "--threshold", "1"]) == 0
    expected = [pharaoh(sentence_alignments(attention_maps(model, tokenizer, s, t), threshold=1.0))
                for s, t in ((SOURCE, TARGET), (CORPUS[2], CORPUS[3]))]  # fmt: skip
    assert (tmp_path / "out.align").read_text(encoding="utf-8").split("\n") == [*expected, ""]
    # Targets to align and a file for the model's own translations are one or the other.
    with pytest.raises(SystemExit) as exit_info:
        align_main([*with_targets, "--translations_file", str(tmp_path / "hyp.de")])
    assert exit_info.value.code == 2
    assert "give --target_file (the translations to align) or --translations_file" in capsys.readouterr().err
    assert not (tmp_path / "hyp.de").exists()
    # An output that cannot be written is named before the model is loaded (here: there is none to load).
    missing_model = ["--model_name_or_path", str(tmp_path / "no_model"), *argv[2:]]
    for option in ("--output", "--translations_file"):
        outputs = {"--output": str(tmp_path / "a.align"), "--translations_file": str(tmp_path / "hyp.de"),
                   option: str(tmp_path / "s.txt" / "out")}  # fmt: skip
        assert align_main([*missing_model, *(x for item in outputs.items() for x in item)]) == 1
        error = capsys.readouterr().err
        assert f"error: {option} {tmp_path / 's.txt' / 'out'}: {tmp_path / 's.txt'} is a file, not a folder." in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.align", "s.txt", "t.txt"]
