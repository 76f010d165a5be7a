"""Import fairseq's Transformer checkpoints (the paper's architecture) as our model folders.

Supported: fairseq's `transformer`, `transformer_wmt_en_de`, `transformer_vaswani_wmt_en_de_big`,
`transformer_vaswani_wmt_en_fr_big` and `transformer_wmt_en_de_big` models - post-LN, ReLU, sinusoidal positions,
embeddings scaled by sqrt(d_model), one dictionary for both languages (`share_all_embeddings`, or identical
`dict.<src>.txt` and `dict.<tgt>.txt`). Anything else (pre-LN, GELU, learned positions, embedding layer norm,
adaptive softmax, two dictionaries, cross-self-attention, a weight the conversion does not use) is refused with an
error naming it.

The conversion:
- fairseq's sinusoids are the authors' layout (halves, frequencies 10000^(-i/(d/2-1))) at positions starting after
  the padding index: `position_encoding="tensor2tensor"`, `position_offset=padding_idx + 1`;
- fairseq's dictionary is `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3, then `dict.*.txt` in order; ours swaps the first
  two (`<pad>`=0 `<s>`=1), so the embedding rows 0 and 1 are swapped; fairseq's decoder starts from `</s>`, so
  `decoder_start_token_id` is `</s>`'s id;
- text: fairseq's models read Moses-tokenized (`-a`, escaped), subword-nmt BPE text (`@@ ` continuations).
  transformers' `FSMTTokenizer` (written for fairseq's WMT19 models) does exactly that with `sacremoses` and the
  BPE codes, so the folder's tokenizer is an `FSMTTokenizer` over the dictionary and codes: raw text in, raw text out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence

import torch
from transformers import FSMTTokenizer

from . import cli
from .checkpoints import pickle_refusal_reason
from .configuration_vaswani_transformer import VaswaniTransformerConfig
from .modeling_vaswani_transformer import VaswaniTransformerForConditionalGeneration


FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary: ids 0..3
OUR_ORDER = (1, 0, 2, 3)  # our id i holds fairseq's id OUR_ORDER[i]: <pad>, <s>, </s>, <unk>
FAIRSEQ_PADDING_INDEX = 1


def read_fairseq_dictionary(path: str) -> list[str]:
    """fairseq's `Dictionary.load`: the 4 special symbols, then the word of each `word count [#fairseq:overwrite]`
    line (the line right-stripped, then split at its last space); a word given twice without the flag, or a count
    that is not a number, is an error naming the line, as in fairseq."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fairseq dictionary {path} not found (the `dict.<lang>.txt` next to the checkpoint).")
    symbols, seen = list(FAIRSEQ_SPECIALS), set(FAIRSEQ_SPECIALS)
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            word, _, count = line.rstrip().rpartition(" ")
            overwrite = count == "#fairseq:overwrite"
            if overwrite:
                word, _, count = word.rpartition(" ")
            if not word or not count.lstrip("-").isdigit():
                raise ValueError(f"{path}:{number}: expected '<word> <count> [#fairseq:overwrite]', got "
                                 f"{line.rstrip()!r}.")  # fmt: skip
            if word in seen and not overwrite:
                raise ValueError(f"{path}:{number}: the word {word!r} is listed twice (fairseq refuses it without "
                                 "#fairseq:overwrite).")  # fmt: skip
            symbols.append(word)
            seen.add(word)
    return symbols


def _model_arguments(checkpoint: dict) -> dict:
    """The model's hyper-parameters from a checkpoint's `args` (argparse.Namespace) or `cfg["model"]`."""
    if checkpoint.get("cfg") is not None and checkpoint["cfg"].get("model") is not None:
        model_cfg = checkpoint["cfg"]["model"]
        return dict(model_cfg.items()) if hasattr(model_cfg, "items") else vars(model_cfg)
    if checkpoint.get("args") is not None:
        return vars(checkpoint["args"])
    raise ValueError("The checkpoint has neither `args` nor `cfg['model']`: not a fairseq checkpoint.")


