"""Property tests (hypothesis): random small configurations and inputs, each property against a plain reference.

Configurations: d_model, h, d_k and d_v drawn apart as Table 3's rows set them (d_k != d_model / h), 1-2 layers,
small vocabularies, the three positional encodings, shared or separate embeddings, dropout 0, eval mode, float64
where a comparison needs it; inputs: random sentences of 1 to 12 tokens. Every property is a `check_*` function that
the hypothesis tests call with drawn inputs and `test_table3_rows_keep_every_property` calls for each Table 3 row
scaled down. `derandomize=True`: the examples are the same on every run (CI is deterministic).
"""

import functools
import math
import random
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForSeq2SeqLM

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.configuration_vaswani_transformer import PRESETS
from vaswani_transformer.generation import paper_beam_search

PAD, BOS, EOS = 0, 1, 2
FIRST_WORD = 4  # ids below are special tokens
MAX_LENGTH = 12
ATTENTION = ("eager", "sdpa")
TOLERANCE = dict(atol=1e-9, rtol=1e-9)  # float64 models
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- random configurations, models and sentences ---------------------------------------------------------------------


@st.composite
def configs(draw) -> VaswaniTransformerConfig:
    """A small random configuration, many with d_k and d_v set apart from d_model / h (as Table 3 rows A-C)."""
    num_heads = draw(st.integers(1, 4))
    if draw(st.booleans()):
        d_model = draw(st.sampled_from([5, 6, 8, 12, 16]))
        d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    else:
        d_model, d_k, d_v = num_heads * draw(st.integers(2, 4)), None, None
    position_encoding = draw(st.sampled_from(["sinusoidal", "tensor2tensor", "learned"]))
    if d_model < 4:
        position_encoding = "sinusoidal"
    return VaswaniTransformerConfig(
        vocab_size=draw(st.integers(8, 24)),
        d_model=d_model,
        encoder_layers=draw(st.integers(1, 2)),
        decoder_layers=draw(st.integers(1, 2)),
        num_heads=num_heads,
        d_ff=draw(st.sampled_from([8, 16, 32])),
        d_k=d_k,
        d_v=d_v,
        dropout=0.0,
        position_encoding=position_encoding,
        max_position_embeddings=64,
        share_embeddings=draw(st.booleans()),
        scale_embedding=draw(st.booleans()),
        init_std=draw(st.sampled_from([None, 1.0])),  # 1.0: large embeddings, outputs that differ between tokens
    )


def build(config, seed: int, attention: str = "sdpa", dtype=torch.float64, eos_bias: float = 0.0):
    """A random model in eval mode; `eos_bias` > 0 makes </s> likelier (through the last decoder LayerNorm's bias)."""
    torch.manual_seed(seed)
    model = VaswaniTransformerForConditionalGeneration(config).to(dtype).eval()
    model.set_attn_implementation(attention)
    if eos_bias:
        with torch.no_grad():
            direction = model.lm_head.weight[EOS]
            model.model.decoder.layers[-1].feed_forward_residual.layer_norm.bias.copy_(
                eos_bias * direction / direction.norm()
            )
    return model


def words(vocab_size: int, min_size: int = 1, max_size: int = MAX_LENGTH - 1):
    return st.lists(st.integers(FIRST_WORD, vocab_size - 1), min_size=min_size, max_size=max_size)


def sentences(vocab_size: int):
    """A source sentence: 0 to 11 words, then </s> (1 to 12 tokens)."""
    return words(vocab_size, 0).map(lambda tokens: tokens + [EOS])


def pad(rows: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded to one width on the given side, and their mask (1 for a real token)."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        place = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[i, place], mask[i, place] = torch.tensor(row), 1
    return ids, mask


def real(values: torch.Tensor, mask_row: torch.Tensor) -> torch.Tensor:
    """The entries of one row at its real (unpadded) places."""
    return values[mask_row.bool()]


def unpadded(sequence: torch.Tensor) -> list[int]:
    """A generated sequence without the padding after its end."""
    tokens = sequence.tolist()
    while tokens and tokens[-1] == PAD:
        tokens.pop()
    return tokens


@torch.no_grad()
def logits(model, source, target, **kwargs) -> torch.Tensor:
    return model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target]), **kwargs).logits[0]


