"""fairseq import and the authors' positional layout, against references written from fairseq's code.

fairseq does not install on this Python and torch: the checkpoints here are written in fairseq's documented layout
(`{"args": Namespace, "model": state_dict}`, its parameter names, `dict.<lang>.txt`, subword-nmt `bpecodes`) and the
reference is a float64 forward pass written below from fairseq's `TransformerEncoder/DecoderLayer` (post-LN),
`MultiheadAttention` (q scaled by head_dim^-0.5 after its bias) and `SinusoidalPositionalEmbedding`.
"""

import argparse
import math
import os
import subprocess
import sys

import pytest
import torch

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.fairseq_import import (
    build_tokenizer,
    config_from_fairseq,
    convert_fairseq,
    main,
    read_bpe_codes,
    read_fairseq_dictionary,
)
from vaswani_transformer.modeling_vaswani_transformer import tensor2tensor_position_encoding


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, FFN, HEADS, LAYERS = 16, 32, 2, 2
WORDS = ["the", "cat", "sat", "on", "mat", ".", "d@@", "o@@", "g@@", "s", "c@@", "a@@", "t"]
CODES = "#version: 0.2\nt h\nth e</w>\nc a\nca t</w>\ns a\nsa t</w>\no n</w>\nm a\nma t</w>\n"


# References written from fairseq's code -------------------------------------------------------------------------------


def fairseq_sinusoids(num_embeddings: int, dim: int, padding_idx: int) -> torch.Tensor:
    """fairseq's SinusoidalPositionalEmbedding.get_embedding (row = position number, padding row zero), float64."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64) * -step)
    angles = torch.arange(num_embeddings, dtype=torch.float64)[:, None] * frequencies[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_embeddings, 1, dtype=torch.float64)], dim=1)
    table[padding_idx] = 0
    return table


def _linear(state, name, x):
    return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]


def _layer_norm(state, name, x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), state[f"{name}.weight"], state[f"{name}.bias"], 1e-5)


def _attention(state, name, query, memory, causal):
    head = D // HEADS
    q = _linear(state, f"{name}.q_proj", query) * head**-0.5
    k, v = _linear(state, f"{name}.k_proj", memory), _linear(state, f"{name}.v_proj", memory)
    split = lambda t: t.view(t.shape[0], HEADS, head).transpose(0, 1)  # noqa: E731
    scores = split(q) @ split(k).transpose(1, 2)
    if causal:
        scores = scores + torch.full(scores.shape[-2:], float("-inf"), dtype=scores.dtype).triu(1)
    out = (torch.softmax(scores, dim=-1) @ split(v)).transpose(0, 1).reshape(query.shape[0], D)
    return _linear(state, f"{name}.out_proj", out)


def fairseq_logits(state, source: list[int], prev_output: list[int]) -> torch.Tensor:
    """fairseq's TransformerModel forward (eval, post-LN, share_all_embeddings) for one sentence, float64."""
    state = {k: v.double() for k, v in state.items()}
    embed, table = state["encoder.embed_tokens.weight"], fairseq_sinusoids(64, D, 1)

    def embed_tokens(tokens):  # positions start after the padding index 1
        return math.sqrt(D) * embed[tokens] + table[torch.arange(len(tokens)) + 2]

    x = embed_tokens(source)
    for i in range(LAYERS):
        p = f"encoder.layers.{i}"
        x = _layer_norm(state, f"{p}.self_attn_layer_norm", x + _attention(state, f"{p}.self_attn", x, x, False))
        ffn = _linear(state, f"{p}.fc2", torch.relu(_linear(state, f"{p}.fc1", x)))
        x = _layer_norm(state, f"{p}.final_layer_norm", x + ffn)
    memory, y = x, embed_tokens(prev_output)
    for i in range(LAYERS):
        p = f"decoder.layers.{i}"
        y = _layer_norm(state, f"{p}.self_attn_layer_norm", y + _attention(state, f"{p}.self_attn", y, y, True))
        y = _layer_norm(state, f"{p}.encoder_attn_layer_norm",
                        y + _attention(state, f"{p}.encoder_attn", y, memory, False))  # fmt: skip
        ffn = _linear(state, f"{p}.fc2", torch.relu(_linear(state, f"{p}.fc1", y)))
        y = _layer_norm(state, f"{p}.final_layer_norm", y + ffn)
    return y @ state["decoder.output_projection.weight"].T


