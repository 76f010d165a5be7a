"""Looking at attention: the numbers, the pictures (heat maps, the paper's Figure 3-5 view, an HTML page) and word
alignments from encoder-decoder attention.

- `attention_maps(model, tokenizer, source, target=None)` runs one teacher-forced forward pass with
  `output_attentions=True` on eager attention over the given pair, or over the model's own translation of `source`
  decoded with its generation config (for our models the paper's beam search), and returns an `AttentionMaps`:
  readable subword tokens and three tensors, encoder self [layers, heads, S, S], decoder self [layers, heads, T, T]
  and encoder-decoder ("cross") [layers, heads, T, S], each row a probability distribution.
- `plot_attention` (one head or the mean of heads, optionally with alignment points), `plot_attention_heads` (all
  heads of one layer), `plot_attention_lines` (Figures 3-5: lines from one token to those it attends to, one colour
  per head) write PNGs with matplotlib (imported inside the functions); `write_attention_html` writes one
  self-contained page with every layer and head.
- `alignments(cross_attention, source_word_ids, target_word_ids)` turns a [T, S] cross-attention matrix into word
  alignments, written by `pharaoh` as `i-j` pairs (source word first, as fast_align writes them).

Attention weights show where a head looked, not why the model decided: they are not a faithful explanation of its
predictions (Jain & Wallace 2019; Serrano & Smith 2019).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import cli


KINDS = ("encoder", "decoder", "cross")
KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "encoder-decoder attention"}  # fmt: skip
READABLE_WORD_START = "\u2581"  # "▁": shown in front of a subword that starts a word
CONTINUED_BYTES = "\u00b7"  # "·": the further tokens of a character split across byte-level tokens
VISIBLE_WHITESPACE = str.maketrans({" ": READABLE_WORD_START, "\t": "\u21e5", "\n": "\u21b5", "\r": "\u21b5"})
MAX_LABEL_CHARS = 14
ALIGNMENT_METHODS = ("merge", "subwords")

# Picture sizes, in inches (pixels = inches x dpi): square cells, room for labels, at least 8 cells a side.
CELL_INCHES, MIN_CELLS = 0.25, 8
HEATMAP_EXTRA_WIDTH, HEATMAP_EXTRA_HEIGHT = 3.0, 2.5  # labels + colour bar, labels + title
GRID_CELL_INCHES, GRID_PANEL_EXTRA, GRID_COLUMNS, GRID_TITLE_INCHES = 0.16, 1.3, 4, 0.6
LINES_WIDTH_INCHES, LINES_ROW_INCHES, LINES_EXTRA_HEIGHT = 6.0, 0.25, 1.5
# Fonts with wide Unicode coverage, in order of preference; matplotlib falls back along the list per character.
FONT_PREFERENCE = ("DejaVu Sans", "Noto Sans", "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans Arabic",
                   "Noto Sans Devanagari", "Arial Unicode MS")  # fmt: skip


# ------------------------------------------------------------------------------------------------ the numbers


@dataclass
class AttentionMaps:
    """The attention of one sentence pair (float32 tensors on the CPU; every row sums to 1).

    encoder [layers, heads, S, S]: rows and columns `source_tokens`.
    decoder [layers, heads, T, T]: rows and columns `decoder_input_tokens` (`<s>` then the target shifted right: row t
        reads `decoder_input_tokens[t]`; the causal mask makes it lower-triangular).
    cross [layers, heads, T, S]: row t is the step that outputs `target_tokens[t]` (alignments use this convention,
        as fairseq's do), columns `source_tokens`.
    `*_word_ids` give the word of each token, words separated by spaces and tabs as fast_align separates them (None
    for special tokens and tokens of spaces alone); `target_text` is the text whose words they number.
    """

    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor
    source_ids: list[int]
    target_ids: list[int]
    source_word_ids: list[int | None]
    target_word_ids: list[int | None]
    source_text: str
    target_text: str

    def weights(self, kind: str) -> torch.Tensor:
        """The [layers, heads, rows, columns] tensor of `kind` ("encoder", "decoder" or "cross")."""
        return getattr(self, check_kind(kind))

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row tokens, column tokens) of `kind`."""
        kind = check_kind(kind)
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.decoder_input_tokens, self.decoder_input_tokens
        return self.target_tokens, self.source_tokens

    def head(self, kind: str, layer: int, head: int | None = None) -> torch.Tensor:
        """[rows, columns] weights of one head of one layer, or the mean of its heads (head=None)."""
        weights = self.weights(kind)
        layer = check_layer(layer, weights.shape[0], kind)
        if head is None:
            return weights[layer].mean(dim=0)
        return weights[layer, check_head(head, weights.shape[1])]


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"Unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}.")
    return kind


def check_layer(layer: int, num_layers: int, kind: str = "cross") -> int:
    """`layer` as an index 0..num_layers-1 (negative counts from the last); ValueError naming the valid ones."""
    if not isinstance(layer, int) or not -num_layers <= layer < num_layers:
        side = "decoder" if kind in ("decoder", "cross") else "encoder"
        raise ValueError(f"Layer {layer} does not exist: the {side} has {num_layers} layers (0..{num_layers - 1}, "
                         f"or -{num_layers}..-1 counting from the last).")  # fmt: skip
    return layer % num_layers


def check_head(head: int, num_heads: int) -> int:
    if not isinstance(head, int) or not 0 <= head < num_heads:
        raise ValueError(f"Head {head} does not exist: the model has {num_heads} heads (0..{num_heads - 1}).")
    return head


def check_token_index(index: int, length: int, side: str) -> int:
    if not isinstance(index, int) or not 0 <= index < length:
        raise ValueError(f"Token index {index} is outside the sentence: the {side} has {length} tokens "
                         f"(indices 0..{length - 1}).")  # fmt: skip
    return index