# --- the properties ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def check_causality(model, source: list[int], target: list[int], t: int, new_tail: list[int]):
    """Decoder outputs up to t do not depend on the decoder tokens after t."""
    changed = target[: t + 1] + new_tail
    before, after = logits(model, source, target), logits(model, source, changed)
    torch.testing.assert_close(after[: t + 1], before[: t + 1], **TOLERANCE)
    if changed[t + 1] != target[t + 1]:  # the test sees the change where it may show
        assert not torch.allclose(after[t + 1], before[t + 1], **TOLERANCE)


@torch.no_grad()
def check_encoder_padding(model, sources: list[list[int]], side: str, target: list[int]):
    """A padded batch of sources (with attention_mask, padding on either side) equals each sentence alone."""
    ids, mask = pad(sources, side)
    batch = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor([target] * len(sources)),
        output_hidden_states=True,
    )  # fmt: skip
    for i, source in enumerate(sources):
        alone = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target]))
        torch.testing.assert_close(batch.logits[i], alone.logits[0], **TOLERANCE)
        encoded = real(batch.encoder_last_hidden_state[i], mask[i])
        torch.testing.assert_close(encoded, alone.encoder_last_hidden_state[0], **TOLERANCE)


@torch.no_grad()
def check_decoder_padding(model, sources: list[list[int]], targets: list[list[int]], side: str):
    """A padded batch of decoder inputs (right padding, or a left-padded prompt: decoder_attention_mask with leading
    zeros) gives each sentence the logits it has alone, at every real place; padding places stay finite."""
    source_ids, source_mask = pad(sources, "right")
    target_ids, target_mask = pad(targets, side)
    batch = model(
        input_ids=source_ids, attention_mask=source_mask, decoder_input_ids=target_ids,
        decoder_attention_mask=target_mask,
    ).logits  # fmt: skip
    assert torch.isfinite(batch).all()
    for i, (source, target) in enumerate(zip(sources, targets)):
        torch.testing.assert_close(real(batch[i], target_mask[i]), logits(model, source, target), **TOLERANCE)


@torch.no_grad()
def check_cache(model, sources: list[list[int]], prompts: list[list[int]], continuation: list[list[int]], side: str):
    """Decoding a (padded) prompt of several tokens, then one token at a time with the cache, equals one full forward
    pass over the whole decoder input (real places), and the cache holds every token."""
    source_ids, source_mask = pad(sources, "right")
    prompt_ids, prompt_mask = pad(prompts, side)
    following = torch.tensor(continuation)
    full_ids = torch.cat([prompt_ids, following], dim=-1)
    full_mask = torch.cat([prompt_mask, torch.ones_like(following)], dim=-1)
    full = model(
        input_ids=source_ids, attention_mask=source_mask, decoder_input_ids=full_ids, decoder_attention_mask=full_mask
    ).logits
    encoder_outputs = model.get_encoder()(input_ids=source_ids, attention_mask=source_mask)
    step = model(
        encoder_outputs=encoder_outputs, attention_mask=source_mask, decoder_input_ids=prompt_ids,
        decoder_attention_mask=prompt_mask, use_cache=True,
    )  # fmt: skip
    pieces, cache = [step.logits], step.cache
    for t in range(following.shape[1]):
        width = prompt_ids.shape[1] + t + 1
        step = model(
            encoder_outputs=encoder_outputs, attention_mask=source_mask, decoder_input_ids=following[:, t : t + 1],
            decoder_attention_mask=full_mask[:, :width], cache=cache, use_cache=True,
        )  # fmt: skip
        pieces.append(step.logits)
        cache = step.cache
    assert cache.get_seq_length() == full_ids.shape[1]
    stepwise = torch.cat(pieces, dim=1)
    for i in range(len(sources)):
        torch.testing.assert_close(real(stepwise[i], full_mask[i]), real(full[i], full_mask[i]), **TOLERANCE)


def check_generation_batch_invariance(model, sources: list[list[int]], side: str, generate_kwargs: dict):
    """`generate` gives a sentence the same output tokens (and beam scores) alone and inside a padded batch of
    sentences of other lengths."""
    ids, mask = pad(sources, side)
    beam = generate_kwargs.get("num_beams", 1) > 1
    kwargs = dict(generate_kwargs, return_dict_in_generate=True, output_scores=beam)
    batch = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    n = generate_kwargs.get("num_return_sequences", 1)
    for i, source in enumerate(sources):
        alone = model.generate(input_ids=torch.tensor([source]), **kwargs)
        for j in range(n):
            assert unpadded(batch.sequences[i * n + j]) == unpadded(alone.sequences[j]), (i, j)
        if beam:
            torch.testing.assert_close(batch.sequences_scores[i * n : (i + 1) * n], alone.sequences_scores)