def check_supported(args: dict, state: dict) -> None:
    """Raise a ValueError naming every feature of the checkpoint that our model does not have."""
    problems = []
    pre_ln = args.get("encoder_normalize_before") or args.get("decoder_normalize_before")
    if pre_ln or "encoder.layer_norm.weight" in state:
        problems.append("pre-LN layers (encoder/decoder_normalize_before); ours are post-LN")
    activation = args.get("activation_fn", "relu")
    if activation != "relu":
        problems.append(f"activation_fn={activation!r}; ours is ReLU")
    if args.get("encoder_learned_pos") or args.get("decoder_learned_pos") or "encoder.embed_positions.weight" in state:
        problems.append("learned positions (encoder/decoder_learned_pos); fairseq's sinusoids are supported")
    if args.get("no_token_positional_embeddings"):
        problems.append("no positional embeddings")
    if args.get("layernorm_embedding") or "encoder.layernorm_embedding.weight" in state:
        problems.append("layernorm_embedding")
    if args.get("adaptive_softmax_cutoff"):
        problems.append("adaptive softmax")
    for a, b in (("encoder_embed_dim", "decoder_embed_dim"), ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
                 ("encoder_attention_heads", "decoder_attention_heads")):  # fmt: skip
        if args.get(a, 0) != args.get(b, 0):
            problems.append(f"{a}={args.get(a)} != {b}={args.get(b)}")
    if args.get("decoder_output_dim", args.get("decoder_embed_dim")) != args.get("decoder_embed_dim"):
        problems.append("decoder_output_dim != decoder_embed_dim")
    if args.get("cross_self_attention"):  # the same weights, another function: nothing else would tell
        problems.append("cross_self_attention (the decoder attending to the source and itself at once)")
    if args.get("no_cross_attention"):
        problems.append("no_cross_attention")
    for name in ("encoder_layers_to_keep", "decoder_layers_to_keep"):
        if args.get(name):
            problems.append(f"{name} (layers pruned on loading)")
    if problems:
        raise ValueError(
            f"Unsupported fairseq model (arch {args.get('arch')!r}): " + "; ".join(problems) + ". Supported: the "
            "post-LN "
            "ReLU Transformer with sinusoidal positions (transformer, transformer_wmt_en_de(_big), "
            "transformer_vaswani_wmt_en_de_big, transformer_vaswani_wmt_en_fr_big)."
        )


def _rows(weight: torch.Tensor, size: int) -> torch.Tensor:
    """A vocabulary matrix in our id order: rows 0 and 1 swapped (fairseq <s>, <pad> -> our <pad>, <s>)."""
    order = list(OUR_ORDER) + list(range(len(OUR_ORDER), size))
    return weight[order]


def _attention(prefix: str, ours: str, state: dict, out: dict):
    if f"{prefix}.in_proj_weight" in state:  # fairseq before 2019: Q, K, V in one matrix
        for name, w, b in zip(("q", "k", "v"), state[f"{prefix}.in_proj_weight"].chunk(3),
                              state[f"{prefix}.in_proj_bias"].chunk(3)):  # fmt: skip
            out[f"{ours}.{name}_proj.weight"], out[f"{ours}.{name}_proj.bias"] = w, b
    else:
        for name in ("q", "k", "v"):
            for kind in ("weight", "bias"):
                out[f"{ours}.{name}_proj.{kind}"] = state[f"{prefix}.{name}_proj.{kind}"]
    for kind in ("weight", "bias"):
        out[f"{ours}.o_proj.{kind}"] = state[f"{prefix}.out_proj.{kind}"]


# fairseq's names before 2019 for a layer's norms (`upgrade_state_dict_named` renames them when fairseq loads one)
_OLD_LAYER_NORMS = {"encoder": ("self_attn_layer_norm", "final_layer_norm"),
                    "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")}  # fmt: skip
# entries that hold no weight: fairseq's version markers and its sinusoids' device placeholder
_NOT_WEIGHTS = re.compile(r"(encoder|decoder)\.(version|embed_positions\._float_tensor)")


