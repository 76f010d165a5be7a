"""The model against the paper's equations and against independent float64 references."""

import contextlib
import copy
import math
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AttentionInterface, AutoModel, AutoModelForSeq2SeqLM, CompileConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_outputs import Seq2SeqModelOutput

from vaswani_transformer import (
    VaswaniTransformerForConditionalGeneration,
    VaswaniTransformerModel,
    sinusoidal_position_encoding,
)

from helpers import cpu_flags, cpu_vendor, tiny_config, tiny_model

PAD = 0


def random_ids(batch: int, length: int, seed: int = 1, vocab_size: int = 50) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab_size, (batch, length), generator=generator)


# --- 3.5 positional encoding -----------------------------------------------------------------------------------------


def test_positional_encoding_is_the_paper_formula_in_float64():
    num_positions, d_model = 300, 64
    expected = torch.empty(num_positions, d_model, dtype=torch.float64)
    for pos in range(num_positions):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            expected[pos, 2 * i] = math.sin(angle)
            expected[pos, 2 * i + 1] = math.cos(angle)
    actual = sinusoidal_position_encoding(num_positions, d_model)
    torch.testing.assert_close(actual.double(), expected, atol=5e-5, rtol=0)
    # Any length, any offset: the encoding is computed, not looked up in a table.
    torch.testing.assert_close(sinusoidal_position_encoding(5, d_model, offset=295), actual[295:])
    assert sinusoidal_position_encoding(5000, 8).shape == (5000, 8)


@pytest.mark.parametrize("layout", ["sinusoidal", "tensor2tensor"])
def test_the_model_s_kept_encodings_are_the_computed_ones_at_every_offset_length_and_dtype(layout):
    """The model keeps its first positions' encodings (decoding steps read one row): each offset and length, within
    the kept table and past it, in float32, bfloat16 and float64, is the computation of those positions alone."""
    from vaswani_transformer.modeling_vaswani_transformer import SinusoidalPositionalEncoding
    from vaswani_transformer.modeling_vaswani_transformer import tensor2tensor_position_encoding

    computation = sinusoidal_position_encoding if layout == "sinusoidal" else tensor2tensor_position_encoding
    module = SinusoidalPositionalEncoding(32, layout, position_offset=2)
    kept = SinusoidalPositionalEncoding.TABLE_POSITIONS
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        like = torch.empty(0, dtype=dtype)
        for offset, length in [(0, 1), (0, 7), (5, 1), (63, 2), (100, 30), (kept - 1, 1), (kept - 3, 6), (3000, 4)]:
            actual = module(length, offset, like)
            assert actual.dtype == dtype and actual.shape == (length, 32)
            computed = computation(length, 32, offset=offset + 2, dtype=dtype)
            torch.testing.assert_close(actual, computed, atol=2e-7 if dtype == torch.float32 else 0, rtol=0)
        assert len(module._table) == kept  # the rows came from the kept table


