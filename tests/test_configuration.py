"""The configuration: paper field names, validation, presets and their parameter counts (Table 3)."""

import pytest
import torch
from transformers import AutoConfig

from vaswani_transformer import (
    VaswaniTransformerConfig,
    VaswaniTransformerForConditionalGeneration,
    available_presets,
    preset_training_arguments,
)
from vaswani_transformer.configuration_vaswani_transformer import PAPER_PARAMETERS_M
from vaswani_transformer.train import parse_config_overrides


def count_parameters(config: VaswaniTransformerConfig) -> int:
    """Unique parameters of the full model (tied matrices once), built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = VaswaniTransformerForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())


def test_defaults_are_the_base_model():
    config = VaswaniTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.num_heads, config.d_ff) == (
        512, 6, 6, 8, 2048,
    )  # fmt: skip
    assert config.head_dim_k == config.head_dim_v == 64
    assert config.dropout == 0.1 and config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.share_embeddings and config.scale_embedding and config.position_encoding == "sinusoidal"
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (512, 8, 6)


@pytest.mark.parametrize("name", available_presets())
def test_every_preset_has_the_paper_parameter_count(name):
    """Table 3 with a shared 37k vocabulary: within 7% of the paper where it reports a count; rows (A), (D) and the
    label-smoothing rows leave the size unchanged; (E) adds the learned position table."""
    count = count_parameters(VaswaniTransformerConfig.from_preset(name, vocab_size=37000))
    base = count_parameters(VaswaniTransformerConfig(vocab_size=37000))
    if name in PAPER_PARAMETERS_M:
        assert abs(count / 1e6 - PAPER_PARAMETERS_M[name]) / PAPER_PARAMETERS_M[name] < 0.07, count
    elif name == "E-learned":
        assert count == base + 2 * 1024 * 512  # one learned table per stack
    else:
        assert count == base


def test_base_and_big_counts():
    assert round(count_parameters(VaswaniTransformerConfig.from_preset("base")) / 1e6) == 63
    assert round(count_parameters(VaswaniTransformerConfig.from_preset("big")) / 1e6) == 214


def test_presets_hold_table3_values():
    big = VaswaniTransformerConfig.from_preset("big")
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)
    b16 = VaswaniTransformerConfig.from_preset("B-dk16")
    assert (b16.head_dim_k, b16.head_dim_v) == (16, 64)
    a1 = VaswaniTransformerConfig.from_preset("A-h1")
    assert (a1.num_heads, a1.head_dim_k, a1.head_dim_v) == (1, 512, 512)
    assert VaswaniTransformerConfig.from_preset("E-learned").position_encoding == "learned"
    assert VaswaniTransformerConfig.from_preset("C-N2", dropout=0.2).dropout == 0.2  # overrides win
    # Training values of a row live with the training recipe, not in the model config.
    assert preset_training_arguments("D-ls0.2")["label_smoothing_factor"] == 0.2
    assert preset_training_arguments("base") == {"label_smoothing_factor": 0.1, "max_steps": 100_000, "warmup_steps": 4000}
    assert preset_training_arguments("big")["max_steps"] == 300_000
    assert "label_smoothing_factor" not in VaswaniTransformerConfig.from_preset("D-ls0.2").to_dict()


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown preset 'huge'.*base, big"):
        VaswaniTransformerConfig.from_preset("huge")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"d_model": 500}, r"`d_model` \(500\) must be divisible by `num_heads` \(8\)"),
        ({"d_model": 0}, r"`d_model` must be a positive integer"),
        ({"num_heads": -1}, r"`num_heads` must be a positive integer"),
        ({"d_ff": 0}, r"`d_ff` must be a positive integer"),
        ({"encoder_layers": 0}, r"`encoder_layers` must be a positive integer"),
        ({"vocab_size": 0}, r"`vocab_size` must be a positive integer"),
        ({"d_k": 0}, r"`d_k` must be a positive integer"),
        ({"dropout": 1.0}, r"`dropout` must be in \[0, 1\)"),
        ({"attention_dropout": -0.1}, r"`attention_dropout` must be in \[0, 1\)"),
        ({"activation_dropout": 1.5}, r"`activation_dropout` must be in \[0, 1\)"),
        ({"position_encoding": "rotary"}, r"`position_encoding` must be 'sinusoidal' or 'learned'"),
        ({"init_std": float("nan")}, r"`init_std` must be positive and finite"),  # (NaN <= 0 is false: it passed)
    ],
)
def test_invalid_values_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VaswaniTransformerConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"normalize_before": True}, r"normalize_before=True is kept but used by nothing: .* post-LN"),
    ({"activation_function": "gelu"}, r"activation_function='gelu' .* computes activation_function='relu'"),
    ({"layer_norm_eps": 1e-6}, r"layer_norm_eps=1e-06 is kept but used by nothing"),
])  # fmt: skip
def test_other_transformers_features_are_warned_about_as_unused(kwargs, message, recwarn):
    """Features this model fixes as the paper's (post-LN, ReLU, LayerNorm's eps): another value is kept, read by
    nothing, and said (before: kept without a word); the paper's own value is quiet."""
    with pytest.warns(UserWarning, match=message):
        VaswaniTransformerConfig(**kwargs)
    recwarn.clear()
    VaswaniTransformerConfig(normalize_before=False, activation_function="relu", layer_norm_eps=1e-5)
    assert not [w for w in recwarn if "used by nothing" in str(w.message)]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_heads": 5}, r"`d_model` \(32\) must be divisible by `num_heads` \(5\)"),
        ({"position_encoding": "tensor2tensr"}, r"`position_encoding` must be 'sinusoidal' or 'learned'"),
        ({"encoder_layers": 0}, r"`encoder_layers` must be a positive integer"),
        ({"position_offset": -1}, r"`position_offset` must be 0 or more"),
        ({"tie_word_embeddings": False}, r"`tie_word_embeddings` \(False\) follows `share_embeddings` \(True\)"),
    ],
)
def test_invalid_values_given_to_from_pretrained_fail_before_a_model_is_built(tmp_path, overrides, message):
    """transformers sets from_pretrained's keyword values after the config is built, past its checks: building a model
    from such a config checks them (before: a model with 6-wide heads, or sinusoids for a misspelt encoding, trained
    and saved, and only loading it again failed)."""
    VaswaniTransformerConfig(d_model=32, num_heads=4, d_ff=64, vocab_size=50).save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, **overrides)
    with pytest.raises(ValueError, match=message):
        VaswaniTransformerForConditionalGeneration(config)