def upgrade_state_dict(state: dict) -> dict:
    """A state dict with fairseq's current names, as fairseq upgrades an older one when loading it: a layer's
    `layer_norms.<i>` become its named norms."""
    upgraded = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(encoder|decoder)(\.layers\.\d+\.)layer_norms\.(\d)\.(weight|bias)", name)
        if match and int(match[3]) < len(_OLD_LAYER_NORMS[match[1]]):
            name = f"{match[1]}{match[2]}{_OLD_LAYER_NORMS[match[1]][int(match[3])]}.{match[4]}"
        upgraded[name] = tensor
    return upgraded


class _ReadKeys(dict):
    """A dict that records which keys were read, so that a weight the conversion did not use is an error."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)  # a check of its presence decides how the rest is read
        return super().__contains__(key)


def convert_state_dict(state: dict, config: VaswaniTransformerConfig) -> dict[str, torch.Tensor]:
    """fairseq's `TransformerModel` state dict -> ours (`VaswaniTransformerForConditionalGeneration`); a fairseq
    weight it does not use (a feature our model lacks) is a ValueError naming it."""
    state, out = _ReadKeys(upgrade_state_dict(state)), {}
    size = config.vocab_size
    encoder_embeddings = _rows(state["encoder.embed_tokens.weight"], size)
    decoder_embeddings = _rows(state["decoder.embed_tokens.weight"], size)
    projection = state.get("decoder.output_projection.weight", state.get("decoder.embed_out"))
    projection = decoder_embeddings if projection is None else _rows(projection, size)
    if config.share_embeddings:
        out["model.shared.weight"] = encoder_embeddings
    out["model.encoder.embedding.embed_tokens.weight"] = encoder_embeddings
    out["model.decoder.embedding.embed_tokens.weight"] = decoder_embeddings
    out["lm_head.weight"] = projection
    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            theirs, ours = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            sublayers = [("self_attn", "self_attn"), ("encoder_attn", "encoder_attn")][: 2 if side == "decoder" else 1]
            for their_name, our_name in sublayers:
                _attention(f"{theirs}.{their_name}", f"{ours}.{our_name}", state, out)
                for kind in ("weight", "bias"):
                    norm = state[f"{theirs}.{their_name}_layer_norm.{kind}"]
                    out[f"{ours}.{our_name}_residual.layer_norm.{kind}"] = norm
            for kind in ("weight", "bias"):
                out[f"{ours}.feed_forward.w1.{kind}"] = state[f"{theirs}.fc1.{kind}"]
                out[f"{ours}.feed_forward.w2.{kind}"] = state[f"{theirs}.fc2.{kind}"]
                out[f"{ours}.feed_forward_residual.layer_norm.{kind}"] = state[f"{theirs}.final_layer_norm.{kind}"]
    unused = sorted(k for k in set(state) - state.read if not _NOT_WEIGHTS.fullmatch(k))
    if unused:
        raise ValueError(f"The fairseq checkpoint holds weights of a model other than ours, which the conversion "
                         f"would drop: {', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}.")  # fmt: skip
    return {name: tensor.detach().clone().float() for name, tensor in out.items()}


def config_from_fairseq(args: dict, vocab_size: int) -> VaswaniTransformerConfig:
    """Our config for a fairseq model: its sizes, its positional layout and offset, fairseq's decoder start."""
    return VaswaniTransformerConfig(
        vocab_size=vocab_size,
        d_model=args["encoder_embed_dim"],
        encoder_layers=args["encoder_layers"],
        decoder_layers=args["decoder_layers"],
        num_heads=args["encoder_attention_heads"],
        d_ff=args["encoder_ffn_embed_dim"],
        dropout=args.get("dropout", 0.1),
        attention_dropout=args.get("attention_dropout", 0.0),
        # fairseq's layers: relu_dropout wherever activation_dropout is 0 or unset ("for backwards compatibility")
        activation_dropout=args.get("activation_dropout") or args.get("relu_dropout") or 0.0,
        share_embeddings=bool(args.get("share_all_embeddings", False)),
        scale_embedding=not args.get("no_scale_embedding", False),
        position_encoding="tensor2tensor",
        position_offset=FAIRSEQ_PADDING_INDEX + 1,
        max_position_embeddings=args.get("max_source_positions", 1024),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,  # fairseq starts the decoder from </s>
    )