def test_a_float64_model_s_kept_encodings_come_from_float64_angles_and_writes_to_them_change_nothing():
    """After `.double()` the kept encodings are the formula to float64's rounding at position 1000, not float32's
    ~1e-4 (the table is not a buffer that `.to` would cast); what the module returns is a copy."""
    model = tiny_model()
    positions = model.model.decoder.embedding.embed_positions
    d_model, position = model.config.d_model, 1000
    positions(1, position, like=torch.empty(0))  # keeps float32 encodings up to there
    model = model.double()
    expected = torch.tensor([(math.sin if j % 2 == 0 else math.cos)(position / 10000 ** (2 * (j // 2) / d_model))
                             for j in range(d_model)], dtype=torch.float64)  # fmt: skip
    row = positions(1, position, like=torch.empty(0, dtype=torch.float64))
    torch.testing.assert_close(row[0], expected, atol=1e-12, rtol=0)
    row.fill_(7.0)
    torch.testing.assert_close(positions(1, position, like=torch.empty(0, dtype=torch.float64))[0], expected,
                               atol=1e-12, rtol=0)  # fmt: skip
    assert not any("position" in name for name in model.state_dict())


def test_positional_encoding_of_a_float64_model_is_the_formula_far_beyond_training_lengths():
    """A float64 model computes the angles in float64: position 10000 is the formula to rounding, not float32's 1e-4."""
    d_model, start = 64, 10_000
    expected = torch.tensor(
        [[(math.sin if j % 2 == 0 else math.cos)(pos / 10000 ** (2 * (j // 2) / d_model)) for j in range(d_model)]
         for pos in range(start, start + 3)],
        dtype=torch.float64,
    )  # fmt: skip
    torch.testing.assert_close(
        sinusoidal_position_encoding(3, d_model, offset=start, dtype=torch.float64), expected, atol=1e-12, rtol=0
    )


def test_sinusoidal_encoding_is_not_in_the_checkpoint():
    state = tiny_model().state_dict()
    assert not any("position" in name for name in state)


def test_embeddings_are_scaled_then_positions_added():
    model = tiny_model()
    ids = random_ids(1, 6)
    embedding = model.model.encoder.embedding
    expected = model.model.shared.weight[ids] * math.sqrt(32) + sinusoidal_position_encoding(6, 32)
    torch.testing.assert_close(embedding(ids), expected)


# --- reference implementation of one layer, written from the paper in float64 ----------------------------------------


def reference_attention(attn, queries, keys_values, mask):
    """Multi-head attention written out: per-head projections, softmax(QK^T / sqrt(d_k)) V, concatenation, W^O."""
    h, d_k, d_v = attn.num_heads, attn.d_k, attn.d_v
    q = queries @ attn.q_proj.weight.T + attn.q_proj.bias
    k = keys_values @ attn.k_proj.weight.T + attn.k_proj.bias
    v = keys_values @ attn.v_proj.weight.T + attn.v_proj.bias
    heads = []
    for i in range(h):
        qi, ki, vi = q[..., i * d_k : (i + 1) * d_k], k[..., i * d_k : (i + 1) * d_k], v[..., i * d_v : (i + 1) * d_v]
        scores = qi @ ki.transpose(-1, -2) / math.sqrt(d_k)
        scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vi)
    return torch.cat(heads, dim=-1) @ attn.o_proj.weight.T + attn.o_proj.bias


def reference_layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def reference_ffn(ffn, x):
    return torch.clamp(x @ ffn.w1.weight.T + ffn.w1.bias, min=0) @ ffn.w2.weight.T + ffn.w2.bias


def test_encoder_layer_is_post_ln():
    model = tiny_model().double()
    layer = model.model.encoder.layers[0]
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    mask = keep[:, None, :]  # (batch, query, key)
    with torch.no_grad():
        h = reference_layer_norm(x + reference_attention(layer.self_attn, x, x, mask), layer.self_attn_residual.layer_norm)
        expected = reference_layer_norm(h + reference_ffn(layer.feed_forward, h), layer.feed_forward_residual.layer_norm)
        actual = layer(x, keep[:, None, None, :].expand(2, 1, 5, 5))
    torch.testing.assert_close(actual, expected)


def test_decoder_layer_is_post_ln_with_causal_self_attention_and_cross_attention():
    model = tiny_model().double()
    layer = model.model.decoder.layers[1]
    y = torch.randn(2, 4, 32, dtype=torch.float64)
    memory = torch.randn(2, 6, 32, dtype=torch.float64)
    source_keep = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    with torch.no_grad():
        h = reference_layer_norm(y + reference_attention(layer.self_attn, y, y, causal), layer.self_attn_residual.layer_norm)
        h = reference_layer_norm(
            h + reference_attention(layer.encoder_attn, h, memory, source_keep[:, None, :]),
            layer.encoder_attn_residual.layer_norm,
        )
        expected = reference_layer_norm(h + reference_ffn(layer.feed_forward, h), layer.feed_forward_residual.layer_norm)
        actual = layer(y, causal[None, None].expand(2, 1, 4, 4), memory, source_keep[:, None, None, :].expand(2, 1, 4, 6))
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("activation_dropout", [0.0, 0.2])
def test_dropout_sits_where_section_5_4_puts_it(activation_dropout):
    """Training mode, P_drop 0.3: the model's logits equal a float64 reference written from the paper that applies
    dropout to the sums of embeddings and positional encodings and to each sub-layer's output before its residual
    addition and layer norm, nowhere else, drawing the masks in the order the paper's forward pass meets them (the
    CPU mask generator itself is tested below). A dropout left out, added or moved changes the masks or the sums.
    `activation_dropout` (not the paper's; fairseq's) drops the feed-forward network's hidden units, after the ReLU."""
    from vaswani_transformer.modeling_vaswani_transformer import dropout_keep_mask

    p = 0.3
    model = tiny_model(dropout=p, activation_dropout=activation_dropout).double().train()
    source, target = random_ids(2, 6), random_ids(2, 5, seed=2)
    torch.manual_seed(7)
    logits = model(input_ids=source, decoder_input_ids=target).logits
    torch.manual_seed(7)

    def dropout(x, p=p):
        return x * dropout_keep_mask(x.shape, p, dtype=x.dtype) / (1 - p) if p else x

    def ffn(module, x):
        hidden = dropout(torch.clamp(x @ module.w1.weight.T + module.w1.bias, min=0), activation_dropout)
        return hidden @ module.w2.weight.T + module.w2.bias

    def embed(ids):
        return dropout(model.model.shared.weight[ids] * math.sqrt(32) + sinusoidal_position_encoding(ids.shape[1], 32))

    def residual(x, sublayer_output, norm):
        return reference_layer_norm(x + dropout(sublayer_output), norm)

    everything, causal = torch.ones(6, 6, dtype=torch.bool), torch.tril(torch.ones(5, 5, dtype=torch.bool))
    with torch.no_grad():
        memory = embed(source)
        for layer in model.model.encoder.layers:
            memory = residual(memory, reference_attention(layer.self_attn, memory, memory, everything),
                              layer.self_attn_residual.layer_norm)  # fmt: skip
            memory = residual(memory, ffn(layer.feed_forward, memory), layer.feed_forward_residual.layer_norm)
        y = embed(target)
        for layer in model.model.decoder.layers:
            y = residual(y, reference_attention(layer.self_attn, y, y, causal), layer.self_attn_residual.layer_norm)
            y = residual(y, reference_attention(layer.encoder_attn, y, memory, torch.ones(5, 6, dtype=torch.bool)),
                         layer.encoder_attn_residual.layer_norm)  # fmt: skip
            y = residual(y, ffn(layer.feed_forward, y), layer.feed_forward_residual.layer_norm)
        expected = y @ model.model.shared.weight.T
    torch.testing.assert_close(logits, expected)


def test_no_final_layer_norm_after_the_stacks():
    """Post-LN: the stack's output is the last layer's output; nothing else is applied."""
    model = tiny_model()
    names = [name for name, _ in model.named_modules() if name.endswith("norm")]
    assert len(names) == 2 * 2 + 3 * 2  # two LayerNorms per encoder layer, three per decoder layer, nothing else


def test_different_key_and_value_sizes():
    model = tiny_model(d_k=4, d_v=16)
    attn = model.model.encoder.layers[0].self_attn
    assert attn.q_proj.out_features == attn.k_proj.out_features == 16 and attn.v_proj.out_features == 64
    assert attn.scaling == pytest.approx(4**-0.5)
    ids = random_ids(2, 5)
    assert model(input_ids=ids, labels=ids).logits.shape == (2, 5, 50)


# --- the whole model --------------------------------------------------------------------------------------------------


def test_loss_is_cross_entropy_ignoring_minus_100_and_decoder_inputs_are_shifted_labels():
    model = tiny_model()
    ids = random_ids(2, 7)
    labels = random_ids(2, 5, seed=2)
    labels[1, 3:] = -100
    out = model(input_ids=ids, labels=labels)
    decoder_input_ids = torch.cat([torch.full((2, 1), 1), labels[:, :-1].clamp(min=0)], dim=1)
    decoder_input_ids[1, 4] = PAD
    explicit = model(input_ids=ids, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(out.logits, explicit.logits)
    expected = torch.nn.functional.cross_entropy(explicit.logits[labels != -100], labels[labels != -100])
    torch.testing.assert_close(out.loss, expected)


def test_a_float64_model_s_loss_is_float64_and_passes_a_gradient_check():
    """The loss upcasts half-precision logits to float32 and keeps float64 ones (it cast them to float32: a float64
    model's loss was 7e-8 off and its gradient check failed); head masks, which the model has not, are an error
    (they were ignored)."""
    model = tiny_model(d_model=8, d_ff=16, num_heads=2, encoder_layers=1, decoder_layers=1, vocab_size=12).double()
    ids, labels = random_ids(2, 4, vocab_size=12), random_ids(2, 3, seed=2, vocab_size=12)
    out = model(input_ids=ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 12), labels.reshape(-1))
    assert out.loss.dtype == torch.float64 and out.loss.item() == expected.item()

    def loss(weight):  # the model's own loss as a function of its (tied) embedding matrix
        return torch.func.functional_call(model, {"model.shared.weight": weight}, (),
                                          {"input_ids": ids, "labels": labels}, tie_weights=True).loss  # fmt: skip

    assert torch.autograd.gradcheck(loss, (model.model.shared.weight.detach().clone().requires_grad_(),))
    with pytest.raises(ValueError, match="head_mask is not supported"):
        model(input_ids=ids, labels=labels, head_mask=torch.ones(1, 2))


def test_a_plain_seq2seq_trainer_accumulating_gradients_updates_as_one_batch(tmp_path):
    """transformers' Trainer gives a model whose forward takes **kwargs the update's target-token count
    (`num_items_in_batch`) and no longer divides its loss by the accumulation steps: the model's loss must be the
    sum over its tokens divided by that count. Without label smoothing (the model's own loss), 2 micro-batches of 2
    made a loss and an update twice those of one batch of 4."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from helpers import save_tiny_model

    _, tokenizer = save_tiny_model(tmp_path / "model")
    targets = ["Zwei Hunde spielen im Schnee.", "Ein Mann.", "Grüße aus Köln, schöne Straße!", "Die Katze schläft."]
    data = Dataset.from_dict({"en": ["A man.", "Two dogs play.", "Greetings.", "The cat sleeps."], "de": targets})
    data = data.map(lambda b: tokenizer(b["en"], text_target=b["de"]), batched=True, remove_columns=["en", "de"])
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(tmp_path / "model")
    with torch.no_grad():  # the reference: one forward pass over the 4 pairs, the mean over all their tokens
        batch = DataCollatorForSeq2Seq(tokenizer, model=model)([data[i] for i in range(4)])
        expected = model(**batch).loss
    for label_smoothing in (0.0, 0.1):
        updates, losses = [], []
        for batch_size, accumulation in ((4, 1), (2, 2)):
            model = VaswaniTransformerForConditionalGeneration.from_pretrained(tmp_path / "model")
            before = {name: p.detach().clone() for name, p in model.named_parameters()}
            args = Seq2SeqTrainingArguments(
                tmp_path / "out", per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                max_steps=1, learning_rate=1.0, optim="sgd", max_grad_norm=0.0, report_to=[], save_strategy="no",
                use_cpu=True, label_smoothing_factor=label_smoothing, train_sampling_strategy="sequential",
            )  # fmt: skip
            trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data,
                                     data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))  # fmt: skip
            losses.append(trainer.train().training_loss)
            updates.append({name: p.detach() - before[name] for name, p in model.named_parameters()})
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), label_smoothing
        if label_smoothing == 0.0:
            assert losses[0] == pytest.approx(expected.item(), rel=1e-5)
        # float32 sums in another order differ by a few ulps of the largest update (the keys' biases, whose exact
        # gradient is 0, are all rounding)
        atol = 1e-6 * max(float(update.abs().max()) for update in updates[0].values())
        for name, update in updates[0].items():
            torch.testing.assert_close(updates[1][name], update, rtol=1e-4, atol=atol, msg=name)


def test_base_model_returns_seq2seq_model_output():
    torch.manual_seed(0)
    model = VaswaniTransformerModel(tiny_config()).eval()
    out = model(input_ids=random_ids(2, 5), decoder_input_ids=random_ids(2, 3))
    assert isinstance(out, Seq2SeqModelOutput) and out.last_hidden_state.shape == (2, 3, 32)


def test_causality():
    """Changing decoder tokens after position t leaves the logits up to t unchanged."""
    model = tiny_model()
    source = random_ids(1, 6)
    target = random_ids(1, 8, seed=3)
    changed = target.clone()
    changed[0, 5:] = random_ids(1, 3, seed=4)
    with torch.no_grad():
        a = model(input_ids=source, decoder_input_ids=target).logits
        b = model(input_ids=source, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_padding_invariance():
    """A padded batch gives the same outputs as each sentence alone."""
    model = tiny_model()
    sources = [random_ids(1, n, seed=n)[0] for n in (7, 3, 5)]
    targets = [random_ids(1, n, seed=10 + n)[0] for n in (2, 6, 4)]

    def pad(rows):
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), PAD)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return ids, (ids != PAD).long()

    src, src_mask = pad(sources)
    tgt, tgt_mask = pad(targets)
    with torch.no_grad():
        batched = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
        for i, (s, t) in enumerate(zip(sources, targets)):
            alone = model(input_ids=s[None], decoder_input_ids=t[None]).logits[0]
            torch.testing.assert_close(batched.logits[i, : len(t)], alone, atol=1e-5, rtol=1e-5)


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded on the left to one width, and their mask."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_left_padded_decoder_prompt_gives_each_token_the_position_it_has_alone(attention):
    """Left padding of the decoder input (decoder_attention_mask with leading zeros) does not move the real tokens:
    the first real token is at position 0, as alone (it used to be at the number of padding tokens)."""
    model = tiny_model()
    model.set_attn_implementation(attention)
    source = random_ids(1, 5)[0].tolist()
    prompts = [[1, 17, 23, 9], [1, 30], [1, 8, 8]]
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        batch = model(input_ids=torch.tensor([source] * 3), decoder_input_ids=ids, decoder_attention_mask=mask).logits
        for row, prompt in enumerate(prompts):
            alone = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prompt])).logits[0]
            torch.testing.assert_close(batch[row, -len(prompt) :], alone, atol=1e-5, rtol=1e-5)


def test_a_left_padded_source_gives_each_token_the_position_it_has_alone():
    """Left padding of the source (attention_mask with leading zeros) gives the outputs of the source alone."""
    model = tiny_model()
    sources = [random_ids(1, n, seed=n)[0].tolist() for n in (6, 2, 4)]
    ids, mask = left_padded(sources)
    target = random_ids(3, 4, seed=9)
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        for row, source in enumerate(sources):
            alone = model(input_ids=torch.tensor([source]), decoder_input_ids=target[row : row + 1]).logits[0]
            torch.testing.assert_close(batch[row], alone, atol=1e-5, rtol=1e-5)


def test_float64_eager_attention_gives_a_query_that_sees_no_key_no_nan():
    """Eager attention in float64: the padding query of a left-padded prompt sees no key. Its softmax used to run in
    float32, where the float64 mask minimum is -inf: NaN there, spread to every token by the next layer."""
    model = tiny_model().double()
    model.set_attn_implementation("eager")
    ids, mask = left_padded([[1, 17, 23], [1, 30]])
    source = random_ids(2, 5)
    with torch.no_grad():
        eager = model(input_ids=source, decoder_input_ids=ids, decoder_attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(input_ids=source, decoder_input_ids=ids, decoder_attention_mask=mask).logits
    assert torch.isfinite(eager).all()
    torch.testing.assert_close(eager[1, 1:], sdpa[1, 1:], atol=1e-12, rtol=1e-12)


def test_softmax_over_fewer_keys_than_a_float32_vector_on_a_cpu_is_padded_and_equals_float64():
    """Attention's softmax over the keys (`softmax_over_keys`): on a CPU, fewer keys than a float32 vector holds (16
    with AVX-512, 8 with AVX2) are padded to a vector's with scores of -inf (torch's kernel is ~10x slower per entry
    below), the weights returned as the real keys' columns. Weights and gradients equal float64's softmax for 1-17
    keys, masked keys and a row that sees no key included, in float32 and from bf16 scores; eager attention hands the
    weights on contiguous; a trace sees the plain softmax."""
    from vaswani_transformer.modeling_vaswani_transformer import _SOFTMAX_FAST_KEYS as WIDTH
    from vaswani_transformer.modeling_vaswani_transformer import eager_attention_forward, softmax_over_keys

    assert WIDTH == (16 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 8)  # a float32 vector's entries

    generator = torch.Generator().manual_seed(0)
    for keys in range(1, 18):
        raw = torch.randn(3, 2, 5, keys, generator=generator) * 4
        seen = torch.ones(raw.shape, dtype=torch.bool)
        seen[0, :, :, keys // 2 :] = False  # padding keys
        seen[1, 0, 0] = False  # a query that sees no key: uniform weights, as the masks' minimum gives
        upstream = torch.randn(raw.shape, generator=generator, dtype=torch.float64)
        for dtype in (torch.float32, torch.bfloat16):
            scores = raw.to(dtype).masked_fill(~seen, torch.finfo(dtype).min).requires_grad_()
            exact = scores.detach().double().requires_grad_()
            reference = exact.softmax(-1)
            (reference_grad,) = torch.autograd.grad(reference, exact, upstream)
            weights = softmax_over_keys(scores, torch.float32)
            assert weights.dtype == torch.float32 and weights.shape == scores.shape
            assert weights.stride(-2) == max(WIDTH, keys)  # the padded kernel's rows, or the scores' own
            torch.testing.assert_close(weights.double(), reference.detach(), atol=1e-6, rtol=0)  # float32 arithmetic
            (grad,) = torch.autograd.grad(weights, scores, upstream.float())  # rounded to the scores' dtype
            rounding = 4e-5 if dtype == torch.float32 else 2**-8 * reference_grad.abs().max()
            torch.testing.assert_close(grad.double(), reference_grad, atol=rounding, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(lambda scores: softmax_over_keys(scores, torch.float32), torch.randn(2, 5))
    longer = torch.randn(2, 20, generator=generator)  # a trace keeps no padding width for other lengths
    torch.testing.assert_close(traced(longer), longer.softmax(-1))
    module = torch.nn.Module().eval()
    query, key, value = (torch.randn(2, 2, 3, 4, generator=generator) for _ in range(3))
    output, weights = eager_attention_forward(module, query, key, value, None, 0.5)
    assert weights.is_contiguous()
    torch.testing.assert_close(weights, (query @ key.transpose(2, 3) * 0.5).double().softmax(-1).float())
    torch.testing.assert_close(output, (weights @ value).transpose(1, 2))


def test_a_decoder_mask_that_does_not_cover_the_cache_is_an_error():
    """With a cache, decoder_attention_mask covers the cached tokens and the new ones (as in generate); a mask of the
    new tokens only used to give wrong outputs silently."""
    model = tiny_model()
    source, target = random_ids(1, 5), random_ids(1, 3, seed=4)
    with torch.no_grad():
        cache = model(input_ids=source, decoder_input_ids=target[:, :2], use_cache=True).cache
        with pytest.raises(ValueError, match="decoder_attention_mask has 1 columns; it must cover the 2 cached"):
            step = dict(decoder_input_ids=target[:, 2:], decoder_attention_mask=torch.ones(1, 1), cache=cache)
            model(input_ids=source, **step)


def test_stepwise_decoding_of_a_left_padded_prompt_equals_the_full_forward_pass():
    """Prompt (left-padded, with its mask) through the cache, then one token at a time: the full pass's logits."""
    model = tiny_model()
    ids, mask = left_padded([[1, 17, 23], [1, 30]])
    following = random_ids(2, 3, seed=6)
    source = random_ids(2, 5)
    full_mask = torch.cat([mask, torch.ones_like(following)], dim=-1)
    with torch.no_grad():
        full = model(
            input_ids=source, decoder_input_ids=torch.cat([ids, following], -1), decoder_attention_mask=full_mask
        ).logits
        out = model(input_ids=source, decoder_input_ids=ids, decoder_attention_mask=mask, use_cache=True)
        steps = [out.logits]
        for t in range(3):
            width = ids.shape[1] + t + 1
            out = model(
                input_ids=source, decoder_input_ids=following[:, t : t + 1],
                decoder_attention_mask=full_mask[:, :width], cache=out.cache, use_cache=True,
            )  # fmt: skip
            steps.append(out.logits)
    stepwise = torch.cat(steps, dim=1)
    torch.testing.assert_close(stepwise[full_mask.bool()], full[full_mask.bool()], atol=1e-5, rtol=1e-5)


def test_incremental_decoding_with_cache_equals_full_forward():
    model = tiny_model()
    source = random_ids(2, 6)
    source_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    target = random_ids(2, 5, seed=5)
    with torch.no_grad():
        full = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
        encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=source_mask)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        steps = []
        for t in range(target.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=source_mask,
                decoder_input_ids=target[:, t : t + 1],
                use_cache=True,
                cache=cache,
            )
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_old_cache_argument_name_warns_and_is_used_as_cache():
    """`past_key_values=` (the name before transformers 5.24) works with a FutureWarning, as in transformers' models."""
    model = tiny_model()
    source, target = random_ids(2, 6), random_ids(2, 3, seed=5)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=source)
        prefix = dict(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, :2], use_cache=True)
        step = dict(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, 2:], use_cache=True)
        expected = model(**step, cache=model(**prefix).cache).logits
        for forward in (model, model.model):
            with pytest.warns(FutureWarning, match="`past_key_values` is deprecated .* Use `cache` instead"):
                old_name = forward(**step, past_key_values=model(**prefix).cache)
            logits = model.lm_head(old_name.last_hidden_state) if forward is model.model else old_name.logits
            torch.testing.assert_close(logits, expected)
            assert old_name.cache.get_seq_length() == 3
        decoder = model.get_decoder()
        with pytest.warns(FutureWarning, match="past_key_values"):
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            decoder(input_ids=target, encoder_hidden_states=encoder_outputs[0], past_key_values=cache, use_cache=True)
        assert cache.get_seq_length() == 3
        # Both names: the new one is used (the old one ignored), with a warning saying so.
        with pytest.warns(FutureWarning, match="Both `past_key_values` and `cache` are set"):
            ignored = EncoderDecoderCache(DynamicCache(), DynamicCache())
            both = model(**step, cache=model(**prefix).cache, past_key_values=ignored)
        torch.testing.assert_close(both.logits, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(**step, cache=model(**prefix).cache)  # the new name: no warning


@pytest.mark.parametrize("position_encoding", ["sinusoidal", "learned"])
def test_static_cache_greedy_generate_compiles_as_one_graph_and_equals_dynamic_cache(position_encoding):
    """`_can_compile_fullgraph`: transformers compiles the decoding step with fullgraph=True over a static cache."""
    model = tiny_model(position_encoding=position_encoding)
    source = random_ids(2, 6, seed=3)
    kwargs = dict(num_beams=1, do_sample=False, max_new_tokens=8, min_new_tokens=8)
    kwargs.update(return_dict_in_generate=True, output_logits=True)
    expected = model.generate(input_ids=source, **kwargs)
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compile_config = CompileConfig(fullgraph=True, backend=recording_backend, mode=None)
    compile_config._compile_all_devices = True  # transformers compiles only on accelerators unless told so
    torch._dynamo.reset()
    compiled = model.generate(
        input_ids=source, cache_implementation="static", compile_config=compile_config, **kwargs
    )
    assert graphs, "generate did not compile the decoding step"
    assert torch.equal(compiled.sequences, expected.sequences)
    # Every step's logits, so that a wrong position (the decoder's offset in the static cache) cannot go unseen.
    torch.testing.assert_close(torch.stack(compiled.logits), torch.stack(expected.logits), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_a_copied_model_decodes_with_its_own_weights_in_the_compiled_step(num_beams):
    """transformers keeps the compiled `__call__` on the model; `copy.deepcopy` copied it, still bound to the original
    model, so the copy's compiled decoding steps (static cache, `compile_config`) ran the original's weights."""
    import copy

    model = tiny_model()
    source = random_ids(2, 6, seed=3)
    compile_config = CompileConfig(fullgraph=True, backend="eager", mode=None)
    compile_config._compile_all_devices = True  # transformers compiles only on accelerators unless told so
    kwargs = dict(input_ids=source, num_beams=num_beams, max_new_tokens=6, min_new_tokens=6)
    compiled = dict(cache_implementation="static", compile_config=compile_config)
    assert torch.equal(model.generate(**kwargs, **compiled), model.generate(**kwargs))
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in copied.parameters():
            parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(parameter.numel()))
    plain = copied.generate(**kwargs)
    assert not torch.equal(plain, model.generate(**kwargs))  # the copy decodes otherwise
    assert torch.equal(copied.generate(**kwargs, **compiled), plain)


def test_cross_attention_keys_and_values_are_computed_once_per_source():
    model = tiny_model()
    calls = []
    model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(input_ids=random_ids(1, 5), num_beams=1, do_sample=False, max_new_tokens=6, min_new_tokens=6)
    assert len(calls) == 1


def test_greedy_generation_with_and_without_cache_is_identical():
    model = tiny_model()
    source = random_ids(3, 6)
    kwargs = dict(num_beams=1, do_sample=False, max_new_tokens=10)
    with_cache = model.generate(input_ids=source, use_cache=True, **kwargs)
    without_cache = model.generate(input_ids=source, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without_cache)


def test_eager_and_sdpa_agree(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    eager = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    sdpa = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == ("eager", "sdpa")
    source = random_ids(2, 7)
    mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 0, 0]])
    target = random_ids(2, 4, seed=2)
    with torch.no_grad():
        a = eager(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        b = sdpa(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_set_attn_implementation_switches_the_kernel():
    """`set_attn_implementation` after loading switches every attention layer, to eager or a registered kernel."""
    model = tiny_model()
    source, target = random_ids(2, 7), random_ids(2, 4, seed=2)
    with torch.no_grad():
        sdpa = model(input_ids=source, decoder_input_ids=target).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    calls = []

    def recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        calls.append(type(module).__name__)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            boolean = attention_mask.dtype == torch.bool
            scores = scores.masked_fill(~attention_mask, -math.inf) if boolean else scores + attention_mask
        weights = scores.softmax(-1)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    AttentionInterface.register("vaswani_test_recording", recording_eager)
    AttentionMaskInterface.register("vaswani_test_recording", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    model.set_attn_implementation("vaswani_test_recording")
    with torch.no_grad():
        recorded = model(input_ids=source, decoder_input_ids=target).logits
    assert len(calls) == 2 + 2 * 2  # encoder self-attention, decoder self- and cross-attention, per layer
    torch.testing.assert_close(recorded, sdpa, atol=1e-5, rtol=1e-5)


def test_sdpa_is_the_default():
    assert tiny_model().config._attn_implementation == "sdpa"


def test_output_attentions_and_hidden_states_for_every_layer():
    model = tiny_model(encoder_layers=3, decoder_layers=2)
    source = random_ids(2, 6)
    out = model(input_ids=source, decoder_input_ids=random_ids(2, 4), output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == 3 and len(out.decoder_attentions) == 2 and len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (2, 4, 6, 6)
    assert out.decoder_attentions[0].shape == (2, 4, 4, 4)
    assert out.cross_attentions[0].shape == (2, 4, 4, 6)
    torch.testing.assert_close(out.encoder_attentions[0].sum(-1), torch.ones(2, 4, 6))
    assert torch.all(out.decoder_attentions[1].triu(diagonal=1) == 0)  # causal
    assert len(out.encoder_hidden_states) == 3 + 1 and len(out.decoder_hidden_states) == 2 + 1  # embeddings, layers
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


def test_output_attentions_with_a_kernel_that_returns_no_weights_is_an_error():
    """flex attention returns no weights (transformers gave empty tuples, silently); eager and sdpa give them equal."""
    source, target = random_ids(2, 6), random_ids(2, 4, seed=2)
    model = tiny_model().eval()
    with torch.no_grad():
        weights = {}
        for implementation in ("eager", "sdpa"):
            model.set_attn_implementation(implementation)
            weights[implementation] = model(input_ids=source, decoder_input_ids=target, output_attentions=True)
        model.set_attn_implementation("flex_attention")
        with pytest.raises(ValueError, match=r"output_attentions=True needs attn_implementation 'eager' or 'sdpa'.*"
                           r"'flex_attention'"):
            model(input_ids=source, decoder_input_ids=target, output_attentions=True)
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        for a, b in zip(getattr(weights["eager"], name), getattr(weights["sdpa"], name), strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "vaswani_test_registered_sdpa"])
def test_a_source_row_serves_its_consecutive_target_rows_as_copies_of_it_would(implementation):
    """Decoder rows b*G .. b*G+G-1 over encoder row b (a sentence's beams: the paper's search keeps one copy of each
    source and of its cross-attention keys) give what the same rows give over G copies of the source: logits and
    attention weights, in a full pass with a padded source and step by step through a cache; under any other
    registered kernel too (it gets the copies)."""
    AttentionInterface.register("vaswani_test_registered_sdpa", sdpa_attention_forward)
    AttentionMaskInterface.register("vaswani_test_registered_sdpa", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model = tiny_model()
    model.set_attn_implementation(implementation)
    groups = 3
    source = random_ids(2, 6)
    source[0, 4:] = PAD
    mask = (source != PAD).long()
    target = random_ids(2 * groups, 5, seed=2)
    with torch.no_grad():
        states = model.get_encoder()(input_ids=source, attention_mask=mask).last_hidden_state
        copies = states.repeat_interleave(groups, 0), mask.repeat_interleave(groups, 0)
        shared, copied = (
            model(encoder_outputs=(s,), attention_mask=m, decoder_input_ids=target, output_attentions=True)
            for s, m in ((states, mask), copies)
        )
        torch.testing.assert_close(shared.logits, copied.logits)
        for name in ("decoder_attentions", "cross_attentions"):
            for a, b in zip(getattr(shared, name), getattr(copied, name), strict=True):
                torch.testing.assert_close(a, b)
        caches = {}
        for key, (s, m) in {"shared": (states, mask), "copied": copies}.items():
            caches[key] = EncoderDecoderCache(DynamicCache(), DynamicCache())
            steps = [
                model(encoder_outputs=(s,), attention_mask=m, decoder_input_ids=target[:, i : i + 1],
                      cache=caches[key], use_cache=True).logits
                for i in range(target.shape[1])
            ]  # fmt: skip
            torch.testing.assert_close(torch.cat(steps, 1), copied.logits)
    # One cross-attention cache row per source, not per target row (eager and sdpa; other kernels get copies).
    assert caches["shared"].cross_attention_cache.layers[0].keys.shape[0] == (
        2 if implementation in ("eager", "sdpa") else 2 * groups
    )
    assert caches["copied"].cross_attention_cache.layers[0].keys.shape[0] == 2 * groups


def test_target_rows_that_are_no_multiple_of_the_sources_and_masks_of_another_shape_are_clear_errors():
    model = tiny_model()
    source = random_ids(3, 5)
    with torch.no_grad():
        states = model.get_encoder()(input_ids=source).last_hidden_state
        with pytest.raises(ValueError, match="The decoder has 4 rows and the encoder's output 3: each source row"):
            model(encoder_outputs=(states,), decoder_input_ids=random_ids(4, 2))
        with pytest.raises(ValueError, match=r"attention_mask has 6 rows and the encoder's output 3: the source mask"):
            model(encoder_outputs=(states,), attention_mask=torch.ones(6, 5), decoder_input_ids=random_ids(6, 2))
        for shape in ((6, 5), (3, 7)):
            with pytest.raises(ValueError, match=rf"attention_mask has shape \({shape[0]}, {shape[1]}\); the source's "
                               r"is \(3, 5\)"):
                model(input_ids=source, attention_mask=torch.ones(shape), decoder_input_ids=random_ids(6, 2))


@pytest.mark.parametrize("missing", ["pad_token_id", "decoder_start_token_id"])
def test_labels_without_the_ids_to_shift_them_are_an_error_naming_them(missing):
    model = tiny_model()
    setattr(model.config, missing, None)
    with pytest.raises(ValueError, match="Decoder inputs from labels need the config's pad_token_id and "
                       "decoder_start_token_id; got (None and 1|0 and None)"):
        model(input_ids=random_ids(2, 6), labels=random_ids(2, 5, seed=2))


def test_gradient_checkpointing_gives_the_same_gradients():
    source, labels = random_ids(2, 6), random_ids(2, 5, seed=2)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(input_ids=source, labels=labels).loss.backward()
        grads.append(model.model.encoder.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_gradient_checkpointing_in_training_leaves_a_given_cache_alone():
    """The backward pass replays each layer, which would write a cache twice: in training none is used."""
    model = tiny_model().train()
    model.activation_checkpointing_enable()
    source, target = random_ids(2, 6), random_ids(2, 5, seed=2)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    out = model(input_ids=source, decoder_input_ids=target, cache=cache, use_cache=True)
    out.logits.sum().backward()
    assert cache.get_seq_length() == 0 and out.cache is None


def test_token_id_outside_vocabulary_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="input_ids contains token id 57, outside the vocabulary of size 50"):
        model(input_ids=torch.tensor([[5, 57, 2]]), labels=torch.tensor([[4, 2]]))
    with pytest.raises(ValueError, match="decoder_input_ids contains token id 50"):
        model(input_ids=torch.tensor([[5, 2]]), decoder_input_ids=torch.tensor([[1, 50]]))


def test_learned_positions_row_e_and_its_length_limit():
    model = tiny_model(position_encoding="learned", max_position_embeddings=8)
    assert "model.encoder.embedding.embed_positions.weight" in model.state_dict()
    model(input_ids=random_ids(1, 8), labels=random_ids(1, 3))
    with pytest.raises(ValueError, match="9 positions is longer than the 8 learned positions"):
        model(input_ids=random_ids(1, 9), labels=random_ids(1, 3))


# --- tying -------------------------------------------------------------------------------------------------------------


def assert_three_way_tied(model):
    shared = model.model.shared.weight
    assert model.model.encoder.get_input_embeddings().weight is shared
    assert model.model.decoder.get_input_embeddings().weight is shared
    assert model.get_output_embeddings().weight is shared


def test_tying_survives_save_load_resize_and_a_training_step(tmp_path):
    model = tiny_model()
    assert_three_way_tied(model)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert isinstance(loaded, VaswaniTransformerForConditionalGeneration)
    assert_three_way_tied(loaded)
    torch.testing.assert_close(loaded.model.shared.weight, model.model.shared.weight)

    loaded.resize_token_embeddings(64)
    assert_three_way_tied(loaded)
    assert loaded.model.shared.weight.shape == (64, 32) and loaded.config.vocab_size == 64

    loaded.train()
    optimizer = torch.optim.Adam(loaded.parameters(), lr=1e-2)
    loaded(input_ids=random_ids(2, 5, vocab_size=64), labels=random_ids(2, 4, seed=3, vocab_size=64)).loss.backward()
    optimizer.step()
    assert_three_way_tied(loaded)
    assert not torch.allclose(loaded.model.shared.weight[:50], model.model.shared.weight)


@pytest.mark.parametrize("model_class", [VaswaniTransformerForConditionalGeneration, VaswaniTransformerModel])
def test_resizing_separate_embeddings_resizes_both_sides_and_keeps_their_rows(tmp_path, model_class):
    """share_embeddings=False: the encoder's and the decoder's matrices (and the output layer) all grow to the new
    vocabulary, keep their old rows, stay separate, and the model runs, saves and reloads at the new size."""
    torch.manual_seed(0)
    model = model_class(tiny_config(share_embeddings=False)).eval()
    base = model.model if model_class is VaswaniTransformerForConditionalGeneration else model
    old = {side: getattr(base, side).get_input_embeddings().weight.detach().clone() for side in ("encoder", "decoder")}
    model.resize_token_embeddings(64)
    assert model.config.vocab_size == 64
    for side, before in old.items():
        weight = getattr(base, side).get_input_embeddings().weight
        assert weight.shape == (64, 32) and torch.equal(weight[:50], before)
    assert base.encoder.get_input_embeddings().weight is not base.decoder.get_input_embeddings().weight
    if model_class is VaswaniTransformerForConditionalGeneration:
        assert model.get_output_embeddings().weight.shape == (64, 32)
    ids = torch.tensor([[60, 5, 63, 2]])  # new ids on both sides
    out = model(input_ids=ids, decoder_input_ids=ids)
    model.save_pretrained(tmp_path)
    loaded = model_class.from_pretrained(tmp_path).eval()
    first = out.logits if model_class is VaswaniTransformerForConditionalGeneration else out.last_hidden_state
    again = loaded(input_ids=ids, decoder_input_ids=ids)
    torch.testing.assert_close(again.logits if hasattr(again, "logits") else again.last_hidden_state, first)


@pytest.mark.parametrize(
    "model_class, prefix", [(VaswaniTransformerForConditionalGeneration, "model."), (VaswaniTransformerModel, "")]
)
def test_checkpoint_without_the_shared_embedding_reports_it_missing(tmp_path, model_class, prefix):
    """A missing `shared.weight` is reported missing and freshly initialised, never left on the meta device."""
    torch.manual_seed(0)
    model_class(tiny_config()).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights[f"{prefix}shared.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert f"{prefix}shared.weight" in info["missing_keys"]
    assert not [name for name, p in loaded.named_parameters() if p.device.type == "meta"]
    shared = loaded.get_input_embeddings().weight
    assert loaded.get_decoder().get_input_embeddings().weight is shared
    assert shared.std().item() == pytest.approx(32**-0.5, rel=0.2) and torch.all(shared[PAD] == 0)


def test_checkpoint_layout_is_one_shared_matrix_and_old_folders_load(tmp_path):
    """Saved: `model.shared.weight` only (as before); a folder holding all four names (tied) loads tied too."""
    model = tiny_model()
    model.save_pretrained(tmp_path / "new")
    names = set(load_file(tmp_path / "new" / "model.safetensors"))
    embedding_names = {n for n in names if "embed_tokens" in n or "shared" in n or "lm_head" in n}
    assert embedding_names == {"model.shared.weight"}
    # Layer names of the earlier releases, written out here so that a renamed parameter fails this test.
    assert "model.encoder.layers.0.self_attn.q_proj.weight" in names
    assert "model.decoder.layers.1.encoder_attn.o_proj.bias" in names
    assert "model.decoder.layers.1.feed_forward_residual.layer_norm.weight" in names
    # Old folders may hold the tied copies too (e.g. weights written from a full state dict).
    (tmp_path / "old").mkdir()
    (tmp_path / "new" / "config.json").rename(tmp_path / "old" / "config.json")
    weights = load_file(tmp_path / "new" / "model.safetensors")
    shared = weights["model.shared.weight"]
    for stack in ("encoder", "decoder"):
        weights[f"model.{stack}.embedding.embed_tokens.weight"] = shared.clone()
    weights["lm_head.weight"] = shared.clone()
    save_file(weights, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "old", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert_three_way_tied(loaded)
    torch.testing.assert_close(loaded.model.shared.weight, model.model.shared.weight)
    loaded.save_pretrained(tmp_path / "resaved")
    assert set(load_file(tmp_path / "resaved" / "model.safetensors")) == names


def test_untied_embeddings_when_not_shared(tmp_path):
    model = tiny_model(share_embeddings=False)
    weights = {
        id(model.model.encoder.get_input_embeddings().weight),
        id(model.model.decoder.get_input_embeddings().weight),
        id(model.get_output_embeddings().weight),
    }
    assert len(weights) == 3
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight)


def test_initialisation():
    torch.manual_seed(0)
    model = VaswaniTransformerForConditionalGeneration(tiny_config(vocab_size=4000, d_model=64))
    embedding = model.model.shared.weight
    assert torch.all(embedding[PAD] == 0)
    assert embedding[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
    w1 = model.model.encoder.layers[0].feed_forward.w1
    bound = math.sqrt(6 / (w1.in_features + w1.out_features))
    assert w1.weight.abs().max() <= bound and w1.weight.abs().max() > 0.9 * bound
    assert torch.all(w1.bias == 0)


# --- registration and remote code --------------------------------------------------------------------------------------


def test_auto_classes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert isinstance(AutoModel.from_pretrained(tmp_path), VaswaniTransformerModel)
    assert isinstance(AutoModelForSeq2SeqLM.from_config(tiny_config()), VaswaniTransformerForConditionalGeneration)


def test_saved_folder_carries_auto_map_and_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].endswith(
        "modeling_vaswani_transformer.VaswaniTransformerForConditionalGeneration"
    )
    for name in ("configuration_vaswani_transformer.py", "modeling_vaswani_transformer.py", "generation.py"):
        assert (tmp_path / name).exists()
    assert (tmp_path / "model.safetensors").exists()


def test_remote_code_in_a_process_without_the_package_gives_identical_logits(tmp_path, python_without_package):
    model = tiny_model()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    source = random_ids(2, 6)
    target = random_ids(2, 4, seed=2)
    torch.save({"source": source, "target": target}, tmp_path / "inputs.pt")
    python_without_package(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        with torch.no_grad():
            logits = model(input_ids=inputs["source"], decoder_input_ids=inputs["target"]).logits
        torch.save(logits, {str(tmp_path / "logits.pt")!r})
        """
    )
    with torch.no_grad():
        expected = model(input_ids=source, decoder_input_ids=target).logits
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)


@pytest.mark.parametrize("p", [0.05, 0.1, 0.3])
def test_cpu_dropout_drops_each_element_with_probability_p_and_scales_the_rest(p):
    """The model's dropout on a CPU (16 random bits per element, four per 64-bit draw): in every one of the four
    element positions of a draw the dropped fraction is p within 6 binomial standard deviations, kept elements are
    x / (1 - p) exactly, the gradient is the same mask and scale, eval mode and p 0 are the identity, p 1 zeros,
    a seed repeats it."""
    from vaswani_transformer.modeling_vaswani_transformer import Dropout

    x = (torch.rand(400_000, generator=torch.Generator().manual_seed(1)) + 0.5).requires_grad_()  # no zeros
    dropout = Dropout(p).train()
    torch.manual_seed(0)
    y = dropout(x)
    y.backward(torch.full_like(y, 3.0))
    dropped = y.detach() == 0
    lanes = dropped.view(-1, 4).double().mean(0)  # elements 4k + j share one 64-bit draw
    sigma = (p * (1 - p) / 100_000) ** 0.5
    assert torch.all((lanes - p).abs() < 6 * sigma), lanes
    assert torch.equal(y.detach()[~dropped], x.detach()[~dropped] * (1.0 / (1.0 - p)))
    torch.testing.assert_close(x.grad, torch.where(dropped, 0.0, 3.0 / (1.0 - p)), rtol=1e-6, atol=0)
    torch.manual_seed(0)
    assert torch.equal(dropout(x.detach()), y.detach())
    assert torch.equal(dropout.eval()(x.detach()), x.detach())
    assert torch.equal(Dropout(0.0).train()(x.detach()), x.detach())  # p 0 and 1 as torch's dropout gives them
    assert torch.equal(Dropout(1.0).train()(x.detach()), torch.zeros_like(x))
    assert Dropout(p).train()(torch.ones(3, 5, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_cpu_dropout_mask_at_the_ends_of_its_resolution():
    """p is rounded to a multiple of 2^-16: under 2^-17 nothing is dropped, over 1 - 2^-17 everything is; one step
    inside either end the mask is still drawn (the int16 threshold at its limits)."""
    from vaswani_transformer.modeling_vaswani_transformer import dropout_keep_mask

    shape = (64, 1024)
    assert torch.equal(dropout_keep_mask(shape, 2**-18), torch.ones(shape))
    assert torch.equal(dropout_keep_mask(shape, 1 - 2**-18, dtype=torch.bfloat16), torch.zeros(shape).bfloat16())
    torch.manual_seed(0)
    rare = dropout_keep_mask((4096, 1024), 2**-16)  # drops a 16-bit draw of -32768 only
    assert set(rare.unique().tolist()) == {0.0, 1.0} and (rare == 0).sum() < 200
    almost = dropout_keep_mask((4096, 1024), 1 - 2**-16)  # keeps a draw of 32767 only
    assert set(almost.unique().tolist()) == {0.0, 1.0} and (almost == 1).sum() < 200


# --- linear maps: oneDNN on packed weights while generating on a CPU -----------------------------------------------

onednn = pytest.mark.skipif(
    not __import__("vaswani_transformer.modeling_vaswani_transformer", fromlist=["x"])._HAS_ONEDNN_LINEAR,
    reason="this torch has no oneDNN linear",
)


@contextlib.contextmanager
def plain_products():
    """torch's own product everywhere (mkldnn off): the path autograd, GPUs and compiled graphs take."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about TF32 on Intel GPUs whenever the flags are set
        with torch.backends.mkldnn.flags(enabled=False):
            yield


@onednn
def _sdpa_kernel_calls_and_logits(model, source, decoder_input_ids):
    """(the number of torch's SDPA kernel calls, the logits) of one forward pass of `model`."""
    with torch.no_grad(), torch.profiler.profile() as profile:
        logits = model(input_ids=source, decoder_input_ids=decoder_input_ids).logits
    return sum(event.name.startswith("aten::_scaled_dot_product") for event in profile.events()), logits


def test_one_query_attention_on_a_cpu_is_equation_1_written_out_and_as_close_to_float64_as_sdpa():
    """A decoding step's attention (one query per row) on a CPU, over >= 16 keys and >= 256 rows x keys, is equation
    (1) written out, not torch's SDPA kernel (1.2-1.7x slower there in float32, 2-9x in bf16 without AMX): in bf16 its
    logits are as close to float64's as SDPA's are, in float32 equal to SDPA's to rounding. Where SDPA's kernel is the
    faster it stays: in bf16 on a CPU with AMX tiles, in float32 on an Intel CPU below 64 rows. Several queries (the
    encoder), few keys (the decoder's first self-attention) and few rows (one sentence's beams) keep SDPA."""
    AttentionInterface.register("vaswani_test_sdpa_every_step", sdpa_attention_forward)
    AttentionMaskInterface.register("vaswani_test_sdpa_every_step", ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model = tiny_model(seed=7, d_model=64, num_heads=2)  # 2 + 2 layers
    source, step = random_ids(64, 20, seed=3), random_ids(64, 1, seed=4)  # 64 rows, 20 source tokens, one query
    with torch.no_grad():
        reference = copy.deepcopy(model).double()(input_ids=source, decoder_input_ids=step).logits
    for dtype in (torch.bfloat16, torch.float32):
        typed = copy.deepcopy(model).to(dtype)
        calls, logits = _sdpa_kernel_calls_and_logits(typed, source, step)
        if dtype == torch.bfloat16 and "amx_tile" in cpu_flags():
            assert calls == 2 + 2 * 2  # SDPA throughout
            continue
        assert calls == 2 + 2  # the encoder's and the decoder's self-attention; cross-attention (20 keys) written out
        typed.set_attn_implementation("vaswani_test_sdpa_every_step")  # torch's SDPA for every attention
        sdpa_calls, sdpa_logits = _sdpa_kernel_calls_and_logits(typed, source, step)
        assert sdpa_calls == 2 + 2 * 2
        if dtype == torch.float32:
            torch.testing.assert_close(logits, sdpa_logits, atol=1e-5, rtol=1e-5)
        else:
            error, sdpa_error = (logits.double() - reference).abs(), (sdpa_logits.double() - reference).abs()
            assert error.mean() <= 1.25 * sdpa_error.mean() and error.max() <= 2 * sdpa_error.max(), (error, sdpa_error)
        typed.set_attn_implementation("sdpa")
        assert _sdpa_kernel_calls_and_logits(typed, source[:4], step[:4])[0] == 2 + 2 * 2  # 4 rows x 20 keys
    sixteen_rows = _sdpa_kernel_calls_and_logits(model, source[:16], step[:16])[0]  # float32, 16 rows x 20 keys
    assert sixteen_rows == (2 + 2 * 2 if cpu_vendor() == "GenuineIntel" else 2 + 2)


@onednn
def test_linear_on_packed_weights_is_xw_plus_b_in_float64_and_packs_from_the_fourth_use():
    """Inside `packed_cpu_weights`, under no_grad: the first three calls multiply as stored, later ones on one packed
    copy; each equals x W^T + b in float64, for an empty batch, a few rows, a 3-D and a non-contiguous input, in float32 and
    bf16. Outside the block, with autograd on, under autocast, or for a weight under 512 x 512 (in bf16, under 128 x 128),
    nothing is packed."""
    from vaswani_transformer.modeling_vaswani_transformer import _PACKED_WEIGHTS, linear, packed_cpu_weights

    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1040)  # over 512 x 1024: packed on any CPU
    inputs = [torch.randn(4, 512), torch.randn(2, 512), torch.randn(1, 512)]  # the plain uses
    inputs += [torch.randn(4, 512), torch.randn(0, 512), torch.randn(3, 5, 512), torch.randn(512, 6).t()]
    dtypes = [torch.float32, *([torch.bfloat16] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [])]
    for dtype in dtypes:
        layer.to(dtype)
        w, b = layer.weight.detach().double(), layer.bias.detach().double()
        with torch.no_grad(), packed_cpu_weights():
            packs = _PACKED_WEIGHTS.get()
            for i, x in enumerate(inputs):
                y = linear(layer, x.to(dtype))
                assert torch.is_tensor(packs[layer]) == (i >= 3)  # packed at the fourth call
                if i == 3:
                    packed = packs[layer]
                assert i < 3 or packs[layer] is packed  # once
                tolerance = 1e-5 if dtype == torch.float32 else 2e-2
                reference = x.to(dtype).double() @ w.T + b
                torch.testing.assert_close(y.double(), reference, rtol=tolerance, atol=tolerance)
        assert _PACKED_WEIGHTS.get() is None

    small = torch.nn.Linear(256, 256)
    with torch.no_grad(), packed_cpu_weights():
        x = torch.randn(4, 256)
        for _ in range(5):
            torch.testing.assert_close(linear(small, x), x @ small.weight.T + small.bias)
        assert not _PACKED_WEIGHTS.get()
    if torch.bfloat16 in dtypes:  # bf16 has no MKL path to beat: packed from 128 x 128 entries
        for features, packed in ((256, True), (128, True), (64, False)):
            square = torch.nn.Linear(features, features).bfloat16()
            w, b = square.weight.detach().double(), square.bias.detach().double()
            with torch.no_grad(), packed_cpu_weights():
                for _ in range(5):
                    x = torch.randn(4, features).bfloat16()
                    y = linear(square, x)
                    torch.testing.assert_close(y.double(), x.double() @ w.T + b, rtol=2e-2, atol=2e-2)
                assert torch.is_tensor(_PACKED_WEIGHTS.get().get(square)) == packed, features

    layer.float()
    x = torch.randn(7, 512)
    with packed_cpu_weights():
        for _ in range(5):
            linear(layer, x).square().sum().backward()  # autograd on: torch's product, with gradients
        assert layer.weight.grad.abs().sum() > 0 and not _PACKED_WEIGHTS.get()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert all(linear(layer, x).dtype == torch.bfloat16 for _ in range(5))
        assert not _PACKED_WEIGHTS.get()


@onednn
def test_a_packed_weight_is_kept_from_block_to_block_while_w_holds_the_same_bits_until_released():
    """A packed copy outlives its `packed_cpu_weights` block: the next block multiplies on it from the first use, with
    no packing, and gets x W^T + b in float64. A change to one entry of W that torch does not count (`.data`), a W
    cast to bf16, or one put back bit for bit are each seen by the next block (packing anew where they changed, from
    the fourth use). `model.train()`, `model.to(...)` and `release_packed_weights` drop a model's copies (another
    model's stay), as does the layer's end."""
    import gc

    from vaswani_transformer import release_packed_weights
    from vaswani_transformer.modeling_vaswani_transformer import _KEPT_PACKS, _PACKED_WEIGHTS, linear, packed_cpu_weights

    def block(layer, uses=4):
        """(packings, whether each use ran on a packed copy) over `uses` uses in one block, each checked against
        x W^T + b in float64."""
        packed = []
        w, b = layer.weight.detach().double(), layer.bias.detach().double()
        with torch.no_grad(), packed_cpu_weights(), torch.profiler.profile() as profile:
            for _ in range(uses):
                x = torch.randn(4, 512, dtype=layer.weight.dtype)
                y = linear(layer, x)
                packed.append(torch.is_tensor(_PACKED_WEIGHTS.get()[layer]))
                tolerance = 1e-5 if x.dtype == torch.float32 else 2e-2
                torch.testing.assert_close(y.double(), x.double() @ w.T + b, rtol=tolerance, atol=tolerance)
        return sum(e.name == "mkldnn::_reorder_linear_weight" for e in profile.events()), packed

    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1040)  # packed on any CPU
    assert block(layer) == (1, [False, False, False, True])
    assert block(layer) == (0, [True] * 4)  # kept, and W as it was

    original = layer.weight.detach().clone()
    version = layer.weight._version
    layer.weight.data[7, 300] += 1e-3  # one entry, and torch's version counter does not see it
    assert layer.weight._version == version
    assert block(layer) == (1, [False, False, False, True])
    layer.weight.data.copy_(original)  # back to the bits of before: packed anew for those (the old copy is gone)
    assert block(layer, 1) == (0, [False]) and block(layer) == (1, [False, False, False, True])
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        layer.bfloat16()
        assert block(layer) == (1, [False, False, False, True])
        assert block(layer) == (0, [True] * 4)
        layer.float()

    model, other = tiny_model(seed=0, d_model=512, d_ff=1024), tiny_model(seed=1, d_model=512, d_ff=1024)

    def pack(m):
        m.eval()
        with torch.no_grad(), packed_cpu_weights():
            for _ in range(4):
                linear(m.model.decoder.layers[0].feed_forward.w1, torch.randn(4, 512))

    kept = lambda m: [module for module in m.modules() if module in _KEPT_PACKS]  # noqa: E731
    pack(model), pack(other)
    assert kept(model) == [model.model.decoder.layers[0].feed_forward.w1] and len(kept(other)) == 1
    model.train()
    assert kept(model) == [] and len(kept(other)) == 1
    release_packed_weights(other)
    assert kept(other) == []
    pack(model), pack(other)
    model.double()  # a move or a cast (`.to`, `.cuda`, `.half`): the copies could serve no more
    assert kept(model) == [] and len(kept(other)) == 1

    block(layer)
    assert layer in _KEPT_PACKS
    count = len(_KEPT_PACKS)
    del layer
    gc.collect()
    assert len(_KEPT_PACKS) == count - 1


def test_torch_dynamic_quantization_quantizes_every_linear_layer_as_in_marian_and_the_int8_model_translates():
    """`torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`, PyTorch's int8 recipe for CPU
    inference that quantizes MarianMT's linear layers, finds every one of ours too (the projections, the feed-forward
    layers and the output layer are `nn.Linear` itself: the recipe matches the exact class, and with a subclass it
    silently quantized nothing). The int8 model's logits are near float32's, not equal, and it decodes."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    model = tiny_model(seed=2, dropout=0.0).eval()
    source, target = random_ids(3, 9, seed=4), random_ids(3, 7, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor
        quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    layers = {name: type(module) for name, module in quantized.named_modules()
              if name.endswith(("_proj", ".w1", ".w2", "lm_head"))}  # fmt: skip
    assert len(layers) == 4 * 3 * 2 + 2 * 2 * 2 + 1 and set(layers.values()) == {DynamicQuantizedLinear}, layers
    with torch.no_grad():
        exact = model(input_ids=source, decoder_input_ids=target).logits
        int8 = quantized(input_ids=source, decoder_input_ids=target).logits
    error = (int8 - exact).abs().max()
    assert 0 < error <= 0.1 * exact.abs().max() and (int8.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9
    assert quantized.generate(input_ids=source, num_beams=4, max_new_tokens=5).shape[0] == 3


def test_hooks_pruning_and_accelerate_s_module_hooks_on_a_linear_layer_see_and_change_its_every_call():
    """A linear layer runs through `modeling.linear`, which skips the module call only where that call is the product
    alone: a forward hook sees every call with x W^T + b, a global module hook every layer, torch's pruning (a
    forward pre-hook) and accelerate's `add_hook_to_module` (a replaced `forward`) change the model's output and
    `generate`'s as they change the layer's."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
    from torch.nn.utils import prune

    model = tiny_model(seed=3, dropout=0.0).eval()
    source, target = random_ids(2, 6, seed=6), random_ids(2, 5, seed=7)
    layer = model.model.decoder.layers[0].self_attn.q_proj
    seen = []
    handle = layer.register_forward_hook(lambda module, args, output: seen.append((args[0], output)))
    with torch.no_grad():
        plain = model(input_ids=source, decoder_input_ids=target).logits
    handle.remove()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0][1], seen[0][0] @ layer.weight.T + layer.bias)

    called = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: called.append(module) if isinstance(module, torch.nn.Linear) else None
    )
    with torch.no_grad():
        model(input_ids=source, decoder_input_ids=target)
    handle.remove()
    assert len(called) == len([m for m in model.modules() if isinstance(m, torch.nn.Linear)])

    class Halve(ModelHook):
        def post_forward(self, module, output):
            return output / 2

    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference.model.decoder.layers[0].self_attn.q_proj.weight /= 2
        reference.model.decoder.layers[0].self_attn.q_proj.bias /= 2
        expected = reference(input_ids=source, decoder_input_ids=target).logits
        add_hook_to_module(layer, Halve())
        halved = model(input_ids=source, decoder_input_ids=target).logits
        remove_hook_from_module(layer)
        torch.testing.assert_close(halved, expected)
        assert not torch.allclose(halved, plain)

        prune.l1_unstructured(layer, "weight", amount=0.5)
        reference.model.decoder.layers[0].self_attn.q_proj.weight.copy_(layer.weight)
        reference.model.decoder.layers[0].self_attn.q_proj.bias.copy_(layer.bias)
        torch.testing.assert_close(model(input_ids=source, decoder_input_ids=target).logits,
                                   reference(input_ids=source, decoder_input_ids=target).logits)  # fmt: skip
        settings = dict(num_beams=4, max_new_tokens=6, suppress_tokens=[2], output_scores=True,
                        return_dict_in_generate=True)  # fmt: skip
        pruned, wanted = model.generate(input_ids=source, **settings), reference.generate(input_ids=source, **settings)
        assert torch.equal(pruned.sequences, wanted.sequences)
        torch.testing.assert_close(pruned.sequences_scores, wanted.sequences_scores)


def test_torch_func_grad_of_the_model_gives_its_backward_pass_s_gradients(monkeypatch):
    """Under torch.func's transforms the linear layers take torch's product (oneDNN's ops and `_OneDNNLinear` have no
    rules for them: on AMD CPUs with AVX-512 `torch.func.grad` of the model raised), so `grad` of the loss through
    `functional_call` gives the gradients of the model's own backward pass, with the oneDNN path on."""
    from torch.func import functional_call, grad

    from vaswani_transformer import modeling_vaswani_transformer as modeling

    if modeling._HAS_ONEDNN_LINEAR:
        monkeypatch.setattr(modeling, "_ONEDNN_FP32_FASTER", True)  # the path that raised, on any x86 CPU
    model = tiny_model(seed=4, dropout=0.0, d_model=64, num_heads=2)
    source, target = random_ids(3, 8, seed=8), random_ids(3, 8, seed=9)  # 24 rows: oneDNN's path outside torch.func
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(parameters):
        return functional_call(model, parameters, (), {"input_ids": source, "labels": target}).loss

    gradients = grad(loss)(params)
    model(input_ids=source, labels=target).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(gradients[name], p.grad, rtol=1e-4, atol=1e-6)


def test_float32_products_go_to_onednn_on_the_cpus_where_it_was_measured_the_faster():
    """The float32 rule as measured (`training_means.py --bf16 no --means fp32-kernel`, `generate` alternating): a
    Zen 5 (AMD family 26) multiplies 1.6-2.3x faster through oneDNN's AVX-512 code than through MKL's AVX2 one; a Zen 4
    (family 25), whose 512-bit vectors run as two halves, at par (and oneDNN held 1.7 GB against 0.9); on Intel CPUs
    MKL runs AVX-512 itself; with AVX2 alone, or an unknown vendor, MKL stays."""
    from vaswani_transformer.modeling_vaswani_transformer import _onednn_float32_faster

    assert _onednn_float32_faster("AuthenticAMD", 26, "AVX512")
    assert not _onednn_float32_faster("AuthenticAMD", 25, "AVX512")
    assert not _onednn_float32_faster("AuthenticAMD", 26, "AVX2")
    assert not _onednn_float32_faster("GenuineIntel", 6, "AVX512")
    assert not _onednn_float32_faster("", 0, "AVX512")


def _onednn_products(function) -> tuple[int, object]:
    """(the number of oneDNN linear products, the result) of `function()`."""
    with torch.profiler.profile() as profile:
        result = function()
    return sum(event.name == "mkldnn::_linear_pointwise" for event in profile.events()), result


@onednn
def test_float32_linear_through_onednn_gives_xw_plus_b_and_its_gradients_as_close_to_float64_as_torchs_product(
    monkeypatch,
):
    """Where oneDNN's float32 product is the faster (AMD CPUs with AVX-512, on which MKL takes its AVX2 path: ~2.2x),
    `linear` multiplies float32 through oneDNN from 16 rows up: forward, dL/dx, dL/dW (and dL/db) each one oneDNN
    product, each as close to float64's as torch's product is; without autograd one product. Fewer rows, autocast and
    mkldnn off take torch's product. The whole model's gradients, so computed, are as close to float64's as those of
    torch's product."""
    from vaswani_transformer import modeling_vaswani_transformer as modeling

    monkeypatch.setattr(modeling, "_ONEDNN_FP32_FASTER", True)  # the path itself, on any x86 CPU with oneDNN
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 300)
    w, b = layer.weight.detach().double(), layer.bias.detach().double()
    for x in (torch.randn(3, 7, 256), torch.randn(256, 20).t()):  # 21 rows in 3-D; 20 rows of a transposed view
        grad = torch.randn(*x.shape[:-1], 300)
        x64 = x.double().requires_grad_()
        w64, b64 = w.clone().requires_grad_(), b.clone().requires_grad_()
        torch.nn.functional.linear(x64, w64, b64).backward(grad.double())
        errors = {}
        for route in ("onednn", "torch"):
            layer.zero_grad()
            xr = x.clone().requires_grad_()
            with plain_products() if route == "torch" else contextlib.nullcontext():
                calls, y = _onednn_products(lambda: modeling.linear(layer, xr))
                backward_calls, _ = _onednn_products(lambda: y.backward(grad))
            assert (calls, backward_calls) == ((1, 2) if route == "onednn" else (0, 0))
            reference = x64.detach() @ w.T + b
            errors[route] = [(y.double() - reference).abs().max(), (xr.grad.double() - x64.grad).abs().max(),
                             (layer.weight.grad.double() - w64.grad).abs().max(),
                             (layer.bias.grad.double() - b64.grad).abs().max()]  # fmt: skip
        for onednn_error, torch_error in zip(errors["onednn"], errors["torch"]):
            assert onednn_error <= 4 * torch_error + 1e-6, errors
        with torch.no_grad():
            calls, y = _onednn_products(lambda: modeling.linear(layer, x))
        assert calls == 1
        torch.testing.assert_close(y.double(), x.double() @ w.T + b, rtol=1e-5, atol=1e-5)

    few = torch.randn(15, 256, requires_grad=True)
    assert _onednn_products(lambda: modeling.linear(layer, few).sum().backward())[0] == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        calls, y = _onednn_products(lambda: modeling.linear(layer, torch.randn(32, 256)))
    assert calls == 0 and y.dtype == torch.bfloat16

    model = tiny_model(seed=5, d_model=64, num_heads=2, dropout=0.0)
    model64 = copy.deepcopy(model).double()
    source, target = random_ids(4, 9, seed=6), random_ids(4, 8, seed=7)
    model64(input_ids=source, labels=target).loss.backward()
    errors = {}
    for route in ("onednn", "torch"):
        model.zero_grad()
        with plain_products() if route == "torch" else contextlib.nullcontext():
            calls, loss = _onednn_products(lambda: model(input_ids=source, labels=target).loss)
            loss.backward()
        assert (calls > 0) == (route == "onednn")
        errors[route] = max((p.grad.double() - p64.grad).abs().max().item()
                            for p, p64 in zip(model.parameters(), model64.parameters()))  # fmt: skip
    assert errors["onednn"] <= 4 * errors["torch"] + 1e-7, errors