def fairseq_greedy(state, source: list[int], max_len: int) -> list[int]:
    """Greedy decoding as fairseq's `SequenceGenerator`: the decoder starts from </s> (id 2) and stops at </s>,
    never picks <pad> (id 1), nor </s> at the first step (`--min-len` 1, its default)."""
    output = [2]
    for step in range(max_len):
        logits = fairseq_logits(state, source, output)[-1]
        logits[1] = float("-inf")
        if step < 1:
            logits[2] = float("-inf")
        token = int(logits.argmax())
        output.append(token)
        if token == 2:
            break
    return output[1:]


# A tiny checkpoint in fairseq's layout --------------------------------------------------------------------------------


def fairseq_args(**changes) -> argparse.Namespace:
    args = dict(arch="transformer_wmt_en_de", encoder_embed_dim=D, decoder_embed_dim=D, encoder_ffn_embed_dim=FFN,
                decoder_ffn_embed_dim=FFN, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                decoder_attention_heads=HEADS, encoder_normalize_before=False, decoder_normalize_before=False,
                activation_fn="relu", encoder_learned_pos=False, decoder_learned_pos=False, share_all_embeddings=True,
                share_decoder_input_output_embed=True, no_scale_embedding=False, layernorm_embedding=False,
                dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, max_source_positions=1024,
                adaptive_softmax_cutoff=None, source_lang="en", target_lang="de")  # fmt: skip
    return argparse.Namespace(**{**args, **changes})


def fairseq_state_dict(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=generator) * 0.5  # noqa: E731
    embed = torch.randn(vocab_size, D, generator=generator) * D**-0.5
    state = {"encoder.embed_tokens.weight": embed, "decoder.embed_tokens.weight": embed,
             "decoder.output_projection.weight": embed, "encoder.embed_positions._float_tensor": torch.zeros(1),
             "decoder.embed_positions._float_tensor": torch.zeros(1),
             "encoder.version": torch.tensor([3.0])}  # fmt: skip
    for side in ("encoder", "decoder"):
        for i in range(LAYERS):
            p = f"{side}.layers.{i}"
            attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for attention in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    state[f"{p}.{attention}.{proj}.weight"], state[f"{p}.{attention}.{proj}.bias"] = rand(D, D), rand(D)
            for norm in [f"{a}_layer_norm" for a in attentions] + ["final_layer_norm"]:
                state[f"{p}.{norm}.weight"], state[f"{p}.{norm}.bias"] = 1 + rand(D) * 0.2, rand(D) * 0.2
            state[f"{p}.fc1.weight"], state[f"{p}.fc1.bias"] = rand(FFN, D), rand(FFN)
            state[f"{p}.fc2.weight"], state[f"{p}.fc2.bias"] = rand(D, FFN), rand(D)
    return state