def read_bpe_codes(path: str) -> list[tuple[str, str]]:
    """The merges of BPE codes that `FSMTTokenizer` applies as their tool did: subword-nmt's `#version: 0.2` codes
    (two symbols a line; the end of a word is the last character's `</w>`), or fastBPE's (no header, a count after
    the two symbols); a merge listed twice keeps its first rank, as subword-nmt's. subword-nmt's codes without a
    header are its version 0.1, whose `</w>` is a symbol of its own and merges other pairs first: refused, as is any
    line that is not two symbols (and a count)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().rstrip("\n").split("\n")
    header = lines[0].startswith("#version:")
    if header and lines[0].split()[-1] not in ("0.2", "0.2.0"):
        raise ValueError(f"{path}:1: BPE codes of subword-nmt {lines[0][1:].strip()}; only version 0.2 is supported.")
    merges = []
    for number, line in enumerate(lines[1:] if header else lines, 2 if header else 1):
        fields = line.strip("\r ").split(" ")
        counted = len(fields) == 3 and fields[2].isdigit()  # fastBPE writes each merge's count
        if not header and not counted:
            raise ValueError(
                f"{path}:{number}: BPE codes without a '#version: 0.2' line and without counts are subword-nmt's "
                "version 0.1, which this tokenizer cannot apply as subword-nmt did: relearn the codes with "
                "subword-nmt >= 0.2, or give codes of version 0.2."
            )
        if len(fields) != 2 + counted or not all(fields[:2]):
            raise ValueError(f"{path}:{number}: expected a BPE merge '<symbol> <symbol>', got {line!r}.")
        merges.append((fields[0], fields[1]))
    return list(dict.fromkeys(merges))


def build_tokenizer(symbols: list[str], codes: str, source_lang: str, target_lang: str, vocab_size: int):
    """An `FSMTTokenizer` (Moses + subword-nmt BPE) over the fairseq dictionary in our id order."""
    symbols = symbols + [f"madeupword{i:04d}" for i in range(vocab_size - len(symbols))]  # fairseq's padding words
    ordered = [symbols[i] for i in OUR_ORDER] + symbols[len(OUR_ORDER):]
    # FSMT's vocabulary marks word ends with </w> where subword-nmt marks continuations with @@.
    vocab = {}
    for index, token in enumerate(ordered):
        if index < len(OUR_ORDER) or token.startswith("madeupword"):
            key = token
        else:
            key = token[:-2] if token.endswith("@@") else token + "</w>"
        vocab.setdefault(key, index)
    with tempfile.TemporaryDirectory() as folder:
        vocab_file = os.path.join(folder, "vocab.json")
        merges_file = os.path.join(folder, "merges.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(merges_file, "w", encoding="utf-8") as f:
            f.write("".join(f"{a} {b}\n" for a, b in read_bpe_codes(codes)))
        return FSMTTokenizer(langs=[source_lang, target_lang], src_vocab_file=vocab_file, tgt_vocab_file=vocab_file,
                             merges_file=merges_file, model_max_length=1024)  # fmt: skip


def load_checkpoint(path: str, unsafe_pickle: bool = False) -> dict:
    """A fairseq checkpoint; pickled classes other than `argparse.Namespace` need `unsafe_pickle=True`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fairseq checkpoint {path} not found.")
    if unsafe_pickle:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle.UnpicklingError, with the name of the class it refused
        raise ValueError(
            f"{path} holds Python objects beyond tensors and argparse.Namespace (newer fairseq checkpoints store an "
            "omegaconf config): pass --unsafe_pickle (unsafe_pickle=True) for a checkpoint you trust, with omegaconf "
            f"installed. ({pickle_refusal_reason(error)})"
        ) from error