@onednn
def test_float32_products_of_fewer_than_16_rows_go_through_onednn_only_for_weights_of_2_19_entries_or_more(monkeypatch):
    """Below 16 rows (a beam step before its weights are packed) MKL's lighter call wins for small weights, oneDNN for
    weights of at least 2^19 entries: those multiply 1-15 rows through oneDNN, without autograd and with it (dL/dx
    and dL/dW too), as close to float64's x W^T + b and its gradients as torch's product; smaller ones take torch's."""
    from vaswani_transformer import modeling_vaswani_transformer as modeling

    monkeypatch.setattr(modeling, "_ONEDNN_FP32_FASTER", True)
    torch.manual_seed(0)
    for in_features, out_features, expected in ((512, 1024, 1), (256, 1000, 0)):  # 2^19 entries, and fewer
        layer = torch.nn.Linear(in_features, out_features)
        w, b = layer.weight.detach().double(), layer.bias.detach().double()
        for rows in (1, 4, 15):
            x = torch.randn(rows, in_features)
            with torch.no_grad():
                calls, y = _onednn_products(lambda: modeling.linear(layer, x))
            assert calls == expected, (out_features, rows)
            torch.testing.assert_close(y.double(), x.double() @ w.T + b, rtol=1e-5, atol=1e-5)
            grad = torch.randn(rows, out_features)
            layer.zero_grad()
            xr = x.clone().requires_grad_()
            calls, y = _onednn_products(lambda: modeling.linear(layer, xr))
            backward_calls, _ = _onednn_products(lambda: y.backward(grad))
            assert (calls, backward_calls) == (expected, 2 * expected)
            torch.testing.assert_close(xr.grad.double(), grad.double() @ w, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(layer.weight.grad.double(), grad.double().T @ x.double(), rtol=1e-5, atol=1e-5)


@onednn
def test_onednn_products_without_autograd_see_at_most_16_row_counts_per_doubling_and_give_xw_plus_b(monkeypatch):
    """oneDNN keeps the kernels it compiles for each row count for good, so without autograd (decoding, translating:
    every row count up to a batch's) its products take rows zero-padded to one of 16 sizes per doubling from 32 on
    (at most 1/16 more); the result, the padding's rows dropped, is x W^T + b in float64 for each of 1-300 rows, on a
    weight as stored (float32, where `_ONEDNN_FP32_FASTER`) and on a packed one. Training's products are not padded."""
    from vaswani_transformer import modeling_vaswani_transformer as modeling

    monkeypatch.setattr(modeling, "_ONEDNN_FP32_FASTER", True)
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1040)  # packed on any CPU
    w, b = layer.weight.detach().double(), layer.bias.detach().double()
    for packed in (False, True):
        seen = set()
        with torch.no_grad(), modeling.packed_cpu_weights() if packed else contextlib.nullcontext():
            for _ in range(3 if packed else 0):  # packed from the fourth use
                modeling.linear(layer, torch.randn(2, 512))
            for rows in range(1, 301):
                x = torch.randn(rows, 512) if rows % 2 else torch.randn(1, rows, 512)  # 2-D and 3-D
                with torch.profiler.profile(record_shapes=True) as profile:
                    y = modeling.linear(layer, x)
                shapes = [event.input_shapes[0] for event in profile.events()
                          if event.name == "mkldnn::_linear_pointwise"]  # fmt: skip
                assert len(shapes) == 1  # W of 2^19 entries or more: oneDNN at any row count
                for shape in shapes:
                    multiplied = math.prod(shape[:-1])  # the rows oneDNN multiplied
                    assert rows <= multiplied <= rows * 17 / 16 and (rows >= 32 or multiplied == rows), (rows, shape)
                    seen.add(multiplied)
                assert y.shape == (*x.shape[:-1], 1040)
                torch.testing.assert_close(y.double(), x.double() @ w.T + b, rtol=1e-5, atol=1e-5)
        for octave in (32, 64, 128, 256):
            assert len({rows for rows in seen if octave <= rows < 2 * octave}) <= 16, sorted(seen)
    x = torch.randn(37, 512, requires_grad=True)
    with torch.profiler.profile(record_shapes=True) as profile:
        modeling.linear(layer, x)
    assert [e.input_shapes[0][0] for e in profile.events() if e.name == "mkldnn::_linear_pointwise"] == [37]