def write_checkpoint(folder, args=None, state=None, words=WORDS, padded_vocab: int = 24):
    """checkpoint_best.pt, dict.en.txt, dict.de.txt and bpecodes as fairseq's translation task leaves them."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        (folder / f"dict.{lang}.txt").write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(words)))
    (folder / "bpecodes").write_text(CODES)
    state = state if state is not None else fairseq_state_dict(padded_vocab)
    torch.save({"args": args or fairseq_args(), "model": state}, folder / "checkpoint_best.pt")
    return state


def to_ours(ids):  # fairseq <s>=0 <pad>=1 -> our <pad>=0 <s>=1; every other id is unchanged
    return [{0: 1, 1: 0}.get(i, i) for i in ids]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fairseq")
    state = write_checkpoint(folder / "fairseq")
    convert_fairseq(str(folder / "fairseq" / "checkpoint_best.pt"), str(folder / "ours"))
    return state, folder


# Tests ----------------------------------------------------------------------------------------------------------------


def test_tensor2tensor_layout_is_fairseqs_table_from_the_offset():
    for dim in (10, 11):  # an odd size leaves the last column zero, as fairseq does
        ours = tensor2tensor_position_encoding(30, dim, offset=2, dtype=torch.float64)
        assert torch.allclose(ours, fairseq_sinusoids(40, dim, padding_idx=1)[2:32], atol=1e-5)
    # position 0: sin 0 = 0 in the first half, cos 0 = 1 in the second (the paper's formula interleaves them)
    assert tensor2tensor_position_encoding(1, 8)[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # the model adds it from `position_offset` on, in the encoder and in the decoder (also one cached step at a time)
    config = VaswaniTransformerConfig(d_model=8, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=8,
                                      vocab_size=10, position_encoding="tensor2tensor", position_offset=2)  # fmt: skip
    embedding = VaswaniTransformerForConditionalGeneration(config).model.decoder.embedding.embed_positions
    like = torch.zeros(1)
    assert torch.equal(embedding(3, 4, like=like), tensor2tensor_position_encoding(3, 8, offset=6))


def test_position_encoding_fields_are_validated():
    with pytest.raises(ValueError, match="'sinusoidal' or 'learned' \\(the paper\\) or 'tensor2tensor'"):
        VaswaniTransformerConfig(position_encoding="t2t")
    with pytest.raises(ValueError, match="`position_offset` must be 0 or more"):
        VaswaniTransformerConfig(position_offset=-1)
    with pytest.raises(ValueError, match="0 with learned positions"):
        VaswaniTransformerConfig(position_encoding="learned", position_offset=2)
    config = VaswaniTransformerConfig(position_encoding="tensor2tensor", position_offset=2)
    assert VaswaniTransformerConfig.from_dict(config.to_dict()).position_offset == 2


@pytest.mark.parametrize("given, expected", [
    ({"activation_dropout": 0.2, "relu_dropout": 0.1}, 0.2),
    ({"activation_dropout": 0.0, "relu_dropout": 0.1}, 0.1),  # fairseq's layers fall back to relu_dropout at 0
    ({"relu_dropout": 0.1}, 0.1),
    ({"activation_dropout": 0.0}, 0.0),
    ({}, 0.0),
])  # fmt: skip
def test_activation_dropout_is_the_one_fairseqs_layers_use(given, expected):
    """fairseq's TransformerEncoderLayer/DecoderLayer: `activation_dropout`, or `relu_dropout` where that is 0."""
    args = dict(encoder_embed_dim=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                encoder_ffn_embed_dim=16, **given)  # fmt: skip
    assert config_from_fairseq(args, vocab_size=20).activation_dropout == expected


def test_converted_logits_equal_fairseqs_forward(converted):
    state, folder = converted
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "ours", dtype=torch.float64).eval()
    assert model.config.position_encoding == "tensor2tensor" and model.config.position_offset == 2
    generator = torch.Generator().manual_seed(1)
    for length in (1, 4, 9):
        source = torch.randint(3, 24, (length,), generator=generator).tolist() + [2]
        prev_output = [2] + torch.randint(3, 24, (5,), generator=generator).tolist()
        expected = fairseq_logits(state, source, prev_output)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([to_ours(source)]),
                           decoder_input_ids=torch.tensor([to_ours(prev_output)])).logits[0]  # fmt: skip
        assert torch.allclose(logits[:, to_ours(list(range(24)))], expected, rtol=0, atol=1e-6)


def test_converted_model_decodes_as_fairseq(converted):
    state, folder = converted
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "ours").eval()
    assert model.config.decoder_start_token_id == 2  # fairseq starts the decoder from </s>
    generator = torch.Generator().manual_seed(2)
    for _ in range(4):
        source = torch.randint(3, 24, (6,), generator=generator).tolist() + [2]
        with torch.no_grad():
            output = model.generate(input_ids=torch.tensor([to_ours(source)]), num_beams=1, max_new_tokens=8)
        assert output[0, 1:].tolist() == to_ours(fairseq_greedy(state, source, 8))[: output.shape[1] - 1]