def default_alignment_layer(num_layers: int) -> int:
    """The penultimate decoder layer (the only one of a 1-layer decoder): Garg et al. (2019) found the mean of the
    heads of the penultimate layer of a 6-layer Transformer gave the best alignments of all layers."""
    return max(num_layers - 2, 0)


def _lone_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def _character_spans(tokenizer, ids: Sequence[int]) -> list[tuple[int, int, str]]:
    """(start, end, text) for consecutive tokens: one token decoded alone, except that a token which alone decodes to
    U+FFFD (part of a character split across byte-level tokens) is joined with the next ones until they decode to
    whole characters; special tokens stay alone."""
    special = set(tokenizer.all_special_ids)
    pieces = _lone_pieces(tokenizer, ids)
    spans, i = [], 0
    while i < len(ids):
        span = (i, i + 1, pieces[i])
        if ids[i] not in special and "\ufffd" in pieces[i]:
            for j in range(i + 2, len(ids) + 1):
                if ids[j - 1] in special:
                    break
                whole = tokenizer.decode(ids[i:j], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                if "\ufffd" not in whole:
                    span = (i, j, whole)
                    break
        spans.append(span)
        i = span[1]
    return spans


def readable_tokens(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id decoded alone, special tokens as they are (`</s>`), "▁" where a space comes before it in the text:
    a subword that starts a word after the first is shown as "▁word" (whichever way the tokenizer marks words, see
    `word_ids`), whitespace alone made visible.

    A character split across byte-level tokens (each alone decodes to U+FFFD) is shown whole on the first of them and
    as "·" on the others."""
    ids = list(ids)
    special = _special_ids(tokenizer)
    labels, previous, after_space = [], None, False
    for (start, end, piece), word in _spans_and_words(tokenizer, ids):
        if ids[start] in special:
            labels.append(piece)
        elif not piece.strip():
            labels.append(piece.translate(VISIBLE_WHITESPACE))
        else:
            spaced = piece[:1].isspace() or (word != previous and previous is not None and not after_space)
            labels.append(READABLE_WORD_START + piece.lstrip() if spaced else piece)
            previous = word
        if ids[start] not in special:
            after_space = piece[-1:].isspace()
        labels.extend([CONTINUED_BYTES] * (end - start - 1))
    return labels


# fast_align, and the Pharaoh files read with it, separate words by spaces and tabs only (its `Dict::is_ws`): a
# no-break space before French punctuation, or U+3000, is part of a word
FAST_ALIGN_SPACE = " \t"


def fast_align_words(text: str) -> list[str]:
    """The words of a line as fast_align counts them: separated by runs of spaces and tabs."""
    return re.split(f"[{FAST_ALIGN_SPACE}]+", text.strip(FAST_ALIGN_SPACE)) if text.strip(FAST_ALIGN_SPACE) else []


def word_ids(tokenizer, ids: Sequence[int]) -> list[int | None]:
    """The word (0, 1, ...) each token belongs to, words as fast_align counts them in the decoded text
    (`fast_align_words`): a token is in the last word of the text decoded from the tokens up to it, so every way of
    marking words counts ("Ġ"/"▁" starts, "##"/"@@" continuations, "</w>" ends). Special tokens other than <unk> (a
    word of its own) and tokens of spaces and tabs alone get None. The tokens of a character split across byte-level
    tokens count as one."""
    ids = list(ids)
    result: list[int | None] = []
    for (start, end, _), word in _spans_and_words(tokenizer, ids):
        result.extend([word] * (end - start))
    return result


def text_of(tokenizer, ids: Sequence[int]) -> str:
    """The text of `ids` whose words `word_ids` numbers: special tokens left out but <unk>, which is a word (decoding
    with `skip_special_tokens` dropped it, and the words after it were numbered one too far)."""
    special = _special_ids(tokenizer)
    return tokenizer.decode([i for i in ids if i not in special], skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)  # fmt: skip


def _special_ids(tokenizer) -> set[int]:
    """The special tokens' ids but <unk>'s, which stands for a word of the text."""
    return set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}


def _spans_and_words(tokenizer, ids: list[int]) -> list[tuple[tuple[int, int, str], int | None]]:
    """`_character_spans` with the word of each (None for special and whitespace-only ones): the last word of the
    text decoded from the tokens up to the span's end (a decoder may mark words however it likes)."""
    special = _special_ids(tokenizer)
    text_ids, result = [], []
    for start, end, piece in _character_spans(tokenizer, ids):
        if ids[start] in special:
            result.append(((start, end, piece), None))
            continue
        text_ids.extend(ids[start:end])
        if not piece.strip(FAST_ALIGN_SPACE):
            result.append(((start, end, piece), None))
            continue
        text = tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        result.append(((start, end, piece), max(len(fast_align_words(text)) - 1, 0)))
    return result


def attention_maps(model, tokenizer, source: str, target: str | None = None, **generate_kwargs) -> AttentionMaps:
    """The attention of `source` and its translation (`target`, or the model's own: `model.generate` with its
    generation config updated by `generate_kwargs`), from one teacher-forced forward pass with
    `output_attentions=True` on eager attention (the model's attention implementation is restored afterwards)."""
    from .pipeline import source_length_limit

    if not isinstance(source, str) or not source.strip():
        raise ValueError("The source sentence is empty: there is no attention to look at.")
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise ValueError("The target sentence is empty; give a sentence or leave it out to translate the source.")
    config = model.config
    source_ids = tokenizer(source)["input_ids"]
    limit = source_length_limit(config)
    if limit is not None and len(source_ids) > limit:
        raise ValueError(f"The source has {len(source_ids)} tokens, more than the model's {limit} positions.")
    device = model.device
    input_ids = torch.tensor([source_ids], device=device)
    attention_mask = torch.ones_like(input_ids)
    was_training = model.training
    model.eval()
    try:
        if target is None:
            with torch.inference_mode():
                output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
            target_ids = output[0].tolist()
            if target_ids and target_ids[0] == config.decoder_start_token_id:
                target_ids = target_ids[1:]
            while target_ids and target_ids[-1] == config.pad_token_id != config.eos_token_id:
                target_ids.pop()
            if not target_ids:
                raise ValueError("The model produced an empty translation.")
        else:
            target_ids = tokenizer(text_target=target)["input_ids"]
        if limit is not None and len(target_ids) > limit:
            raise ValueError(f"The target has {len(target_ids)} tokens, more than the model's {limit} positions.")
        decoder_input_ids = [config.decoder_start_token_id] + target_ids[:-1]  # the labels shifted right
        encoder, decoder, cross = _eager_attentions(model, input_ids, attention_mask, decoder_input_ids)
    finally:
        model.train(was_training)
    return AttentionMaps(
        source_tokens=readable_tokens(tokenizer, source_ids),
        target_tokens=readable_tokens(tokenizer, target_ids),
        decoder_input_tokens=readable_tokens(tokenizer, decoder_input_ids),
        encoder=encoder, decoder=decoder, cross=cross,
        source_ids=list(source_ids), target_ids=list(target_ids),
        source_word_ids=word_ids(tokenizer, source_ids), target_word_ids=word_ids(tokenizer, target_ids),
        source_text=source, target_text=text_of(tokenizer, target_ids),
    )  # fmt: skip


def _eager_attentions(model, input_ids, attention_mask, decoder_input_ids):
    """(encoder, decoder, cross) attention tensors [layers, heads, rows, columns] of one forward pass on eager
    attention (sdpa and flash kernels do not return the weights)."""
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            outputs = model(input_ids=input_ids, attention_mask=attention_mask,
                            decoder_input_ids=torch.tensor([decoder_input_ids], device=input_ids.device),
                            output_attentions=True, use_cache=False, return_dict=True)  # fmt: skip
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)

    def stack(layers) -> torch.Tensor:
        return torch.stack([layer[0] for layer in layers]).float().cpu()

    return stack(outputs.encoder_attentions), stack(outputs.decoder_attentions), stack(outputs.cross_attentions)


# ------------------------------------------------------------------------------------------------- alignments


def alignments(
    cross_attention,
    source_word_ids: Sequence[int | None],
    target_word_ids: Sequence[int | None],
    *,
    method: str = "merge",
    threshold: float | None = None,
) -> list[tuple[int, int]]:
    """Word alignments (source word, target word) from a [T, S] cross-attention matrix, ordered by target word.

    `source_word_ids` (length S) and `target_word_ids` (length T) give each subword's word; None (special tokens such
    as `</s>`, whitespace) takes part in nothing. Row t of the matrix belongs to target token t.
    method "merge" (default): a word's attention is the sum over its source subwords (the probability mass the word
        receives) and the mean over its target subwords; each target word is aligned to its argmax source word, or
        with `threshold` to every source word receiving at least that mass (then possibly none).
    method "subwords": the common practice of Garg et al. (2019) and fairseq: each target subword is aligned to its
        argmax source subword (or to all at least `threshold`), and two words are aligned when any of their subwords
        are.
    Ties go to the first source word.
    """
    if method not in ALIGNMENT_METHODS:
        raise ValueError(f"Unknown alignment method {method!r}; choose one of {', '.join(ALIGNMENT_METHODS)}.")
    matrix = torch.as_tensor(cross_attention, dtype=torch.float64)
    if matrix.dim() != 2 or matrix.shape != (len(target_word_ids), len(source_word_ids)):
        raise ValueError(f"cross_attention has shape {tuple(matrix.shape)}; expected [target tokens, source tokens] "
                         f"= [{len(target_word_ids)}, {len(source_word_ids)}].")  # fmt: skip
    source_cols = [s for s, w in enumerate(source_word_ids) if w is not None]
    target_rows = [t for t, w in enumerate(target_word_ids) if w is not None]
    if not source_cols or not target_rows:
        return []
    pairs: set[tuple[int, int]] = set()
    if method == "subwords":
        for t in target_rows:
            row = matrix[t, source_cols]
            chosen = [int(row.argmax())] if threshold is None else (row >= threshold).nonzero().flatten().tolist()
            pairs.update((source_word_ids[source_cols[c]], target_word_ids[t]) for c in chosen)
    else:
        source_words = sorted({source_word_ids[s] for s in source_cols})
        target_words = sorted({target_word_ids[t] for t in target_rows})
        mass = torch.stack([matrix[:, [s for s in source_cols if source_word_ids[s] == w]].sum(dim=1)
                            for w in source_words], dim=1)  # fmt: skip
        for word in target_words:
            row = mass[[t for t in target_rows if target_word_ids[t] == word]].mean(dim=0)
            chosen = [int(row.argmax())] if threshold is None else (row >= threshold).nonzero().flatten().tolist()
            pairs.update((source_words[c], word) for c in chosen)
    return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


def sentence_alignments(
    maps: AttentionMaps, layer: int | None = None, head: int | None = None, **kwargs
) -> list[tuple[int, int]]:
    """`alignments` of one sentence pair from its cross-attention: the mean of the heads (or one `head`) of `layer`
    (default: `default_alignment_layer`, the penultimate decoder layer)."""
    if layer is None:
        layer = default_alignment_layer(maps.cross.shape[0])
    return alignments(maps.head("cross", layer, head), maps.source_word_ids, maps.target_word_ids, **kwargs)


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """Pharaoh format: "i-j" per pair, source word i and target word j (0-based), space-separated."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


# ----------------------------------------------------------------------------------------------------- pictures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def font_family() -> list[str]:
    """The installed fonts of `FONT_PREFERENCE` (DejaVu Sans covers Latin, Greek, Cyrillic, Hebrew, Arabic and
    more; a Noto CJK font, where installed, covers Chinese and Japanese), then "sans-serif"."""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return [name for name in FONT_PREFERENCE if name in installed] + ["sans-serif"]


def _label(token: str) -> str:
    """A token as a picture's label: control characters escaped ("\\x1c": no font draws them), long ones cut."""
    token = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in token)
    return token if len(token) <= MAX_LABEL_CHARS else token[: MAX_LABEL_CHARS - 1] + "\u2026"