@onednn
def test_generate_on_packed_weights_gives_the_plain_paths_tokens_and_follows_every_kind_of_weight_update():
    """`generate` packs the decoder's weights (each used once per step: packed at the 4th step) and gives the tokens
    and scores of torch's own product (mkldnn off); after each way of changing weights that torch does not count as a
    change to the parameter (a fused Adam step, `.data.copy_`), the next `generate` follows the new weights."""
    from vaswani_transformer import modeling_vaswani_transformer as modeling

    # every weight at least 1024 x 1024, as packing asks on any CPU (512 x 512 elsewhere than on Intel's)
    model = tiny_model(seed=3, dropout=0.1, d_model=1024, d_ff=1024, vocab_size=1024, encoder_layers=1,
                       decoder_layers=1)  # fmt: skip
    source, target = random_ids(3, 7, seed=4), random_ids(3, 6, seed=5)
    packed = []
    original = modeling.linear

    def spy(layer, x):  # which layers are packed when the decoding ends
        packs = modeling._PACKED_WEIGHTS.get()
        if layer is model.lm_head and packs:
            packed[:] = [name for name, module in model.named_modules() if torch.is_tensor(packs.get(module))]
        return original(layer, x)

    modeling.linear = spy
    try:
        model.generate(input_ids=source, num_beams=4, max_new_tokens=8, suppress_tokens=[2])
    finally:
        modeling.linear = original
    assert "lm_head" in packed and "model.decoder.layers.0.feed_forward.w1" in packed, packed
    assert "model.decoder.layers.0.encoder_attn.q_proj" in packed  # every step; its keys and values once, not packed
    assert not any(name.startswith("model.encoder.") or "encoder_attn.k_proj" in name or "encoder_attn.v_proj" in name
                   for name in packed), packed  # fmt: skip

    def decode():
        settings = dict(num_beams=4, max_new_tokens=8, suppress_tokens=[2], output_scores=True,
                        return_dict_in_generate=True)  # fmt: skip
        out = model.generate(input_ids=source, **settings)
        with plain_products():
            plain = model.generate(input_ids=source, **settings)
        assert torch.equal(out.sequences, plain.sequences)
        torch.testing.assert_close(out.sequences_scores, plain.sequences_scores, rtol=1e-4, atol=1e-4)  # float32 sums
        return out.sequences

    before = decode()
    model.train()
    model(input_ids=source, labels=target).loss.backward()
    torch.optim.Adam(model.parameters(), lr=0.5, fused=True).step()  # leaves every parameter's _version as it was
    model.eval()
    after_adam = decode()
    for parameter in model.parameters():
        parameter.data.copy_(torch.randn_like(parameter))  # as EMA and averaging code does; no version change either
    after_copy = decode()
    assert not torch.equal(before, after_adam) and not torch.equal(after_adam, after_copy)


@onednn
def test_generate_in_several_threads_at_once_gives_what_each_gives_alone():
    """Concurrent `generate` calls on one model (a threaded server), each packing its own copies (a context variable)
    and running oneDNN's products at the same time, translate as they do one at a time."""
    from concurrent.futures import ThreadPoolExecutor

    model = tiny_model(seed=6, d_model=1024, d_ff=1024, vocab_size=1024, encoder_layers=1, decoder_layers=1)
    sources = [random_ids(2, 5 + i, seed=10 + i) for i in range(4)]

    def translate(source):
        return model.generate(input_ids=source, num_beams=4, max_new_tokens=6, suppress_tokens=[2])

    alone = [translate(source) for source in sources]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(translate, sources * 2))
    assert all(torch.equal(a, b) for a, b in zip(alone * 2, together))