def convert_fairseq(
    checkpoint: str,
    output_dir: str,
    source_dict: str | None = None,
    target_dict: str | None = None,
    bpe_codes: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    unsafe_pickle: bool = False,
):
    """Write one of our model folders (weights, config, generation config, tokenizer) from a fairseq checkpoint."""
    loaded = load_checkpoint(checkpoint, unsafe_pickle)
    args = _model_arguments(loaded)
    state = loaded["model"]
    check_supported(args, state)
    folder = os.path.dirname(os.path.abspath(checkpoint))
    source_lang = source_lang or args.get("source_lang")
    target_lang = target_lang or args.get("target_lang")
    if not (source_lang and target_lang):
        raise ValueError("The checkpoint does not name its languages: give --source_lang and --target_lang.")
    source_dict = source_dict or os.path.join(folder, f"dict.{source_lang}.txt")
    target_dict = target_dict or os.path.join(folder, f"dict.{target_lang}.txt")
    symbols = read_fairseq_dictionary(source_dict)
    if read_fairseq_dictionary(target_dict) != symbols:
        raise ValueError(
            f"{source_dict} and {target_dict} differ: our model has one vocabulary for both languages (fairseq's "
            "--joined-dictionary models)."
        )
    vocab_size = state["encoder.embed_tokens.weight"].shape[0]
    if vocab_size < len(symbols):
        raise ValueError(f"The dictionary has {len(symbols)} symbols but the checkpoint {vocab_size} embeddings.")
    config = config_from_fairseq(args, vocab_size)
    model = VaswaniTransformerForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(convert_state_dict(state, config), strict=False)
    tied = {"model.encoder.embedding.embed_tokens.weight", "model.decoder.embedding.embed_tokens.weight",
            "lm_head.weight"}  # fmt: skip
    if set(missing) - tied or unexpected:
        raise ValueError(f"Checkpoint does not match the architecture: missing {missing}, unexpected {unexpected}.")
    model.generation_config.beam_search_rules = "fairseq"
    model.generation_config.min_new_tokens = 1  # fairseq's --min-len 1: </s> is no first word (no empty output)
    model.eval().save_pretrained(output_dir)
    bpe_codes = bpe_codes or os.path.join(folder, "bpecodes")
    if os.path.isfile(bpe_codes):
        build_tokenizer(symbols, bpe_codes, source_lang, target_lang, vocab_size).save_pretrained(output_dir)
    else:
        print(f"warning: no BPE codes at {bpe_codes} (--bpe_codes): the folder has no tokenizer.", file=sys.stderr)
    return model


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(
        description="Convert a fairseq Transformer checkpoint (post-LN, ReLU, sinusoidal positions, one joined "
        "dictionary) and its dict.*.txt and BPE codes into one of our model folders. Options: the first spelling is "
        "canonical (run_translation.py's), the dashed one an alias.",
    )
    parser.add_argument("--checkpoint", required=True, help="fairseq checkpoint (.pt)")
    parser.add_argument("--output_dir", "--output-dir", required=True, help="our model folder to write")
    parser.add_argument("--source_lang", "--source-lang", help="default: the checkpoint's")
    parser.add_argument("--target_lang", "--target-lang", help="default: the checkpoint's")
    parser.add_argument("--source_dict", "--source-dict", help="default: dict.<source_lang>.txt next to the checkpoint")
    parser.add_argument("--target_dict", "--target-dict", help="default: dict.<target_lang>.txt next to the checkpoint")
    parser.add_argument("--bpe_codes", "--bpe-codes", help="subword-nmt codes (default: bpecodes by the checkpoint)")
    parser.add_argument("--unsafe_pickle", "--unsafe-pickle", action="store_true",
                        help="unpickle any Python object in the checkpoint (newer fairseq's omegaconf config); "
                        "only for checkpoints you trust")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        convert_fairseq(args.checkpoint, args.output_dir, args.source_dict, args.target_dict, args.bpe_codes,
                        args.source_lang, args.target_lang, args.unsafe_pickle)  # fmt: skip
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Model written to {args.output_dir}")
    return 0


__all__ = ["convert_fairseq", "convert_state_dict", "config_from_fairseq", "read_fairseq_dictionary", "main"]


if __name__ == "__main__":  # python -m vaswani_transformer.fairseq_import, as the console script
    sys.exit(main())