def test_a_converted_model_never_translates_to_nothing_as_fairseq_s_min_len(tmp_path):
    """fairseq's generator forbids </s> at the first step (`--min-len` 1): the converted model's generation config
    asks for one new token at least, so a model whose </s> is likeliest everywhere gives one word, not an empty
    translation (before: [</s>, </s>]), with every beam count."""
    state = fairseq_state_dict(24)
    last = f"decoder.layers.{LAYERS - 1}.final_layer_norm.bias"
    state[last] = state[last] + 4 * state["decoder.output_projection.weight"][2]  # </s> likeliest at every step
    write_checkpoint(tmp_path / "fairseq", state=state)
    convert_fairseq(str(tmp_path / "fairseq" / "checkpoint_best.pt"), str(tmp_path / "ours"))
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(tmp_path / "ours").eval()
    source = [5, 9, 14, 7, 2]
    expected = fairseq_greedy(state, source, 8)
    assert len(expected) == 2 and int(fairseq_logits(state, source, [2])[-1].argmax()) == 2  # one word, then </s>
    for beams in (1, 4):
        with torch.no_grad():
            output = model.generate(input_ids=torch.tensor([to_ours(source)]), num_beams=beams, max_new_tokens=8)
        assert output[0, 1:].tolist() == to_ours(expected), beams


def test_tokenizer_is_moses_plus_subword_nmt(converted):
    """Moses (escaped, period split) then subword-nmt BPE with the codes: "dogs" has no merges and becomes
    d@@ o@@ g@@ s; ids are the dictionary's (ours: <pad> and <s> swapped), and `</s>` ends the source."""
    from transformers import AutoTokenizer

    _, folder = converted
    tokenizer = AutoTokenizer.from_pretrained(folder / "ours")
    symbols = read_fairseq_dictionary(str(folder / "fairseq" / "dict.en.txt"))
    assert symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and symbols[4:] == WORDS
    ids = tokenizer("the dogs sat on the mat.").input_ids
    pieces = ["the", "d@@", "o@@", "g@@", "s", "sat", "on", "the", "mat", "."]
    assert ids == [symbols.index(p) for p in pieces] + [2]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the dogs sat on the mat."


def test_unsupported_checkpoints_are_refused_by_name(tmp_path):
    cases = {
        "pre-LN layers": fairseq_args(encoder_normalize_before=True, decoder_normalize_before=True),
        "activation_fn='gelu'": fairseq_args(activation_fn="gelu"),
        "learned positions": fairseq_args(encoder_learned_pos=True, decoder_learned_pos=True),
        # the same weights as ours, computing something else: converted silently before
        "cross_self_attention": fairseq_args(cross_self_attention=True),
        "encoder_layers_to_keep": fairseq_args(encoder_layers_to_keep="0"),
    }
    for i, (message, args) in enumerate(cases.items()):
        write_checkpoint(tmp_path / str(i), args=args)
        with pytest.raises(ValueError, match=message):
            convert_fairseq(str(tmp_path / str(i) / "checkpoint_best.pt"), str(tmp_path / f"out{i}"))
    # a weight our model has no place for (NormFormer's head scales) is named, not dropped
    state = fairseq_state_dict(24)
    write_checkpoint(tmp_path / "extra", state={**state, "decoder.layers.1.self_attn.c_attn": torch.ones(HEADS)})
    with pytest.raises(ValueError, match=r"would drop: decoder\.layers\.1\.self_attn\.c_attn"):
        convert_fairseq(str(tmp_path / "extra" / "checkpoint_best.pt"), str(tmp_path / "out-extra"))
    write_checkpoint(tmp_path / "nocross", args=fairseq_args(no_cross_attention=True),
                     state={k: v for k, v in state.items() if "encoder_attn" not in k})  # fmt: skip
    with pytest.raises(ValueError, match="no_cross_attention"):  # a KeyError's traceback before
        convert_fairseq(str(tmp_path / "nocross" / "checkpoint_best.pt"), str(tmp_path / "out-nocross"))
    write_checkpoint(tmp_path / "nodict")
    os.remove(tmp_path / "nodict" / "dict.de.txt")
    with pytest.raises(FileNotFoundError, match="dict.de.txt"):
        convert_fairseq(str(tmp_path / "nodict" / "checkpoint_best.pt"), str(tmp_path / "out"))