def check_beam_one_is_greedy(model, sources: list[list[int]], side: str, max_new_tokens: int):
    """Beam size 1 is greedy decoding: `generate(num_beams=1)` under either rule set (as tensor2tensor, which decodes
    greedily for beam size 1), and the paper's beam search itself at width 1 with fairseq's rules."""
    ids, mask = pad(sources, side)
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
    greedy = model.generate(**kwargs, num_beams=1, length_penalty_type="transformers")
    for rules in ("t2t", "fairseq"):
        assert torch.equal(model.generate(**kwargs, num_beams=1, beam_search_rules=rules), greedy)
    width_one = model.generate(
        **kwargs, num_beams=1, custom_generate=functools.partial(paper_beam_search, paper_beam_search_rules="fairseq")
    )
    assert [unpadded(row) for row in width_one] == [unpadded(row) for row in greedy]


def tied_pointers(model) -> set[int]:
    """data_ptr of the source embeddings, target embeddings and output projection."""
    return {
        model.model.encoder.embedding.embed_tokens.weight.data_ptr(),
        model.model.decoder.embedding.embed_tokens.weight.data_ptr(),
        model.lm_head.weight.data_ptr(),
    }


@torch.no_grad()
def check_save_and_load(model, source: list[int], target: list[int]):
    """save_pretrained -> from_pretrained gives the same weights bit for bit and the same logits; shared embeddings and
    output projection stay one tensor (three separate ones without sharing).

    Logits agree to float32 rounding, not bit for bit: the loaded weights lie where safetensors put them, and CPU
    kernels round differently for differently aligned memory (the same weights cloned give identical logits)."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    loaded.set_attn_implementation(model.config._attn_implementation)
    assert type(loaded) is type(model) and loaded.dtype == model.dtype
    saved, restored = model.state_dict(), loaded.state_dict()
    assert saved.keys() == restored.keys()
    assert all(torch.equal(saved[name], restored[name]) for name in saved)
    torch.testing.assert_close(logits(loaded, source, target), logits(model, source, target), atol=1e-6, rtol=1e-6)
    expected = 1 if model.config.share_embeddings else 3
    assert len(tied_pointers(model)) == len(tied_pointers(loaded)) == expected
    if model.config.share_embeddings:
        assert tied_pointers(loaded) == {loaded.model.shared.weight.data_ptr()}


# --- hypothesis tests -------------------------------------------------------------------------------------------------


@settings(max_examples=25, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), attention=st.sampled_from(ATTENTION), data=st.data())
def test_decoder_outputs_at_t_do_not_depend_on_later_tokens(config, seed, attention, data):
    model = build(config, seed, attention)
    target = [BOS] + data.draw(words(config.vocab_size, 1))
    t = data.draw(st.integers(0, len(target) - 2))
    new_tail = data.draw(words(config.vocab_size, len(target) - t - 1, len(target) - t - 1))
    check_causality(model, data.draw(sentences(config.vocab_size)), target, t, new_tail)


@settings(max_examples=25, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), attention=st.sampled_from(ATTENTION), data=st.data())
def test_a_padded_source_batch_equals_each_sentence_alone(config, seed, attention, data):
    model = build(config, seed, attention)
    sources = data.draw(st.lists(sentences(config.vocab_size), min_size=2, max_size=4))
    side = data.draw(st.sampled_from(["right", "left"]))
    check_encoder_padding(model, sources, side, [BOS] + data.draw(words(config.vocab_size, 0, 4)))


@settings(max_examples=25, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), attention=st.sampled_from(ATTENTION), data=st.data())
def test_a_padded_decoder_batch_equals_each_sentence_alone(config, seed, attention, data):
    """Right padding, and left-padded decoder prompts (each real token at the position it has alone)."""
    model = build(config, seed, attention)
    count = data.draw(st.integers(2, 4))
    sources = data.draw(st.lists(sentences(config.vocab_size), min_size=count, max_size=count))
    targets = data.draw(st.lists(words(config.vocab_size, 0).map(lambda w: [BOS] + w), min_size=count, max_size=count))
    check_decoder_padding(model, sources, targets, data.draw(st.sampled_from(["right", "left"])))


@settings(max_examples=25, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), attention=st.sampled_from(ATTENTION), data=st.data())
def test_stepwise_decoding_with_the_cache_equals_the_full_forward_pass(config, seed, attention, data):
    model = build(config, seed, attention)
    count = data.draw(st.integers(1, 3))
    sources = data.draw(st.lists(sentences(config.vocab_size), min_size=count, max_size=count))
    prompt = words(config.vocab_size, 0, 6).map(lambda w: [BOS] + w)
    prompts = data.draw(st.lists(prompt, min_size=count, max_size=count))
    steps = data.draw(st.integers(1, 5))
    continuation = data.draw(st.lists(words(config.vocab_size, steps, steps), min_size=count, max_size=count))
    check_cache(model, sources, prompts, continuation, data.draw(st.sampled_from(["right", "left"])))


@settings(max_examples=25, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_generation_is_the_same_for_a_sentence_alone_and_in_a_batch(config, seed, data):
    model = build(config, seed, eos_bias=data.draw(st.sampled_from([0.0, 2.0, 4.0])))
    sources = data.draw(st.lists(sentences(config.vocab_size), min_size=2, max_size=4))
    decoding = data.draw(st.sampled_from(["greedy", "t2t", "fairseq"]))
    if decoding == "greedy":
        kwargs = dict(num_beams=1, do_sample=False, max_new_tokens=data.draw(st.integers(1, 8)))
    else:  # the paper's beam search, with its per-sentence length rule max_len_a * source length + max_len_b
        num_beams = data.draw(st.integers(2, 4))
        kwargs = dict(
            num_beams=num_beams, beam_search_rules=decoding, max_len_a=data.draw(st.sampled_from([0, 1])),
            max_len_b=data.draw(st.integers(1, 4)), num_return_sequences=data.draw(st.integers(1, num_beams)),
            length_penalty=data.draw(st.sampled_from([0.6, 0.0, 1.0])),
        )  # fmt: skip
    check_generation_batch_invariance(model, sources, data.draw(st.sampled_from(["right", "left"])), kwargs)


@settings(max_examples=15, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_beam_search_with_one_beam_is_greedy(config, seed, data):
    model = build(config, seed, eos_bias=data.draw(st.sampled_from([0.0, 3.0])))
    sources = data.draw(st.lists(sentences(config.vocab_size), min_size=1, max_size=3))
    side = data.draw(st.sampled_from(["right", "left"]))
    check_beam_one_is_greedy(model, sources, side, data.draw(st.integers(1, 8)))


@settings(max_examples=10, **SETTINGS)
@given(config=configs(), seed=st.integers(0, 2**16), attention=st.sampled_from(ATTENTION), data=st.data())
def test_save_and_load_keep_the_weights_the_logits_and_one_tied_tensor(config, seed, attention, data):
    model = build(config, seed, attention, dtype=torch.float32)
    source = data.draw(sentences(config.vocab_size))
    check_save_and_load(model, source, [BOS] + data.draw(words(config.vocab_size, 0, 6)))


def paper_encoding(position: int, d_model: int, layout: str) -> list[float]:
    """The paper's PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...), or the authors' code's
    [sin(pos w_i) | cos(pos w_i)], w_i = 10000^(-i/(d_model/2 - 1)) (an odd last column 0), in float64."""
    if layout == "sinusoidal":
        return [
            (math.sin if j % 2 == 0 else math.cos)(position / 10000 ** (2 * (j // 2) / d_model)) for j in range(d_model)
        ]
    half = d_model // 2
    angles = [position * 10000 ** (-i / (half - 1)) for i in range(half)]
    return [math.sin(a) for a in angles] + [math.cos(a) for a in angles] + [0.0] * (d_model % 2)


@settings(max_examples=25, **SETTINGS)
@given(
    d_model=st.integers(4, 64),
    layout=st.sampled_from(["sinusoidal", "tensor2tensor"]),
    position_offset=st.sampled_from([0, 2]),
    positions=st.lists(st.integers(0, 20_000), min_size=0, max_size=4).map(lambda p: [2000, 10_000] + p),
)
def test_positions_far_beyond_training_lengths_are_finite_and_the_formula(d_model, layout, position_offset, positions):
    config = VaswaniTransformerConfig(
        vocab_size=8, d_model=d_model, num_heads=1, d_ff=8, encoder_layers=1, decoder_layers=1, dropout=0.0,
        position_encoding=layout, position_offset=position_offset,
    )  # fmt: skip
    model = build(config, 0)
    formula = [paper_encoding(p + position_offset, d_model, layout) for p in positions]
    expected = torch.tensor(formula, dtype=torch.double)
    ids = torch.tensor([positions])
    like64, like32 = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float32)
    for embedding in (model.model.encoder.embedding, model.model.decoder.embedding):
        # A float64 model computes the angles in float64: the formula to rounding, at any position.
        encoded = embedding.embed_positions(len(positions), 0, like=like64, position_ids=ids)[0]
        torch.testing.assert_close(encoded, expected, atol=1e-9, rtol=0)
        # The cached-decoding path: a run of positions from an offset.
        run = embedding.embed_positions(3, positions[-1], like=like64)
        formula = [paper_encoding(positions[-1] + k + position_offset, d_model, layout) for k in range(3)]
        torch.testing.assert_close(run, torch.tensor(formula, dtype=torch.double), atol=1e-9, rtol=0)
        # float32: finite, off by the float32 rounding of an angle as large as the position (eps * angle).
        encoded32 = embedding.embed_positions(len(positions), 0, like=like32, position_ids=ids)[0]
        assert torch.isfinite(encoded32).all()
        bound = 4 * torch.finfo(torch.float32).eps * (ids[0].double()[:, None] + position_offset + 1)
        assert ((encoded32.double() - expected).abs() <= bound).all()
    # Section 3.4 + 3.5 at those positions: embeddings x sqrt(d_model) + the formula; the forward pass is finite.
    tokens = torch.tensor([[BOS] + [5] * (len(positions) - 1)])
    embedding = model.model.decoder.embedding
    scaled = embedding.embed_tokens.weight[tokens[0]] * math.sqrt(d_model)
    torch.testing.assert_close(embedding(tokens, position_ids=ids)[0], scaled + expected, atol=1e-9, rtol=0)
    out = model(input_ids=torch.tensor([[5, EOS]]), decoder_input_ids=tokens, decoder_position_ids=ids).logits
    assert torch.isfinite(out).all()


# --- Table 3 shapes ---------------------------------------------------------------------------------------------------

# The rows that change a width, h or the positional encoding (scaled down, the N and P_drop rows are base's shape).
SCALED_AWAY = {"dropout", "encoder_layers", "decoder_layers"}
TABLE3_ROWS = [name for name, row in PRESETS.items() if set(row["model"]) - SCALED_AWAY]


def scaled_down(name: str) -> VaswaniTransformerConfig:
    """A Table 3 row at 1/16 of its widths (d_model, d_ff, d_k, d_v; h kept), at most 2 layers, vocabulary 20."""
    row = VaswaniTransformerConfig.from_preset(name)
    return VaswaniTransformerConfig(
        vocab_size=20, d_model=row.d_model // 16, num_heads=row.num_heads, d_k=max(1, row.head_dim_k // 16),
        d_v=max(1, row.head_dim_v // 16), d_ff=row.d_ff // 16, encoder_layers=min(row.encoder_layers, 2),
        decoder_layers=min(row.decoder_layers, 2), dropout=0.0, position_encoding=row.position_encoding,
        max_position_embeddings=64,
    )  # fmt: skip


@pytest.mark.parametrize("name", TABLE3_ROWS)
def test_table3_rows_keep_every_property(name):
    """Every property above on each Table 3 row (d_k != d_model / h in rows A and B), scaled down."""
    config = scaled_down(name)
    rng = random.Random(name)

    def word_list(n: int) -> list[int]:
        return [rng.randrange(FIRST_WORD, config.vocab_size) for _ in range(n)]

    sources = [word_list(n) + [EOS] for n in (6, 0, 11, 3)]
    targets = [[BOS] + word_list(n) for n in (3, 7, 0, 5)]
    for attention in ATTENTION:
        model = build(config, 0, attention)
        check_causality(model, sources[0], targets[1], 3, word_list(4))
        for side in ("right", "left"):
            check_encoder_padding(model, sources, side, targets[0])
            check_decoder_padding(model, sources, targets, side)
            check_cache(model, sources, targets, [word_list(3) for _ in sources], side)
    model = build(config, 0, eos_bias=3.0)
    check_generation_batch_invariance(model, sources, "left", dict(num_beams=1, do_sample=False, max_new_tokens=5))
    for rules in ("t2t", "fairseq"):
        kwargs = dict(num_beams=4, beam_search_rules=rules, max_len_b=4, num_return_sequences=2)
        check_generation_batch_invariance(model, sources, "right", kwargs)
    check_beam_one_is_greedy(model, sources, "right", 5)
    check_save_and_load(build(config, 0, dtype=torch.float32), sources[2], targets[1])