def heatmap_size(rows: int, columns: int) -> tuple[float, float]:
    """(width, height) in inches of `plot_attention`'s picture: 0.25-inch cells (at least 8 a side), plus 3 inches
    of labels and colour bar across and 2.5 of labels and title down."""
    return (HEATMAP_EXTRA_WIDTH + CELL_INCHES * max(columns, MIN_CELLS),
            HEATMAP_EXTRA_HEIGHT + CELL_INCHES * max(rows, MIN_CELLS))  # fmt: skip


def _draw_heatmap(ax, weights: torch.Tensor, rows: list[str], columns: list[str], fontsize: float,
                  vmax: float | None = None):
    """Weights as colours from 0 to `vmax` (default their maximum)."""
    vmax = float(weights.max()) if vmax is None else vmax
    image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=max(vmax, 1e-9),
                      aspect="auto", interpolation="nearest")  # fmt: skip
    ax.set_xticks(range(len(columns)), [_label(t) for t in columns], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(rows)), [_label(t) for t in rows], fontsize=fontsize)
    ax.tick_params(length=0)
    return image


def _title(maps: AttentionMaps, kind: str, layer: int, head: int | None) -> str:
    num_layers = maps.weights(kind).shape[0]
    which = "mean of heads" if head is None else f"head {head}"
    return f"{KIND_TITLES[kind]}, layer {layer} (of 0..{num_layers - 1}), {which}"