def test_convert_script(tmp_path, capsys):
    write_checkpoint(tmp_path / "fairseq")
    command = [sys.executable, os.path.join(REPO, "scripts", "convert_fairseq.py"), "--checkpoint",
               str(tmp_path / "fairseq" / "checkpoint_best.pt"), "--output_dir", str(tmp_path / "ours")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ours" / "model.safetensors").exists() and (tmp_path / "ours" / "tokenizer_config.json").exists()
    translate = [sys.executable, os.path.join(REPO, "scripts", "translate.py"), "--model_name_or_path",
                 str(tmp_path / "ours"), "--num_beams", "1", "--max_len_b", "3"]  # fmt: skip
    result = subprocess.run(translate, input="the cat\n\n", capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr  # the translate CLI takes the imported folder (FSMT tokenizer files)
    assert len(result.stdout.splitlines()) == 2
    write_checkpoint(tmp_path / "gelu", args=fairseq_args(activation_fn="gelu"))
    command[3] = str(tmp_path / "gelu" / "checkpoint_best.pt")
    assert main(command[2:]) == 1 and "activation_fn='gelu'" in capsys.readouterr().err  # the same main, in process


class NotATensor:
    """A pickled object that is neither a tensor nor an argparse.Namespace."""


def test_checkpoint_formats_cfg_and_fused_in_proj(tmp_path):
    """fairseq >= 0.10 keeps the hyper-parameters in `cfg["model"]` (here a plain dict), fairseq before 2019 held
    Q, K and V in one `in_proj_weight` and named the layers' norms `layer_norms.<i>`: both convert to the same
    function."""
    state = fairseq_state_dict(24, seed=3)
    fused = {k: v for k, v in state.items() if not any(f"attn.{p}_proj" in k for p in "qkv")}
    for name in {k.rsplit(".", 2)[0] for k in state if ".self_attn." in k or ".encoder_attn." in k}:
        fused[f"{name}.in_proj_weight"] = torch.cat([state[f"{name}.{p}_proj.weight"] for p in "qkv"])
        fused[f"{name}.in_proj_bias"] = torch.cat([state[f"{name}.{p}_proj.bias"] for p in "qkv"])
    # fairseq before 0.6.2 named a layer's norms layer_norms.<i>: fairseq renames them on loading, and so do we
    norms = {"encoder": ["self_attn", "final"], "decoder": ["self_attn", "encoder_attn", "final"]}
    for name in [k for k in fused if "_layer_norm." in k]:
        side, _, layer, norm, kind = name.split(".")
        fused[f"{side}.layers.{layer}.layer_norms.{norms[side].index(norm[: -len('_layer_norm')])}.{kind}"] = \
            fused.pop(name)
    write_checkpoint(tmp_path / "old", state=fused)
    write_checkpoint(tmp_path / "new", state=state)
    torch.save({"args": None, "cfg": {"model": vars(fairseq_args())}, "model": state},
               tmp_path / "new" / "checkpoint_best.pt")  # fmt: skip
    source, prev_output = [5, 9, 14, 2], [2, 7, 3]
    expected = fairseq_logits(state, source, prev_output)
    for name in ("old", "new"):
        convert_fairseq(str(tmp_path / name / "checkpoint_best.pt"), str(tmp_path / f"{name}-ours"))
        model = VaswaniTransformerForConditionalGeneration.from_pretrained(tmp_path / f"{name}-ours",
                                                                           dtype=torch.float64).eval()  # fmt: skip
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([to_ours(source)]),
                           decoder_input_ids=torch.tensor([to_ours(prev_output)])).logits[0]  # fmt: skip
        assert torch.allclose(logits[:, to_ours(list(range(24)))], expected, rtol=0, atol=1e-6), name


def test_unknown_pickled_objects_need_unsafe_pickle(tmp_path):
    write_checkpoint(tmp_path)
    checkpoint = torch.load(tmp_path / "checkpoint_best.pt", weights_only=False)
    torch.save({**checkpoint, "extra_state": NotATensor()}, tmp_path / "checkpoint_best.pt")
    with pytest.raises(ValueError, match="pass --unsafe_pickle"):
        convert_fairseq(str(tmp_path / "checkpoint_best.pt"), str(tmp_path / "out"))


def test_converted_model_exports_to_ctranslate2(converted, tmp_path):
    """A fairseq import served by CTranslate2: its position table (authors' layout, offset 2) and decoder start
    (`</s>`) travel into the export, which decodes as the converted model (greedy, float32)."""
    pytest.importorskip("ctranslate2")
    from vaswani_transformer.ctranslate2_export import export_ctranslate2, load_translator, translate_tokens

    _, folder = converted
    export_ctranslate2(str(folder / "ours"), str(tmp_path / "ct2"))
    translator, tokenizer, _ = load_translator(str(tmp_path / "ct2"), intra_threads=1)
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "ours").eval()
    generator = torch.Generator().manual_seed(4)
    for _ in range(4):
        source = to_ours(torch.randint(3, 24, (5,), generator=generator).tolist() + [2])
        with torch.no_grad():
            output = model.generate(input_ids=torch.tensor([source]), num_beams=1, max_new_tokens=8)[0, 1:].tolist()
        [[tokens]] = translate_tokens(translator, [tokenizer.convert_ids_to_tokens(source)], num_beams=1,
                                      max_len_a=0, max_len_b=8)  # fmt: skip
        assert tokenizer.convert_tokens_to_ids(tokens) == [i for i in output if i != 2]  # </s> left out


