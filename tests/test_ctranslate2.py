"""CTranslate2 export: the exported model scores and translates as ours does (float32: token for token)."""

import contextlib
import copy
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.modeling_vaswani_transformer import cpuinfo_field
from vaswani_transformer.synthetic import generate_pairs
from vaswani_transformer.tokenization import config_kwargs_from_tokenizer, train_tokenizer


ctranslate2 = pytest.importorskip("ctranslate2")
from vaswani_transformer.ctranslate2_export import (  # noqa: E402
    INT8_SATURATION_WARNING,
    check_quantization,
    export_ctranslate2,
    int8_products_saturate,
    load_translator,
    main,
    translate_file_ctranslate2,
    translate_lines_ctranslate2,
    translate_tokens,
)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def train_tiny_translator(steps: int = 250):
    """(model, tokenizer, test pairs): a 2+2-layer model trained a few seconds on the toy `reverse` task, so that it
    ends its sentences (with imperfect translations, where beam search matters)."""
    pairs = generate_pairs("reverse", {"train": 3000, "test": 64}, seed=0, max_words=6)
    tokenizer = train_tokenizer([s for pair in pairs["train"] for s in pair], vocab_size=400, show_progress=False)
    torch.manual_seed(0)
    config = VaswaniTransformerConfig(d_model=64, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=128,
                                      dropout=0.0, **config_kwargs_from_tokenizer(tokenizer))  # fmt: skip
    model = VaswaniTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    train = pairs["train"]
    for step in range(steps):
        batch = [train[(step * 32 + i) % len(train)] for i in range(32)]
        inputs = tokenizer([s for s, _ in batch], return_tensors="pt", padding=True)
        labels = tokenizer([t for _, t in batch], return_tensors="pt", padding=True).input_ids
        loss = model(**inputs, labels=labels.masked_fill(labels == tokenizer.pad_token_id, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), tokenizer, pairs["test"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The trained tiny model saved, and its float32 and int8 CTranslate2 exports."""
    folder = tmp_path_factory.mktemp("ct2")
    model, tokenizer, test_pairs = train_tiny_translator()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    export_ctranslate2(str(folder / "model"), str(folder / "float32"))
    export_ctranslate2(str(folder / "model"), str(folder / "int8"), quantization="int8")
    return model, tokenizer, test_pairs, folder


def ours(model, tokenizer, sources_ids, **generate_kwargs) -> list[list[int]]:
    """Our `generate` on one right-padded batch; the generated ids without the start token, `</s>` and padding."""
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources_ids], batch_first=True)
    with torch.no_grad():
        output = model.generate(input_ids=batch, attention_mask=(batch != 0).long(), **generate_kwargs)
    specials = (tokenizer.pad_token_id, tokenizer.eos_token_id)
    return [[i for i in row.tolist()[1:] if i not in specials] for row in output]


def exported(translator, tokenizer, sources_ids, **kwargs) -> list[list[int]]:
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in sources_ids]
    return [tokenizer.convert_tokens_to_ids(h[0]) for h in translate_tokens(translator, sources, **kwargs)]


def random_sources(tokenizer, count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=generator).tolist()
    return [torch.randint(4, len(tokenizer), (n,), generator=generator).tolist() + [2] for n in lengths]


def float64_log_probs(model, source_ids, target_ids) -> list[float]:
    """log P(y_t | y_<t, x) of each target token and the final `</s>`, from a float64 copy of our model."""
    reference = VaswaniTransformerForConditionalGeneration(model.config).double().eval()
    reference.load_state_dict(model.state_dict())
    decoder_input = [model.config.decoder_start_token_id] + target_ids
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder_input])).logits
    log_probs = torch.log_softmax(logits[0], dim=-1)
    return [float(log_probs[t, token]) for t, token in enumerate(target_ids + [model.config.eos_token_id])]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"position_encoding": "tensor2tensor", "position_offset": 2},  # fairseq's layout and offset
        {"d_k": 8, "d_v": 8, "scale_embedding": False},  # d_k * h != d_model (Table 3 rows A and B)
        {"position_encoding": "learned", "max_position_embeddings": 40, "share_embeddings": False},
    ],
)
def test_exported_log_probs_equal_a_float64_forward(trained, tmp_path, fields):
    """CTranslate2's `score_batch` of the export against our model's forward pass in float64, for each positional
    layout, scaled or unscaled embeddings, d_k * h != d_model, and separate embeddings and output projection."""
    _, tokenizer, _, _ = trained
    torch.manual_seed(5)
    config = VaswaniTransformerConfig(d_model=32, encoder_layers=2, decoder_layers=2, num_heads=2, d_ff=64,
                                      dropout=0.0, **config_kwargs_from_tokenizer(tokenizer), **fields)  # fmt: skip
    model = VaswaniTransformerForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    export_ctranslate2(str(tmp_path / "model"), str(tmp_path / "ct2"))
    translator, _, _ = load_translator(str(tmp_path / "ct2"), intra_threads=1)
    sources = random_sources(tokenizer, 6, seed=1)
    targets = [ids[:-1] for ids in random_sources(tokenizer, 6, seed=2)]
    results = translator.score_batch([tokenizer.convert_ids_to_tokens(s) for s in sources],
                                     [tokenizer.convert_ids_to_tokens(t) for t in targets])  # fmt: skip
    for source, target, result in zip(sources, targets, results):
        expected = float64_log_probs(model, source, target)
        assert result.log_probs == pytest.approx(expected, abs=2e-4)


def test_float32_greedy_and_beam_equal_ours_token_for_token(trained):
    """Greedy, and beam 4 with transformers' length penalty (CTranslate2's |Y|^alpha), on the test sources and on
    random token sequences: the same tokens for every sentence."""
    model, tokenizer, test_pairs, folder = trained
    translator, _, _ = load_translator(str(folder / "float32"), intra_threads=1)
    test_sources = [tokenizer(s).input_ids for s, _ in test_pairs]
    for sources in (test_sources, random_sources(tokenizer, 32, seed=3)):
        for num_beams in (1, 4):
            expected = ours(model, tokenizer, sources, num_beams=num_beams, length_penalty=0.6,
                            length_penalty_type="transformers")  # fmt: skip
            got = exported(translator, tokenizer, sources, num_beams=num_beams, length_penalty=0.6)
            assert got == expected, f"num_beams={num_beams}"
    # The trained model ends sentences itself (the equality is not only at the length limit).
    limits = {len(s) + 50 for s in test_sources}
    assert all(len(h) + 1 < min(limits) for h in expected)


def test_int8_stays_close_to_float32(trained):
    """int8 weights change the model's log-probabilities a little, not its translations: on float32's own beam
    outputs, int8's log P(y_t | y_<t, x) stay within 0.03 nats on average (1 at most) of a float64 forward pass of
    ours (measured 0.012-0.013; one layer type's weights 5% / 20% off gives 0.027 / 0.105), and at least 85% of the
    beam outputs are float32's. BLEU on 64 short sentences is no measure here: each changed sentence moves it by
    0.5-1 (on an Intel Xeon with AMX, 4 changed sentences of 64 gave 38.8 against 40.9)."""
    model, tokenizer, test_pairs, folder = trained
    sources = [tokenizer(s).input_ids for s, _ in test_pairs]
    translators = {name: load_translator(str(folder / name), intra_threads=1)[0] for name in ("float32", "int8")}
    if int8_products_saturate(translators["int8"].compute_type):
        pytest.skip("this CPU's int8 products saturate (oneDNN without VNNI): load_translator warns, "
                    "test_int8_products_that_saturate_are_warned_about checks it")  # fmt: skip
    outputs = {name: exported(translator, tokenizer, sources, num_beams=4, length_penalty=0.6)
               for name, translator in translators.items()}  # fmt: skip
    same = sum(a == b for a, b in zip(outputs["float32"], outputs["int8"]))
    assert same >= 0.85 * len(sources), f"int8 gives float32's translation for {same} of {len(sources)} sentences"
    targets = [t for t in outputs["float32"] if t]
    scored = [s for s, t in zip(sources, outputs["float32"]) if t]
    assert len(targets) >= 0.9 * len(sources)
    results = translators["int8"].score_batch([tokenizer.convert_ids_to_tokens(s) for s in scored],
                                     [tokenizer.convert_ids_to_tokens(t) for t in targets])  # fmt: skip
    differences = torch.cat([
        (torch.tensor(result.log_probs, dtype=torch.float64) - torch.tensor(float64_log_probs(model, s, t))).abs()
        for s, t, result in zip(scored, targets, results)
    ])  # fmt: skip
    assert differences.mean() <= 0.03 and differences.max() <= 1.0, (differences.mean(), differences.max())


# CTranslate2's int8 products: MKL on Intel CPUs or with CT2_USE_MKL 1/true (case aside; "yes" is not true), oneDNN
# elsewhere on x86, whose u8 x s8 kernels saturate without VNNI (also where ONEDNN_MAX_CPU_ISA leaves VNNI out).
AVX2 = {"avx", "avx2", "fma"}
VNNI = AVX2 | {"avx512f", "avx512_vnni"}


@pytest.mark.parametrize(
    "compute_type, vendor, flags, environ, machine, saturate",
    [
        ("int8", "AuthenticAMD", AVX2, {}, "x86_64", True),  # Zen 2/3
        ("int8_float32", "AuthenticAMD", AVX2, {}, "x86_64", True),
        ("int8_float16", "AuthenticAMD", AVX2, {}, "x86_64", True),
        ("float32", "AuthenticAMD", AVX2, {}, "x86_64", False),
        ("int16", "AuthenticAMD", AVX2, {}, "x86_64", False),
        ("int8", "AuthenticAMD", VNNI, {}, "x86_64", False),  # Zen 4/5
        ("int8", "AuthenticAMD", AVX2 | {"avx_vnni"}, {}, "x86_64", False),
        ("int8", "AuthenticAMD", VNNI, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "x86_64", True),
        ("int8", "AuthenticAMD", VNNI, {"DNNL_MAX_CPU_ISA": "avx512_core"}, "x86_64", True),
        ("int8", "AuthenticAMD", VNNI, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "x86_64", False),
        ("int8", "AuthenticAMD", AVX2, {"CT2_USE_MKL": "1"}, "x86_64", False),
        ("int8", "AuthenticAMD", AVX2, {"CT2_USE_MKL": "TRUE"}, "x86_64", False),
        ("int8", "AuthenticAMD", AVX2, {"CT2_USE_MKL": "yes"}, "x86_64", True),
        ("int8", "AuthenticAMD", AVX2, {"CT2_USE_MKL": "True"}, "x86_64", True),  # CTranslate2: 1, true or TRUE only
        ("int8", "AuthenticAMD", AVX2, {"CT2_USE_MKL": "true"}, "x86_64", False),
        ("int8", "GenuineIntel", AVX2, {}, "x86_64", False),  # MKL
        ("int8", "GenuineIntel", AVX2, {"CT2_USE_MKL": "0"}, "x86_64", True),
        ("int8", "GenuineIntel", VNNI, {"CT2_USE_MKL": "false"}, "x86_64", False),
        ("int8", "", set(), {}, "aarch64", False),  # Ruy
    ],
)  # fmt: skip
def test_the_rule_for_int8_products_that_saturate(compute_type, vendor, flags, environ, machine, saturate):
    assert int8_products_saturate(compute_type, "cpu", vendor, flags, environ, machine) is saturate
    assert not int8_products_saturate(compute_type, "cuda", vendor, flags, environ, machine)


SCORE_IN_A_PROCESS = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from vaswani_transformer.ctranslate2_export import load_translator
translator = load_translator(sys.argv[1], intra_threads=1)[0]
sources, targets = json.load(open(sys.argv[2]))
print(json.dumps([r.log_probs for r in translator.score_batch(sources, targets)]))
"""


@pytest.mark.skipif(not {"avx2", "fma"} <= set(cpuinfo_field("flags").split()), reason="needs an x86 CPU with AVX2")
def test_int8_products_that_saturate_are_warned_about(trained, tmp_path):
    """With oneDNN held to AVX2 (no VNNI) and MKL off, as on an AMD EPYC of the Zen 2/3 generations, the int8 export's
    log-probabilities of float32's own outputs are far from a float64 forward pass of ours (~0.2 nats on average,
    against ~0.013 with VNNI or MKL), and `load_translator` says so, naming CT2_USE_MKL=1 and float32."""
    model, tokenizer, test_pairs, folder = trained
    sources = [tokenizer(s).input_ids for s, _ in test_pairs]
    float32 = load_translator(str(folder / "float32"), intra_threads=1)[0]
    pairs = [(s, t) for s, t in zip(sources, exported(float32, tokenizer, sources, num_beams=4, length_penalty=0.6))
             if t]  # fmt: skip
    tokens = [[tokenizer.convert_ids_to_tokens(s) for s, _ in pairs], [tokenizer.convert_ids_to_tokens(t) for _, t in pairs]]
    (tmp_path / "pairs.json").write_text(json.dumps(tokens), encoding="utf-8")
    env = {**ENV, "PYTHONPATH": REPO, "ONEDNN_MAX_CPU_ISA": "AVX2", "CT2_USE_MKL": "0"}
    done = subprocess.run([sys.executable, "-c", SCORE_IN_A_PROCESS, str(folder / "int8"), str(tmp_path / "pairs.json")],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert INT8_SATURATION_WARNING.split("%s")[1][:60] in done.stderr and "CT2_USE_MKL=1" in done.stderr, done.stderr
    scored = json.loads(done.stdout.strip().splitlines()[-1])
    differences = torch.cat([
        (torch.tensor(got, dtype=torch.float64) - torch.tensor(float64_log_probs(model, s, t))).abs()
        for (s, t), got in zip(pairs, scored)
    ])  # fmt: skip
    assert differences.mean() > 0.1, differences.mean()  # the warning is true (the test above: <= 0.03 unsaturated)


def test_translate_lines_one_output_per_line(trained):
    model, tokenizer, test_pairs, folder = trained
    translator, loaded_tokenizer, defaults = load_translator(str(folder / "float32"), intra_threads=1)
    assert defaults["num_beams"] == 4 and defaults["length_penalty"] == 0.6  # the model's decoding defaults travel
    lines = [test_pairs[0][0], "", "   ", test_pairs[1][0], test_pairs[2][0]]
    got = translate_lines_ctranslate2(translator, loaded_tokenizer, lines, max_tokens=8, num_beams=1)
    sources = [tokenizer(line).input_ids for line in (lines[0], lines[3], lines[4])]
    expected = [tokenizer.decode(ids) for ids in ours(model, tokenizer, sources, num_beams=1)]
    assert got == [expected[0], "", "", expected[1], expected[2]]


def test_each_sentence_gets_its_own_length_limit_whatever_its_batch(trained):
    """With a limit that binds (`max_len_a` 0.5, `max_len_b` 0), a short source's translation is the same alone and
    beside a longer one in the same batch, and stops at its own limit, as our greedy search does per sentence."""
    model, tokenizer, test_pairs, folder = trained
    translator, loaded_tokenizer, _ = load_translator(str(folder / "float32"), intra_threads=1)
    short, long = sorted((s for s, _ in test_pairs), key=lambda s: len(tokenizer(s).input_ids))[:: len(test_pairs) - 1]
    lengths = [len(tokenizer(line).input_ids) for line in (short, long)]
    assert lengths[0] + 4 <= lengths[1]
    rule = dict(num_beams=1, max_len_a=0.5, max_len_b=0)
    together = translate_lines_ctranslate2(translator, loaded_tokenizer, [short, long], max_tokens=4096, **rule)
    alone = [translate_lines_ctranslate2(translator, loaded_tokenizer, [line], **rule)[0] for line in (short, long)]
    assert together == alone
    sources = [tokenizer(line).input_ids for line in (short, long)]
    expected = [tokenizer.decode(ours(model, tokenizer, [ids], num_beams=1, max_new_tokens=len(ids) // 2)[0])
                for ids in sources]  # fmt: skip
    assert together == expected
    assert len(tokenizer(together[0], add_special_tokens=False).input_ids) <= lengths[0] // 2


@pytest.mark.parametrize("saved, limit", [({"max_new_tokens": 3}, 3), ({"max_length": 4}, 3),
                                          ({"max_len_b": None, "max_length": 3}, 2)])  # max_length counts the start
def test_a_length_saved_in_the_generation_config_limits_both_engines_alike(trained, tmp_path, saved, limit):
    """`--engine ctranslate2` chooses the length as our `generate` does: a length saved in the model's generation
    config beats its saved rule, and a rule given on the command line beats the saved length."""
    from vaswani_transformer.translate import translate_lines

    model, tokenizer, test_pairs, folder = trained
    limited = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "model").eval()
    for name, value in saved.items():
        setattr(limited.generation_config, name, value)
    limited.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    export_ctranslate2(str(tmp_path / "model"), str(tmp_path / "ct2"))
    from vaswani_transformer.ctranslate2_export import translate_file_ctranslate2

    lines = [s for s, _ in test_pairs[:8]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for given in ({}, {"max_len_a": 0, "max_len_b": 5}):
        translate_file_ctranslate2(str(tmp_path / "ct2"), str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                                   num_beams=1, **given)  # fmt: skip
        got = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
        assert got == translate_lines(limited, tokenizer, lines, num_beams=1, **given), given
        lengths = [len(tokenizer(line, add_special_tokens=False).input_ids) for line in got]
        assert max(lengths) == (5 if given else limit), (given, lengths)  # the limit binds (</s> counts in it)


def test_the_length_rule_of_an_export_is_the_one_our_generate_applies():
    """`length_rule` (the CTranslate2 engine's limit from an exported generation config and the options given) against
    the number of tokens our `generate` makes from the same config and options, with `</s>` forbidden."""
    from vaswani_transformer.ctranslate2_export import length_rule

    torch.manual_seed(0)
    model = VaswaniTransformerForConditionalGeneration(VaswaniTransformerConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=32)).eval()  # fmt: skip
    sources = torch.tensor([[5, 6, 7, 2, 0, 0, 0], [5, 6, 7, 8, 9, 10, 2]])
    saved_configs = [{}, {"max_new_tokens": 3}, {"max_length": 6}, {"max_length": 20}, {"max_len_b": None},
                     {"max_len_b": None, "max_length": 9}, {"max_len_a": 0.5, "max_len_b": 2}]  # fmt: skip
    paper = copy.deepcopy(model.generation_config)
    for saved in saved_configs:
        for given in ({}, {"max_len_a": 0, "max_len_b": 4}):
            config = copy.deepcopy(paper)
            config.update(**saved)
            model.generation_config = config
            output = model.generate(input_ids=sources, num_beams=1, suppress_tokens=[2, 0], **given)
            defaults = {**{"max_len_a": 1, "max_len_b": 50}, **saved}
            a, b = length_rule(defaults, given.get("max_len_a"), given.get("max_len_b"))
            limits = [int(a * n + b) for n in (4, 7)]
            assert output.shape[1] - 1 == max(limits), (saved, given)


def test_sources_and_outputs_longer_than_the_exported_position_table(trained, tmp_path, caplog):
    """CTranslate2 fails on a position past the exported table without naming the line; the export records the
    table's rows, and translating cuts a longer source with a warning naming the line (refuses it with `strict`) and
    stops decoding at the table's end: our model's output on the cut source with that many new tokens at most."""
    from vaswani_transformer.ctranslate2_export import translate_file_ctranslate2

    model, tokenizer, test_pairs, folder = trained
    export_ctranslate2(str(folder / "model"), str(tmp_path / "ct2"), max_positions=12)
    translator, loaded_tokenizer, defaults = load_translator(str(tmp_path / "ct2"), intra_threads=1)
    assert defaults["max_positions"] == 12 and defaults["num_beams"] == 4
    assert "The position table holds 12 positions" in (tmp_path / "ct2" / "README_ctranslate2.md").read_text()
    long_line = " ".join(s for s, _ in test_pairs[:4])
    ids = tokenizer(long_line).input_ids
    assert len(ids) > 12
    lines = [test_pairs[5][0], long_line]
    with caplog.at_level("WARNING"):
        got = translate_lines_ctranslate2(translator, loaded_tokenizer, lines, num_beams=1, source_name="in.txt",
                                          max_positions=defaults["max_positions"])  # fmt: skip
    assert "in.txt:2: the source has" in caplog.text and "translating its first 12" in caplog.text
    sources = [tokenizer(lines[0]).input_ids, ids[:11] + [tokenizer.eos_token_id]]
    expected = [tokenizer.decode(out) for out in ours(model, tokenizer, sources, num_beams=1, max_new_tokens=12)]
    assert got == expected
    with pytest.raises(ValueError, match="in.txt:2: the source has"):
        translate_lines_ctranslate2(translator, loaded_tokenizer, lines, source_name="in.txt", strict=True,
                                    max_positions=12)  # fmt: skip
    with pytest.raises(ValueError, match="source of .* tokens is longer than the export's position table"):
        translate_tokens(translator, [tokenizer.convert_ids_to_tokens(ids)], max_positions=12)
    # A folder exported before the table's size was recorded: CTranslate2's error, with what it means.
    config = json.loads((tmp_path / "ct2" / "config.json").read_text(encoding="utf-8"))
    del config["max_positions"]
    (tmp_path / "ct2" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    old_translator, _, old_defaults = load_translator(str(tmp_path / "ct2"), intra_threads=1)
    assert "max_positions" not in old_defaults
    with pytest.raises(ValueError, match="longer than the export's position table; export the model again"):
        translate_lines_ctranslate2(old_translator, loaded_tokenizer, lines, num_beams=1)
    config["max_positions"] = 12
    (tmp_path / "ct2" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    # translate --engine ctranslate2 reads the table's size from the folder.
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert translate_file_ctranslate2(str(tmp_path / "ct2"), str(tmp_path / "in.txt"), str(tmp_path / "out.txt"),
                                      num_beams=1) == 2  # fmt: skip
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:2] == expected


def test_bad_input_is_a_clear_error(trained, tmp_path):
    from transformers import MarianConfig, MarianMTModel

    *_, folder = trained
    with pytest.raises(ValueError, match="'int4'.*not supported"):
        check_quantization("int4")
    marian = MarianMTModel(MarianConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                        decoder_ffn_dim=32, pad_token_id=0, decoder_start_token_id=0))  # fmt: skip
    marian.save_pretrained(tmp_path / "marian")
    with pytest.raises(ValueError, match="'marian' model, not a vaswani_transformer one"):
        export_ctranslate2(str(tmp_path / "marian"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="not a CTranslate2 model folder"):
        load_translator(str(folder / "model"))
    model, tokenizer, _, _ = trained
    config = VaswaniTransformerConfig(d_model=32, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=32, d_k=8,
                                      d_v=16, **config_kwargs_from_tokenizer(tokenizer))  # fmt: skip
    VaswaniTransformerForConditionalGeneration(config).save_pretrained(tmp_path / "dv")
    tokenizer.save_pretrained(tmp_path / "dv")
    with pytest.raises(ValueError, match="CTranslate2 needs d_k == d_v; this model has d_k=8, d_v=16"):
        export_ctranslate2(str(tmp_path / "dv"), str(tmp_path / "out"))
    model.config.bos_token_id = None  # (a TypeError of the converter before)
    model.save_pretrained(tmp_path / "nobos")
    tokenizer.save_pretrained(tmp_path / "nobos")
    model.config.bos_token_id = tokenizer.bos_token_id
    with pytest.raises(ValueError, match="CTranslate2's model config needs bos_token_id; this model has none"):
        export_ctranslate2(str(tmp_path / "nobos"), str(tmp_path / "out"))


def test_max_source_length_below_1_is_refused_as_by_our_engine(trained, tmp_path, capsys):
    # 0 became the export's position table and -3 cut every source, where our engine refuses both
    from vaswani_transformer.translate import main as translate_main

    *_, folder = trained
    translator, tokenizer, defaults = load_translator(str(folder / "float32"), intra_threads=1)
    (tmp_path / "in.txt").write_text("a b c\n", encoding="utf-8")
    for bad in (0, -3):
        message = f"max_source_length must be at least 1 (the </s> token), got {bad}."
        for max_positions in (None, defaults["max_positions"]):
            with pytest.raises(ValueError, match=re.escape(message)):
                translate_lines_ctranslate2(translator, tokenizer, ["a b c"], max_source_length=bad,
                                            max_positions=max_positions)  # fmt: skip
        for engine, model in (("ctranslate2", "float32"), ("transformers", "model")):
            argv = ["--engine", engine, "--model", str(folder / model), "--input", str(tmp_path / "in.txt"), "--output",
                    str(tmp_path / "out.txt"), "--max_source_length", str(bad), "--no-progress"]  # fmt: skip
            assert translate_main(argv) == 1
            assert f"error: {message}" in capsys.readouterr().err


def test_export_script(trained, tmp_path, capsys):
    *_, folder = trained
    command = [sys.executable, os.path.join(REPO, "scripts", "export_ctranslate2.py"), "--model_name_or_path",
               str(folder / "model"), "--output_dir", str(tmp_path / "out"),
               "--quantization", "int8_float32"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "README_ctranslate2.md"):
        assert (tmp_path / "out" / name).exists(), name
    readme = (tmp_path / "out" / "README_ctranslate2.md").read_text()
    assert "without VNNI" in readme and "CT2_USE_MKL=1" in readme  # int8: where its products saturate
    snippet = readme.split("```python\n")[1].split("```")[0].replace("path/to/this/folder", str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0 and result.stdout.startswith("['"), result.stderr  # the folder's README snippet runs
    # Errors, in process (the same `main`): an existing folder without --force, a quantization it does not offer.
    assert main(command[2:]) == 1 and "already exists, use --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(command[2:-1] + ["int3"])
    assert exit_info.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err
    for bad in ("0", "-5"):  # 0 became the default table silently, -5 a numpy error
        with pytest.raises(SystemExit) as exit_info:
            main([*command[2:-2], "--max_positions", bad, "--force"])
        assert exit_info.value.code == 2 and f"--max-positions: must be >= 1, got {bad}" in capsys.readouterr().err


def test_the_exported_decoding_reaches_python_users_and_the_folders_readme(trained, tmp_path):
    """`decoding_options(defaults)` and the export's README snippet decode with the exported generation config
    (here beam 2, alpha 1.4, a 3-token limit), not with the paper's beam 4 and alpha 0.6 written in."""
    from vaswani_transformer.ctranslate2_export import decoding_options

    model, tokenizer, test_pairs, folder = trained
    tuned = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "model").eval()
    for name, value in (("num_beams", 2), ("length_penalty", 1.4), ("max_len_a", 0), ("max_len_b", 3)):
        setattr(tuned.generation_config, name, value)
    tuned.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    export_ctranslate2(str(tmp_path / "model"), str(tmp_path / "ct2"))
    translator, loaded_tokenizer, defaults = load_translator(str(tmp_path / "ct2"), intra_threads=1)
    options = decoding_options(defaults)
    assert {k: options[k] for k in ("num_beams", "length_penalty", "max_len_a", "max_len_b")} == dict(
        num_beams=2, length_penalty=1.4, max_len_a=0, max_len_b=3)
    assert decoding_options(defaults, num_beams=1)["num_beams"] == 1  # a keyword given beats the folder's
    line = test_pairs[0][0]
    expected = translate_lines_ctranslate2(translator, loaded_tokenizer, [line], **options)
    assert len(tokenizer(expected[0], add_special_tokens=False).input_ids) <= 3
    assert expected == [tokenizer.decode(out) for out in ours(tuned, tokenizer, [tokenizer(line).input_ids],
                                                                  length_penalty_type="transformers")]  # fmt: skip
    readme = (tmp_path / "ct2" / "README_ctranslate2.md").read_text(encoding="utf-8")
    assert "VNNI" not in readme  # a float32 export
    snippet = readme.split("```python\n")[1].split("```")[0].replace("path/to/this/folder", str(tmp_path / "ct2"))
    assert "beam_size=2, length_penalty=1.4" in snippet
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace("A man rides a bike.", line), {})
    assert printed.getvalue().strip() == repr(expected)


def test_the_generation_config_s_start_end_and_least_length_reach_ctranslate2_and_what_it_cannot_apply_is_refused(
    trained, tmp_path, caplog
):
    """The export decodes from the generation config's decoder start and stops at each of its end tokens, after
    `min_new_tokens`, as our `generate` does (before: the model config's start, the first end token only, no least
    length: other translations). With beams, CTranslate2 renormalises after forbidding the end: that is warned about
    (with a decoder started from </s>, 12 of 32 test translations differed). A field CTranslate2 cannot apply
    (`no_repeat_ngram_size`) is warned about at export and refused when translating, naming it (before: ignored)."""
    from collections import Counter

    from vaswani_transformer.ctranslate2_export import decoding_options
    from vaswani_transformer.translate import translate_lines

    model, tokenizer, test_pairs, folder = trained
    lines = [s for s, _ in test_pairs[:16]]
    plain = translate_lines(model, tokenizer, lines, length_penalty_type="transformers")
    frequent = Counter(i for line in plain for i in tokenizer(line, add_special_tokens=False).input_ids)
    settings = {"start": dict(decoder_start_token_id=tokenizer.eos_token_id, min_new_tokens=3),
                "ends": dict(eos_token_id=[tokenizer.eos_token_id, frequent.most_common(1)[0][0]], min_new_tokens=3)}
    for name, fields in settings.items():
        tuned = VaswaniTransformerForConditionalGeneration.from_pretrained(folder / "model").eval()
        tuned.generation_config.update(length_penalty_type="transformers", **fields)
        tuned.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        export_ctranslate2(str(tmp_path / name), str(tmp_path / f"{name}-ct2"))
        translator, loaded_tokenizer, defaults = load_translator(str(tmp_path / f"{name}-ct2"), intra_threads=1)
        for num_beams in (1, 4) if name == "ends" else (1,):
            expected = translate_lines(tuned, tokenizer, lines, num_beams=num_beams)
            assert expected != translate_lines(model, tokenizer, lines, num_beams=num_beams,
                                               length_penalty_type="transformers")  # fmt: skip
            caplog.clear()
            with caplog.at_level("WARNING", logger="vaswani_transformer.ctranslate2_export"):
                options = decoding_options(defaults, num_beams=num_beams)
            assert ("renormalises" in caplog.text) == (num_beams > 1)
            got = translate_lines_ctranslate2(translator, loaded_tokenizer, lines, **options)
            assert got == expected, (name, num_beams)
    tuned.generation_config.no_repeat_ngram_size = 2
    tuned.save_pretrained(tmp_path / "ngram")
    tokenizer.save_pretrained(tmp_path / "ngram")
    with caplog.at_level("WARNING", logger="vaswani_transformer.ctranslate2_export"):
        export_ctranslate2(str(tmp_path / "ngram"), str(tmp_path / "ngram-ct2"))
    assert "no_repeat_ngram_size=2" in caplog.text
    with pytest.raises(ValueError, match=r"sets no_repeat_ngram_size=2: our generate applies it, CTranslate2 cannot"):
        translate_file_ctranslate2(str(tmp_path / "ngram-ct2"), str(tmp_path / "in.txt"), str(tmp_path / "out.txt"))


def test_translate_cli_engine_ctranslate2(trained, tmp_path):
    """`translate --engine ctranslate2` on an export: one line per input line, with the folder's decoding defaults
    (beam 4, alpha 0.6), the output of our model with `length_penalty_type="transformers"`."""
    from vaswani_transformer.translate import main as translate_main

    model, tokenizer, test_pairs, folder = trained
    lines = [s for s, _ in test_pairs[:6]]
    lines.insert(2, "")
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--engine", "ctranslate2", "--model_name_or_path", str(folder / "float32"), "--input",
            str(tmp_path / "input.txt"), "--output", str(tmp_path / "output.txt"), "--max_tokens", "40"]  # fmt: skip
    assert translate_main(argv) == 0
    written = (tmp_path / "output.txt").read_text(encoding="utf-8").split("\n")[:-1]
    sources = [tokenizer(line).input_ids for line in lines if line]
    expected = [tokenizer.decode(ids) for ids in ours(model, tokenizer, sources, num_beams=4, length_penalty=0.6,
                                                       length_penalty_type="transformers")]  # fmt: skip
    expected.insert(2, "")
    assert written == expected
    assert translate_main(argv[:3] + [str(folder / "model")] + argv[4:]) == 1  # not an export: an error line


def test_evaluate_cli_engine_ctranslate2_scores_the_exports_translations(trained, tmp_path):
    """`vaswani-evaluate --engine ctranslate2` (a real subprocess) on a float32 export: the hypotheses are our model's
    beam output with `length_penalty_type="transformers"` (the export's rule, with the folder's beam 4 and alpha
    0.6), the scores are sacreBLEU's of them, and the report names the engine, its compute type and its rule."""
    import sacrebleu

    model, tokenizer, test_pairs, folder = trained
    pairs = test_pairs[:12]
    (tmp_path / "test.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "test.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    command = [sys.executable, os.path.join(REPO, "scripts", "evaluate_model.py"), "--engine", "ctranslate2",
               "--model_name_or_path", str(folder / "float32"), "--test_file", str(tmp_path / "test"),
               "--source_lang", "src", "--target_lang", "tgt", "--output_json", str(tmp_path / "eval.json"),
               "--hypotheses_file", str(tmp_path / "hyp.tgt"), "--tokenize", "13a"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "eval.json").read_text(encoding="utf-8"))
    assert report == json.loads(done.stdout)
    hypotheses = (tmp_path / "hyp.tgt").read_text(encoding="utf-8").split("\n")[:-1]
    sources = [tokenizer(s).input_ids for s, _ in pairs]
    expected = [tokenizer.decode(ids) for ids in ours(model, tokenizer, sources, num_beams=4, length_penalty=0.6,
                                                       length_penalty_type="transformers")]  # fmt: skip
    assert hypotheses == expected
    references = [t for _, t in pairs]
    assert report["sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-12)
    assert (report["engine"], report["compute_type"], report["num_sentences"]) == ("ctranslate2", "float32", 12)
    assert report["source_file"] == str(tmp_path / "test.src") and report["first_source_line"] == pairs[0][0]
    decoding = report["decoding"]
    assert (decoding["num_beams"], decoding["length_penalty"], decoding["length_penalty_type"]) == (
        4, 0.6, "transformers")
    assert decoding["translate_fn"] == "vaswani_transformer.ctranslate2_export.translate_lines_ctranslate2"


def test_evaluate_engine_ctranslate2_options_and_bad_input(trained, tmp_path, capsys):
    """The command line's decoding options reach CTranslate2 (`--num_beams 1`: our greedy output); options only our
    engine honours, unknown `--decoding` keys, `--engine` beside `--hypotheses` and a folder that is not an export are
    errors naming them."""
    from vaswani_transformer.evaluation import main

    model, tokenizer, test_pairs, folder = trained
    pairs = test_pairs[:6]
    (tmp_path / "test.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "test.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    common = ["--engine", "ctranslate2", "--source", str(tmp_path / "test.src"), "--reference",
              str(tmp_path / "test.tgt"), "--model_name_or_path"]  # fmt: skip
    assert main([*common, str(folder / "float32"), "--num_beams", "1", "--decoding", "max_tokens=16",
                 "--hypotheses_file", str(tmp_path / "greedy.tgt")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert (report["decoding"]["num_beams"], report["decoding"]["max_tokens"]) == (1, 16)
    greedy = [tokenizer.decode(ids) for ids in ours(model, tokenizer, [tokenizer(s).input_ids for s, _ in pairs],
                                                     num_beams=1)]  # fmt: skip
    assert (tmp_path / "greedy.tgt").read_text(encoding="utf-8").split("\n")[:-1] == greedy

    for extra, message in ((["--dtype", "bfloat16"], "--dtype need --engine transformers"),
                           (["--quantization", "int8"], "--quantization need --engine transformers")):  # fmt: skip
        with pytest.raises(SystemExit):
            main([*common, str(folder / "float32"), *extra])
        assert message in capsys.readouterr().err
    assert main([*common, str(folder / "float32"), "--decoding", "do_sample=true"]) == 1
    error = capsys.readouterr().err
    assert "do_sample" in error and "not options of the ctranslate2 engine" in error and "max_tokens" in error
    assert main([*common, str(folder / "model")]) == 1
    assert "not a CTranslate2 model folder (no model.bin)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--hypotheses", str(tmp_path / "test.tgt"), "--reference", str(tmp_path / "test.tgt"), "--engine",
              "ctranslate2"])  # fmt: skip
    assert "--engine is for translating" in capsys.readouterr().err