def plot_attention(
    maps: AttentionMaps,
    output_path: str | os.PathLike,
    kind: str = "cross",
    layer: int = -1,
    head: int | None = None,
    alignment: Sequence[tuple[int, int]] | None = None,
    dpi: int = 100,
) -> str:
    """Heat map of one head (or the mean of the heads, head=None) of one layer, queries down, keys across, tokens on
    both axes; `alignment` pairs (cross attention only) are framed on it. Size `heatmap_size` x `dpi` pixels, fonts
    from `font_family` (readable non-Latin scripts). Returns the path written."""
    plt = _pyplot()
    weights = maps.head(kind, layer, head)
    layer = check_layer(layer, maps.weights(kind).shape[0], kind)
    rows, columns = maps.axes(kind)
    if alignment is not None and kind != "cross":
        raise ValueError("Alignment points belong on the cross (encoder-decoder) attention.")
    blocks = [_word_block(maps, source_word, target_word) for source_word, target_word in alignment or ()]
    width, height = heatmap_size(len(rows), len(columns))
    with plt.rc_context({"font.family": font_family()}):
        fig = plt.figure(figsize=(width, height), dpi=dpi)
        left, bottom = 1.6 / width, 1.6 / height  # 1.6 inches of labels left of and below the cells
        ax = fig.add_axes((left, bottom, CELL_INCHES * len(columns) / width, CELL_INCHES * len(rows) / height))
        image = _draw_heatmap(ax, weights, rows, columns, fontsize=7)
        cax = fig.add_axes((left + (CELL_INCHES * len(columns) + 0.2) / width, bottom, 0.15 / width,
                            CELL_INCHES * len(rows) / height))  # fmt: skip
        fig.colorbar(image, cax=cax)
        ax.set_xlabel("source" if kind != "decoder" else "target (decoder input)", fontsize=8)
        ax.set_ylabel({"encoder": "source", "decoder": "target (decoder input)", "cross": "target (output)"}[kind],
                      fontsize=8)  # fmt: skip
        fig.text(0.5, 1 - 0.35 / height, _title(maps, kind, layer, head), ha="center", va="top", fontsize=10)
        from matplotlib.patches import Rectangle

        for x, y, w, h in blocks:  # a red frame around the cells of each aligned pair of words
            ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor="red", linewidth=1.5))
        fig.savefig(output_path, dpi=dpi)
        plt.close(fig)
    return str(output_path)


def _word_block(maps: AttentionMaps, source_word: int, target_word: int) -> tuple[float, float, int, int]:
    """(x, y, width, height) in cells of the block of an aligned (source word, target word) pair."""
    columns = [s for s, w in enumerate(maps.source_word_ids) if w == source_word]
    rows = [t for t, w in enumerate(maps.target_word_ids) if w == target_word]
    if not columns or not rows:
        raise ValueError(f"Alignment pair {source_word}-{target_word}: no such source or target word.")
    return min(columns) - 0.5, min(rows) - 0.5, max(columns) - min(columns) + 1, max(rows) - min(rows) + 1


def heads_grid_size(num_heads: int, rows: int, columns: int) -> tuple[float, float]:
    """(width, height) in inches of `plot_attention_heads`: up to 4 panels across, each 1.3 inches of labels plus
    0.16-inch cells (at least 8 a side), and 0.6 inches of title."""
    across = min(num_heads, GRID_COLUMNS)
    down = math.ceil(num_heads / GRID_COLUMNS)
    return (across * (GRID_PANEL_EXTRA + GRID_CELL_INCHES * max(columns, MIN_CELLS)),
            GRID_TITLE_INCHES + down * (GRID_PANEL_EXTRA + GRID_CELL_INCHES * max(rows, MIN_CELLS)))  # fmt: skip