def test_bpe_codes_are_applied_as_subword_nmt_and_fastbpe_wrote_them(tmp_path):
    """subword-nmt 0.2's rule, applied by hand: merges by rank, the last character carrying `</w>`. A merge whose
    second symbol is a number ("1 9") is a merge, not a count (it was cut to "1": "1990" split into digits); the first
    of a merge listed twice keeps its rank, as in subword-nmt; fastBPE's counts are dropped; subword-nmt 0.1 codes
    (no header) and other versions are refused, since FSMT's rule would apply them differently."""
    symbols = ["<s>", "<pad>", "</s>", "<unk>", "1990", "a@@", "bc@@", "d", "ab@@", "c@@", "the"]
    (tmp_path / "v02").write_text("#version: 0.2\n1 9\n19 9\n199 0</w>\nb c\na b\nb c\n")
    (tmp_path / "fastbpe").write_text("t h 50\nth e</w> 40\n")
    assert read_bpe_codes(str(tmp_path / "v02")) == [("1", "9"), ("19", "9"), ("199", "0</w>"), ("b", "c"), ("a", "b")]
    assert read_bpe_codes(str(tmp_path / "fastbpe")) == [("t", "h"), ("th", "e</w>")]
    for codes, text, pieces in (("v02", "1990 abcd", ["1990", "a@@", "bc@@", "d"]), ("fastbpe", "the", ["the"])):
        tokenizer = build_tokenizer(symbols, str(tmp_path / codes), "en", "de", len(symbols))
        ours = [{0: 1, 1: 0}.get(i, i) for i in tokenizer(text).input_ids[:-1]]  # our ids -> fairseq's
        assert ours == [symbols.index(p) for p in pieces], codes
    (tmp_path / "v01").write_text("t h\nth e\ne </w>\n")
    with pytest.raises(ValueError, match=r"v01:1: .*version 0\.1"):
        read_bpe_codes(str(tmp_path / "v01"))
    (tmp_path / "v03").write_text("#version: 0.3\nt h\n")
    with pytest.raises(ValueError, match=r"v03:1: .*only version 0\.2"):
        read_bpe_codes(str(tmp_path / "v03"))
    (tmp_path / "bad").write_text("#version: 0.2\nt h\nthe\n")
    with pytest.raises(ValueError, match=r"bad:3: expected a BPE merge"):
        read_bpe_codes(str(tmp_path / "bad"))


def test_dictionaries_are_read_as_fairseq_reads_them(tmp_path):
    """fairseq's `Dictionary.add_from_file`: each line right-stripped (a trailing space or CR is no part of the
    word), split at its last space; a word given twice needs `#fairseq:overwrite` (then it is listed again); a count
    must be a number. Before, "the 10 " was read as the word "the 10" and duplicates were taken."""
    path = tmp_path / "dict.txt"
    path.write_bytes(b"the 10 \ncat 9\r\nnew york 8\nthe 7 #fairseq:overwrite\n")
    assert read_fairseq_dictionary(str(path)) == ["<s>", "<pad>", "</s>", "<unk>", "the", "cat", "new york", "the"]
    for lines, message in (("the 10\nthe 9\n", r"dict.txt:2: the word 'the' is listed twice"),
                           ("the ten\n", r"dict.txt:1: expected '<word> <count>"),
                           ("<unk> 3\n", r"dict.txt:1: the word '<unk>' is listed twice"),
                           ("the 1\n\n", r"dict.txt:2: expected")):  # fmt: skip
        path.write_text(lines)
        with pytest.raises(ValueError, match=message):
            read_fairseq_dictionary(str(path))