def test_an_explicit_tie_must_agree_with_share_embeddings_and_follows_its_later_changes(tmp_path):
    """The paper's three-way tie is one switch, `share_embeddings`: `tie_word_embeddings` follows it (before, an
    explicit tie_word_embeddings=False was silently replaced by True); set after construction (from_pretrained's
    keyword values), `share_embeddings` moves the tie with it."""
    with pytest.raises(ValueError, match=r"`tie_word_embeddings` \(False\) follows `share_embeddings` \(True\)"):
        VaswaniTransformerConfig(tie_word_embeddings=False)
    assert VaswaniTransformerConfig(share_embeddings=False, tie_word_embeddings=False).tie_word_embeddings is False
    VaswaniTransformerConfig(d_model=32, num_heads=4, d_ff=64, vocab_size=50).save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, share_embeddings=False)
    assert config.tie_word_embeddings is False
    model = VaswaniTransformerForConditionalGeneration(config)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()


def test_a_keyword_close_to_a_field_name_warns_and_other_extras_stay_quiet(tmp_path, recwarn):
    """transformers keeps unknown keywords as attributes nothing reads: `encoder_layer=3` built a 6-layer model
    without a word. A keyword close to a field's name warns, naming the field; the extras configs carry (a run's
    `custom_pipelines`, decoding settings of old config files) do not."""
    for typo, field in (("encoder_layer", "encoder_layers"), ("dropout_rate", "dropout"), ("dff", "d_ff")):
        with pytest.warns(UserWarning, match=rf"unknown field '{typo}' is kept but used by nothing \(a typo of "
                          rf"'{field}'\?\)"):
            config = VaswaniTransformerConfig(**{typo: 3})
        assert getattr(config, field) != 3
    recwarn.clear()
    config = VaswaniTransformerConfig(d_model=32, num_heads=4, vocab_size=50, num_beams=5, forced_eos_token_id=2)
    config.custom_pipelines = {"translation": {}}
    config.save_pretrained(tmp_path)
    AutoConfig.from_pretrained(tmp_path)
    assert not [w for w in recwarn if "unknown field" in str(w.message)]


def test_standard_names_set_their_fields_without_a_typo_warning(recwarn):
    """hidden_size, num_attention_heads and num_hidden_layers (the config's attribute_map) set d_model, num_heads and
    encoder_layers with no warning (each warned it was "a typo of" itself); a typo of one still warns."""
    config = VaswaniTransformerConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=2)
    assert (config.d_model, config.num_heads, config.encoder_layers) == (256, 4, 2)
    assert not [w for w in recwarn if "unknown field" in str(w.message)]
    with pytest.warns(UserWarning, match=r"unknown field 'hidden_sizes' .*\(a typo of 'hidden_size'\?\)"):
        VaswaniTransformerConfig(hidden_sizes=256)


def test_config_overrides_take_standard_names_and_answer_a_typo_with_the_closest_fields():
    """--config_overrides maps the standard names as the config does (they were refused); an unknown field is an
    error naming the closest fields before the full list (which was alphabetical, with no suggestion)."""
    overrides = parse_config_overrides("hidden_size=64,num_attention_heads=4,num_hidden_layers=2")
    assert overrides == {"d_model": 64, "num_heads": 4, "encoder_layers": 2}
    with pytest.raises(ValueError, match="config_overrides: d_model is given twice \\(hidden_size, d_model\\)"):
        parse_config_overrides("hidden_size=64,d_model=32")
    with pytest.raises(ValueError) as error:
        parse_config_overrides("encoder_layer=3")
    message = str(error.value)
    assert "'encoder_layer': did you mean 'encoder_layers'" in message
    assert message.index("'encoder_layers'") < message.index("Valid fields:")


def test_explicit_head_sizes_lift_the_divisibility_rule():
    config = VaswaniTransformerConfig(d_model=500, num_heads=8, d_k=64, d_v=64)
    assert config.head_dim_k == 64


def test_round_trip_through_disk_and_autoconfig(tmp_path):
    config = VaswaniTransformerConfig.from_preset("B-dk32", vocab_size=1234)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VaswaniTransformerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()


def test_share_embeddings_switches_output_tie():
    assert VaswaniTransformerConfig(share_embeddings=False).tie_word_embeddings is False
    assert VaswaniTransformerConfig().tie_word_embeddings is True