def plot_attention_heads(
    maps: AttentionMaps, output_path: str | os.PathLike, kind: str = "encoder", layer: int = -1, dpi: int = 100
) -> str:
    """All heads of one layer as a grid of heat maps (size `heads_grid_size` x `dpi` pixels) on one colour scale, 0 to
    the layer's largest weight (named in the title), so that heads compare; returns the path."""
    plt = _pyplot()
    weights = maps.weights(kind)
    layer = check_layer(layer, weights.shape[0], kind)
    num_heads = weights.shape[1]
    rows, columns = maps.axes(kind)
    width, height = heads_grid_size(num_heads, len(rows), len(columns))
    panel_width = GRID_PANEL_EXTRA + GRID_CELL_INCHES * max(len(columns), MIN_CELLS)
    panel_height = GRID_PANEL_EXTRA + GRID_CELL_INCHES * max(len(rows), MIN_CELLS)
    with plt.rc_context({"font.family": font_family()}):
        fig = plt.figure(figsize=(width, height), dpi=dpi)
        for head in range(num_heads):
            x0 = (head % GRID_COLUMNS) * panel_width + 1.0  # 1 inch of labels left of each panel's cells
            y0 = height - GRID_TITLE_INCHES - (head // GRID_COLUMNS + 1) * panel_height + 1.0
            ax = fig.add_axes((x0 / width, y0 / height, GRID_CELL_INCHES * len(columns) / width,
                               GRID_CELL_INCHES * len(rows) / height))  # fmt: skip
            _draw_heatmap(ax, weights[layer, head], rows, columns, fontsize=5.5, vmax=float(weights[layer].max()))
            ax.set_title(f"head {head}", fontsize=7, pad=2)
        fig.text(0.5, 1 - 0.2 / height, f"{KIND_TITLES[kind]}, layer {layer} (of 0..{weights.shape[0] - 1}), all "
                 f"heads; colours 0 to {float(weights[layer].max()):.2f}", ha="center", va="top", fontsize=10)
        fig.savefig(output_path, dpi=dpi)
        plt.close(fig)
    return str(output_path)


def lines_size(rows: int, columns: int) -> tuple[float, float]:
    """(width, height) in inches of `plot_attention_lines`: 6 inches across, 0.25 inches per token of the longer
    side (at least 8) plus 1.5 down."""
    return LINES_WIDTH_INCHES, LINES_EXTRA_HEIGHT + LINES_ROW_INCHES * max(rows, columns, MIN_CELLS)


def plot_attention_lines(
    maps: AttentionMaps,
    output_path: str | os.PathLike,
    kind: str = "encoder",
    layer: int = -1,
    token_index: int = 0,
    heads: Sequence[int] | None = None,
    dpi: int = 100,
) -> str:
    """The paper's Figures 3-5: the tokens twice, queries on the left and keys on the right, and a line from token
    `token_index` to every token it attends to, one colour per head (all heads, or `heads`), opacity = weight.
    Size `lines_size` x `dpi` pixels; returns the path."""
    plt = _pyplot()
    weights = maps.weights(kind)
    layer = check_layer(layer, weights.shape[0], kind)
    rows, columns = maps.axes(kind)
    side = {"encoder": "source", "decoder": "target (decoder input)", "cross": "target"}[kind]
    token_index = check_token_index(token_index, len(rows), side)
    heads = list(range(weights.shape[1])) if heads is None else [check_head(h, weights.shape[1]) for h in heads]
    width, height = lines_size(len(rows), len(columns))
    colours = plt.get_cmap("tab10" if len(heads) <= 10 else "tab20")
    with plt.rc_context({"font.family": font_family()}):
        fig = plt.figure(figsize=(width, height), dpi=dpi)
        ax = fig.add_axes((0, 0.5 / height, 1, 1 - 1.3 / height))
        ax.set_xlim(0, 1)
        count = max(len(rows), len(columns))
        ax.set_ylim(count - 0.5, -0.5)
        ax.axis("off")
        for i, token in enumerate(rows):
            ax.text(0.3, i, _label(token), ha="right", va="center", fontsize=8,
                    fontweight="bold" if i == token_index else "normal",
                    bbox={"facecolor": "#ffe680", "edgecolor": "none"} if i == token_index else None)  # fmt: skip
        for j, token in enumerate(columns):
            ax.text(0.7, j, _label(token), ha="left", va="center", fontsize=8)
        for k, head in enumerate(heads):
            colour = colours(k % colours.N)
            for j in range(len(columns)):
                weight = float(weights[layer, head, token_index, j])
                if weight > 0.005:
                    ax.plot([0.31, 0.69], [token_index, j], color=colour, alpha=min(1.0, weight), linewidth=2)
            ax.plot([], [], color=colour, linewidth=2, label=f"head {head}")
        fig.legend(loc="lower center", ncol=min(len(heads), 8), fontsize=7, frameon=False)
        fig.text(0.5, 1 - 0.3 / height, f"{KIND_TITLES[kind]}, layer {layer} (of 0..{weights.shape[0] - 1}): "
                 f"token {token_index} {rows[token_index]!r}", ha="center", va="top", fontsize=10)  # fmt: skip
        fig.savefig(output_path, dpi=dpi)
        plt.close(fig)
    return str(output_path)


# ----------------------------------------------------------------------------------------------------- HTML page

HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font-family: "DejaVu Sans", "Noto Sans", sans-serif; margin: 1em; }
table.map { border-collapse: collapse; font-size: 11px; }
table.map td { width: 18px; height: 18px; padding: 0; border: 1px solid #eee; }
table.map th { font-weight: normal; padding: 0 4px; white-space: nowrap; }
table.map th.col { writing-mode: vertical-rl; transform: rotate(180deg); height: 8em; text-align: left; }
td.aligned { outline: 2px solid red; outline-offset: -2px; }
.controls { margin: 0.5em 0 1em; } .controls button { margin: 0 2px; }
</style></head><body>
<h2>__TITLE__</h2>
<p><b>source</b>: <span id="source"></span><br><b>target</b>: <span id="target"></span><br>
<b>alignment</b> (Pharaoh, source-target, <span id="alignment-from"></span>): <code id="alignment"></code></p>
<div class="controls">
 kind <select id="kind"></select> layer <select id="layer"></select> head <select id="head"></select>
 <button id="prev">&#9664; previous</button><button id="next">next &#9654;</button>
 <label><input type="checkbox" id="show-alignment" checked> alignment points</label>
</div>
<p id="caption"></p>
<div id="map"></div>
<p><small>Attention weights show where each head looked, not why the model chose its words: they are not a
faithful explanation of its predictions (Jain &amp; Wallace 2019; Serrano &amp; Smith 2019).</small></p>
<script id="attention-data" type="application/json">__DATA__</script>
<script>
const data = JSON.parse(document.getElementById("attention-data").textContent);
const $ = (id) => document.getElementById(id);
$("source").textContent = data.source_text; $("target").textContent = data.target_text;
$("alignment").textContent = data.alignment.pharaoh; $("alignment-from").textContent = data.alignment.description;
function fill(select, values, labels) {
  const keep = select.value; select.innerHTML = "";
  values.forEach((v, i) => {
    const o = document.createElement("option"); o.value = v; o.textContent = labels[i]; select.appendChild(o);
  });
  if (values.map(String).includes(keep)) select.value = keep;
}
fill($("kind"), Object.keys(data.kinds), Object.keys(data.kinds).map((k) => data.kinds[k].title));
function updateChoices() {
  const kind = data.kinds[$("kind").value];
  const layers = kind.weights.length, heads = kind.weights[0].length;
  fill($("layer"), [...Array(layers).keys()], [...Array(layers).keys()].map(String));
  fill($("head"), ["mean", ...Array(heads).keys()], ["mean of heads", ...[...Array(heads).keys()].map(String)]);
}
function matrix(kind, layer, head) {
  const w = kind.weights[layer];
  if (head !== "mean") return w[Number(head)];
  return w[0].map((row, r) => row.map((_, c) => w.reduce((s, h) => s + h[r][c], 0) / w.length));
}
function render() {
  const name = $("kind").value, kind = data.kinds[name];
  const layer = Number($("layer").value), head = $("head").value, m = matrix(kind, layer, head);
  const max = Math.max(1e-9, ...m.flat());
  const marks = new Set();
  if (name === "cross" && $("show-alignment").checked && layer === data.alignment.layer && head === "mean")
    data.alignment.cells.forEach(([r, c]) => marks.add(r + "," + c));
  $("caption").textContent = kind.title + ", layer " + layer + ", "
    + (head === "mean" ? "mean of heads" : "head " + head)
    + " (rows: " + kind.row_label + ", columns: " + kind.column_label + "; darker = more weight)";
  const table = document.createElement("table"); table.className = "map";
  const head_row = table.insertRow(); head_row.appendChild(document.createElement("th"));
  kind.columns.forEach((t) => {
    const th = document.createElement("th"); th.className = "col"; th.textContent = t; head_row.appendChild(th);
  });
  m.forEach((row, r) => {
    const tr = table.insertRow(); const th = document.createElement("th");
    th.textContent = kind.rows[r]; tr.appendChild(th);
    row.forEach((v, c) => {
      const td = tr.insertCell(); td.style.background = "rgba(20, 60, 160, " + (v / max).toFixed(3) + ")";
      td.title = kind.rows[r] + " \\u2192 " + kind.columns[c] + ": " + v.toFixed(4);
      if (marks.has(r + "," + c)) td.className = "aligned";
    });
  });
  $("map").replaceChildren(table);
}
function step(delta) {
  const heads = $("head").options.length, layers = $("layer").options.length;
  let index = Number($("layer").value) * heads + $("head").selectedIndex + delta;
  index = (index + layers * heads) % (layers * heads);
  $("layer").value = String(Math.floor(index / heads)); $("head").selectedIndex = index % heads; render();
}
$("kind").onchange = () => { updateChoices(); render(); };
$("layer").onchange = render; $("head").onchange = render; $("show-alignment").onchange = render;
$("prev").onclick = () => step(-1); $("next").onclick = () => step(1);
updateChoices(); render();
</script></body></html>
"""


def attention_page_data(maps: AttentionMaps, alignment_layer: int | None = None, decimals: int = 4) -> dict:
    """The numbers `write_attention_html` embeds: per kind its tokens and weights [layers][heads][rows][columns]
    (rounded to `decimals`), and the alignment of `alignment_layer` (mean of heads) with the cells it marks."""
    layer = default_alignment_layer(maps.cross.shape[0]) if alignment_layer is None else alignment_layer
    layer = check_layer(layer, maps.cross.shape[0], "cross")
    pairs = sentence_alignments(maps, layer)
    cells = [[t, s] for i, j in pairs for t, tw in enumerate(maps.target_word_ids) if tw == j
             for s, sw in enumerate(maps.source_word_ids) if sw == i]  # fmt: skip
    labels = {"encoder": ("source", "source"), "decoder": ("target (decoder input)", "target (decoder input)"),
              "cross": ("target (output)", "source")}  # fmt: skip
    kinds = {}
    for kind in KINDS:
        rows, columns = maps.axes(kind)
        kinds[kind] = {"title": KIND_TITLES[kind], "rows": rows, "columns": columns, "row_label": labels[kind][0],
                       "column_label": labels[kind][1],
                       "weights": torch.round(maps.weights(kind).double(), decimals=decimals).tolist()}  # fmt: skip
    return {
        "source_text": maps.source_text, "target_text": maps.target_text, "kinds": kinds,
        "alignment": {"layer": layer, "pharaoh": pharaoh(pairs), "cells": cells,
                      "description": f"cross-attention layer {layer}, mean of heads, argmax per target word"},
    }  # fmt: skip


def write_attention_html(
    maps: AttentionMaps, output_path: str | os.PathLike, title: str = "Attention", alignment_layer: int | None = None
) -> str:
    """One self-contained HTML page (the numbers as JSON, a small script drawing them: no network, no server) to
    click through every layer and head of the three kinds of attention; returns the path."""
    data = json.dumps(attention_page_data(maps, alignment_layer), ensure_ascii=False)
    data = data.replace("</", "<\\/")  # tokens such as "</s>" must not close the script element
    page = HTML_TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)
    Path(output_path).write_text(page, encoding="utf-8")
    return str(output_path)


def write_card_attention_picture(model, tokenizer, source: str, output_path) -> str:
    """For model cards: the model's own translation of `source`, its cross-attention (mean of the heads of the
    alignment layer, `default_alignment_layer`) with the alignment points framed, as a PNG; returns its path."""
    maps = attention_maps(model, tokenizer, source)
    layer = default_alignment_layer(maps.cross.shape[0])
    return plot_attention(maps, output_path, kind="cross", layer=layer, alignment=sentence_alignments(maps, layer))


# ------------------------------------------------------------------------------------------------ command lines

PLOT_DESCRIPTION = """Attention pictures of one sentence: heat maps, all heads of a layer, Figures 3-5, an HTML page.

    %(prog)s --model_name_or_path runs/multi30k_cpu/averaged --source "A man rides a bike." --output_dir attention
    %(prog)s --model_name_or_path MODEL --source "..." --target "..." --kind encoder --layer 2 --token_index 3 --html

Without --target the model's own translation is decoded with its generation config (the paper's beam search).
Writes, for each chosen kind (encoder, decoder, cross) and layer, a grid of all heads ({kind}_layer{L}_heads.png);
the cross-attention of the alignment layer (the penultimate decoder layer), mean of heads, with the alignment points
framed (cross_alignment_layer{L}.png); with --head, that head's heat map ({kind}_layer{L}_head{H}.png); with
--token_index, lines from that token to those it attends to, one colour per head ({kind}_layer{L}_token{I}_lines.png);
with --html, attention.html, one self-contained page with every layer and head. Prints the paths written.
Attention weights are not a faithful explanation of the model's decisions (Jain & Wallace 2019).
"""

ALIGN_DESCRIPTION = """Word alignments (Pharaoh format, "i-j": source word i, target word j, from 0) from attention.

    %(prog)s --model_name_or_path MODEL --source_file test.en --target_file test.de --output test.align
    %(prog)s --model_name_or_path MODEL --source_file test.en --translations_file test.hyp.de --output test.align

Words are the space- or tab-separated words of each line, as fast_align counts them (subwords merged). Each target
word is aligned to the source word receiving the most attention (mean of the heads of --layer, default the
penultimate decoder layer, as Garg et al. 2019), or with --threshold to every source word receiving at least that
much. Without --target_file the sources are
translated (the model's generation config: the paper's beam search) and the translations written to
--translations_file. One output line per input line (an empty line gives an empty line).
"""


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from .translate import add_decoding_arguments

    parser.add_argument("--model_name_or_path", "--model", required=True,
                        help="Model folder or Hub model id (with its tokenizer).")  # fmt: skip
    add_decoding_arguments(parser)
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps ... (default: cpu).")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit).")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true",
                        help="Allow the model's own code (not needed for vaswani_transformer models).")  # fmt: skip


def _load(args: argparse.Namespace):
    from .translate import load_model_and_tokenizer

    return load_model_and_tokenizer(args.model_name_or_path, device=args.device, revision=args.revision,
                                    trust_remote_code=args.trust_remote_code)  # fmt: skip


def _decoding(args: argparse.Namespace) -> dict:
    from .translate import decoding_arguments

    return decoding_arguments(args)


def plot_attention_main(argv=None) -> int:
    """`scripts/plot_attention.py`: exit status 0, or 1 with an error line for bad input."""
    parser = cli.ArgumentParser(description=PLOT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_arguments(parser)
    parser.add_argument("--source", required=True, help="The source sentence.")
    parser.add_argument("--target", help="Its translation (default: the model's own).")
    parser.add_argument("--output_dir", "--output-dir", required=True, help="Folder for the pictures.")
    parser.add_argument("--kind", choices=(*KINDS, "all"), default="all", help="Which attention (default: all).")
    parser.add_argument("--layer", type=int, help="One layer (negative: from the last; default: every layer).")
    parser.add_argument("--head", type=int, help="Also write this head's heat map.")
    parser.add_argument("--token_index", "--token-index", type=int,
                        help="Also draw the Figure 3-5 view for this token (index into the rows).")  # fmt: skip
    parser.add_argument("--html", action="store_true", help="Also write attention.html (all layers and heads).")
    parser.add_argument("--dpi", type=int, default=100, help="Pixels per inch (default 100).")
    args = parser.parse_args(argv)
    try:
        if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
            raise ValueError(f"--output_dir {args.output_dir} is a file, not a folder.")
        model, tokenizer = _load(args)
        maps = attention_maps(model, tokenizer, args.source, args.target, **_decoding(args))
        written = _write_pictures(maps, args)
    except (FileNotFoundError, ValueError, ImportError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"source: {maps.source_text}\ntarget: {maps.target_text}")
    print("\n".join(written))
    return 0


def _write_pictures(maps: AttentionMaps, args: argparse.Namespace) -> list[str]:
    kinds = KINDS if args.kind == "all" else (args.kind,)
    chosen = {kind: [check_layer(args.layer, maps.weights(kind).shape[0], kind)] if args.layer is not None
              else list(range(maps.weights(kind).shape[0])) for kind in kinds}  # fmt: skip
    for kind in kinds:  # check every index before drawing anything
        if args.head is not None:
            check_head(args.head, maps.weights(kind).shape[1])
        if args.token_index is not None:
            check_token_index(args.token_index, len(maps.axes(kind)[0]), "source" if kind == "encoder" else "target")
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds:
        for layer in chosen[kind]:
            written.append(plot_attention_heads(maps, folder / f"{kind}_layer{layer}_heads.png", kind, layer, args.dpi))
            if args.head is not None:
                written.append(plot_attention(maps, folder / f"{kind}_layer{layer}_head{args.head}.png", kind, layer,
                                              args.head, dpi=args.dpi))  # fmt: skip
            if args.token_index is not None:
                path = folder / f"{kind}_layer{layer}_token{args.token_index}_lines.png"
                written.append(plot_attention_lines(maps, path, kind, layer, args.token_index, dpi=args.dpi))
    if "cross" in kinds:
        layer = default_alignment_layer(maps.cross.shape[0])
        written.append(plot_attention(maps, folder / f"cross_alignment_layer{layer}.png", "cross", layer,
                                      alignment=sentence_alignments(maps, layer), dpi=args.dpi))  # fmt: skip
    if args.html:
        written.append(write_attention_html(maps, folder / "attention.html", title=f"Attention: {maps.source_text}"))
    return written


def align_main(argv=None) -> int:
    """`scripts/align.py`: exit status 0, or 1 with an error line for bad input."""
    from .textio import is_stdio, read_lines, write_lines

    parser = cli.ArgumentParser(description=ALIGN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_arguments(parser)
    parser.add_argument("--source_file", "--source-file", required=True, help="Source sentences, one per line.")
    parser.add_argument("--target_file", "--target-file", help="Their translations, line for line.")
    parser.add_argument("--translations_file", "--translations-file",
                        help="Without --target_file: where the model's translations are written.")  # fmt: skip
    parser.add_argument("--output", "-o", default="-", help="Alignments, one Pharaoh line per pair ('-': stdout).")
    parser.add_argument("--layer", type=int, help="Decoder layer (negative: from the last; default: penultimate).")
    parser.add_argument("--head", type=int, help="One head (default: the mean of the heads).")
    parser.add_argument("--method", choices=ALIGNMENT_METHODS, default="merge",
                        help="merge: words' attention merged, then argmax (default); subwords: subword argmax, "
                        "words aligned when any subwords are.")  # fmt: skip
    parser.add_argument("--threshold", type=cli.fraction,
                        help="Align to every source word with at least this weight, in (0, 1] (a share of the "
                        "attention mass; 0 would align every pair).")  # fmt: skip
    args = parser.parse_args(argv)
    if args.target_file is not None and args.translations_file is not None:
        parser.error("give --target_file (the translations to align) or --translations_file (where the model's own "
                     "translations are written), not both.")  # fmt: skip
    try:
        if args.target_file is None and args.translations_file is None:
            raise ValueError("Give --target_file (the translations to align) or --translations_file (where the "
                             "model's own translations go: the alignments index their words).")  # fmt: skip
        for option, path in (("--output", args.output), ("--translations_file", args.translations_file)):
            if not is_stdio(path) and (problem := cli.output_path_problem(path, option)):
                raise ValueError(problem)  # before the model is loaded and every sentence translated
        sources, source_name = read_lines(args.source_file)
        targets = None
        if args.target_file is not None:
            targets, target_name = read_lines(args.target_file)
            if len(targets) != len(sources):
                raise ValueError(f"{source_name} has {len(sources)} lines but {target_name} has {len(targets)}.")
        model, tokenizer = _load(args)
        decoding = _decoding(args)
        lines, translations = [], []
        for i, source in enumerate(sources):
            target = None if targets is None else targets[i]
            if not source.strip() or (target is not None and not target.strip()):
                lines.append("")
                translations.append("")
                continue
            try:
                maps = attention_maps(model, tokenizer, source, target, **decoding)
                pairs = sentence_alignments(maps, args.layer, args.head, method=args.method, threshold=args.threshold)
            except ValueError as error:
                raise ValueError(f"{source_name}:{i + 1}: {error}") from None
            lines.append(pharaoh(pairs))
            translations.append(maps.target_text)
        if targets is None:
            write_lines(translations, args.translations_file)
        write_lines(lines, args.output)
    except (FileNotFoundError, ValueError, ImportError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "AttentionMaps",
    "align_main",
    "alignments",
    "attention_maps",
    "attention_page_data",
    "default_alignment_layer",
    "heads_grid_size",
    "heatmap_size",
    "lines_size",
    "pharaoh",
    "plot_attention",
    "plot_attention_heads",
    "plot_attention_lines",
    "plot_attention_main",
    "readable_tokens",
    "sentence_alignments",
    "word_ids",
    "write_attention_html",
    "write_card_attention_picture",
]


if __name__ == "__main__":  # two commands live here: say which to run
    sys.exit("python -m vaswani_transformer.attention runs nothing: use vaswani-plot-attention or vaswani-align "
             "(scripts/plot_attention.py, scripts/align.py).")
