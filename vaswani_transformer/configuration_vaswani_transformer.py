"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), with the paper's presets.

This file is copied next to the weights by `save_pretrained` for `trust_remote_code` users: it imports only
`transformers` (and what `transformers` itself needs).
"""

import copy
import dataclasses
import difflib
import functools
import math
import warnings

from huggingface_hub.dataclasses import strict
from transformers import GenerationConfig, PreTrainedConfig


# Paper, Table 3. Each preset is a set of changes to the base model ("model") and, separately, to the training
# recipe ("training": read by the training code, never stored in the model config). Unlisted values are base's.
_BASE_TRAINING = {"label_smoothing_factor": 0.1, "max_steps": 100_000, "warmup_steps": 4000}
PRESETS: dict[str, dict[str, dict]] = {
    "base": {"model": {}, "training": {}},
    "big": {
        "model": {"d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout": 0.3},
        "training": {"max_steps": 300_000},
    },
    # (A) number of heads, keeping the amount of computation constant.
    "A-h1": {"model": {"num_heads": 1, "d_k": 512, "d_v": 512}, "training": {}},
    "A-h4": {"model": {"num_heads": 4, "d_k": 128, "d_v": 128}, "training": {}},
    "A-h16": {"model": {"num_heads": 16, "d_k": 32, "d_v": 32}, "training": {}},
    "A-h32": {"model": {"num_heads": 32, "d_k": 16, "d_v": 16}, "training": {}},
    # (B) smaller attention key size d_k alone (d_v stays 64).
    "B-dk16": {"model": {"d_k": 16}, "training": {}},
    "B-dk32": {"model": {"d_k": 32}, "training": {}},
    # (C) model size.
    "C-N2": {"model": {"encoder_layers": 2, "decoder_layers": 2}, "training": {}},
    "C-N4": {"model": {"encoder_layers": 4, "decoder_layers": 4}, "training": {}},
    "C-N8": {"model": {"encoder_layers": 8, "decoder_layers": 8}, "training": {}},
    "C-d256": {"model": {"d_model": 256, "d_k": 32, "d_v": 32}, "training": {}},
    "C-d1024": {"model": {"d_model": 1024, "d_k": 128, "d_v": 128}, "training": {}},
    "C-dff1024": {"model": {"d_ff": 1024}, "training": {}},
    "C-dff4096": {"model": {"d_ff": 4096}, "training": {}},
    # (D) regularisation.
    "D-drop0.0": {"model": {"dropout": 0.0}, "training": {}},
    "D-drop0.2": {"model": {"dropout": 0.2}, "training": {}},
    "D-ls0.0": {"model": {}, "training": {"label_smoothing_factor": 0.0}},
    "D-ls0.2": {"model": {}, "training": {"label_smoothing_factor": 0.2}},
    # (E) learned positional embeddings instead of sinusoids.
    "E-learned": {"model": {"position_encoding": "learned"}, "training": {}},
}
# Parameter counts (millions) the paper reports in Table 3 (for its 37k shared EN-DE vocabulary).
PAPER_PARAMETERS_M = {
    "base": 65, "big": 213, "B-dk16": 58, "B-dk32": 60, "C-N2": 36, "C-N4": 50, "C-N8": 80,
    "C-d256": 28, "C-d1024": 168, "C-dff1024": 53, "C-dff4096": 90,
}  # fmt: skip


def available_presets() -> list[str]:
    """Names accepted by `VaswaniTransformerConfig.from_preset`."""
    return list(PRESETS)


def _preset(name: str) -> dict[str, dict]:
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Valid presets: {', '.join(PRESETS)}.")
    return PRESETS[name]


def preset_training_arguments(name: str) -> dict:
    """The training-recipe values of a preset (label smoothing, steps, warmup): `scripts/train.py` trains with them
    unless a flag or recipe key sets them (`training.preset_training_defaults`)."""
    return {**_BASE_TRAINING, **copy.deepcopy(_preset(name)["training"])}


# Other configs' names for features this model fixes as the paper does (post-LN, ReLU, LayerNorm's eps of torch's
# default): given with another value, the config describes a model that is not built, so a warning says so (not an
# error: generic tools set some of them on any config, transformers' tests layer_norm_eps=1.0).
_FIXED_FEATURES = {
    **dict.fromkeys(("normalize_before", "encoder_normalize_before", "decoder_normalize_before", "pre_norm"), False),
    **dict.fromkeys(("activation_function", "activation_fn", "hidden_act"), "relu"),
    **dict.fromkeys(("layer_norm_eps", "layer_norm_epsilon"), 1e-5),
}


@functools.cache
def _generation_fields() -> frozenset[str]:
    return frozenset(GenerationConfig().to_dict())


@strict
class VaswaniTransformerConfig(PreTrainedConfig):
    r"""
    Configuration of the Transformer of "Attention Is All You Need". Defaults are the paper's base model.

    d_model (`int`): size of every layer's input and output (and of the embeddings).
    encoder_layers, decoder_layers (`int`): N, the number of identical layers in each stack.
    num_heads (`int`): h, the number of attention heads.
    d_ff (`int`): inner size of the position-wise feed-forward networks.
    d_k, d_v (`int`, *optional*): per-head query/key and value sizes; default `d_model // num_heads` each.
    dropout (`float`): P_drop, applied to every sub-layer output before the residual addition and to the sums of
        embeddings and positional encodings.
    attention_dropout, activation_dropout (`float`): dropout on attention weights and inside the feed-forward
        network; 0.0 as in the paper.
    share_embeddings (`bool`): one matrix for source embeddings, target embeddings and the pre-softmax projection
        (`tie_word_embeddings` follows it; a different value is an error).
    scale_embedding (`bool`): multiply embeddings by sqrt(d_model).
    position_encoding (`str`): "sinusoidal" (the paper's formula), "learned" (Table 3 row E) or "tensor2tensor" (the
        authors' code and fairseq: sines and cosines as concatenated halves, frequencies 10000^(-i/(d_model/2 - 1))).
    position_offset (`int`): number of the first position of the computed encodings (fairseq: padding index + 1).
    max_position_embeddings (`int`): number of learned positions; unused by sinusoidal encodings (no length limit).
    init_std (`float`, *optional*): standard deviation of the embedding initialisation; default d_model ** -0.5.
    """

    model_type = "vaswani_transformer"
    keys_to_ignore_at_inference = ["cache"]  # outputs the Trainer drops in evaluation: the key/value cache
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_heads: int = 8
    d_ff: int = 2048
    d_k: int | None = None
    d_v: int | None = None
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    share_embeddings: bool = True
    scale_embedding: bool = True
    position_encoding: str = "sinusoidal"
    position_offset: int = 0
    max_position_embeddings: int = 1024
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool | None = None  # follows share_embeddings (one switch)
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        self._warn_about_likely_typos(kwargs)
        # The three-way tie is one switch: `share_embeddings` also ties the output projection.
        if self.tie_word_embeddings is None:
            self.tie_word_embeddings = self.share_embeddings
        self.check_fields()
        super().__post_init__(**kwargs)

    def __setattr__(self, key, value):
        super().__setattr__(key, value)
        if key == "share_embeddings" and "tie_word_embeddings" in self.__dict__:  # set after construction
            super().__setattr__("tie_word_embeddings", value)

    def _warn_about_likely_typos(self, extra: dict):
        """A warning for each unknown keyword close to a field's name (`encoder_layer=3`): transformers keeps unknown
        keywords as attributes that nothing reads (configs on the Hub carry such extras, so they stay allowed). A
        feature of other Transformers that this one fixes as the paper's (`normalize_before=True`, GELU, another
        LayerNorm eps) is warned about too: no model built from the config has it."""
        for key, paper in _FIXED_FEATURES.items():
            if key in extra and extra[key] != paper:
                warnings.warn(f"{type(self).__name__}: {key}={extra[key]!r} is kept but used by nothing: this model is "
                              f"the paper's, post-LN with ReLU and LayerNorm's eps 1e-5, and computes {key}={paper!r}.",
                              stacklevel=5)  # fmt: skip
        known = [f.name for f in dataclasses.fields(self)] + list(self.attribute_map)
        # (standard names such as hidden_size are known; decoding settings in old config files are the decoding's)
        for key in set(extra) - set(known) - _generation_fields():
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
            if close:
                warnings.warn(
                    f"{type(self).__name__}: unknown field {key!r} is kept but used by nothing (a typo of "
                    f"{close[0]!r}?)",
                    stacklevel=5,  # the code that built the config
                )

    def check_fields(self):
        """Raise a ValueError naming the field and the rule for every invalid value. Run at construction and by the
        models built from the config (transformers sets `from_pretrained`'s keyword values after construction)."""
        for name in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "num_heads", "d_ff",
                     "max_position_embeddings"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"`{name}` must be a positive integer or None, got {value}.")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.num_heads != 0:
            raise ValueError(
                f"`d_model` ({self.d_model}) must be divisible by `num_heads` ({self.num_heads}) when `d_k` or "
                "`d_v` is not given (they default to d_model / num_heads)."
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1), got {value}.")
        if self.position_encoding not in ("sinusoidal", "learned", "tensor2tensor"):
            raise ValueError(
                "`position_encoding` must be 'sinusoidal' or 'learned' (the paper) or 'tensor2tensor' (the authors' "
                f"code), got {self.position_encoding!r}."
            )
        if self.position_offset < 0 or (self.position_offset and self.position_encoding == "learned"):
            raise ValueError(
                f"`position_offset` must be 0 or more, and 0 with learned positions, got {self.position_offset} "
                f"with position_encoding={self.position_encoding!r}."
            )
        if self.position_encoding == "tensor2tensor" and self.d_model < 4:
            raise ValueError(f"position_encoding='tensor2tensor' needs d_model >= 4, got {self.d_model}.")
        if self.init_std is not None and not 0 < self.init_std < math.inf:  # (NaN is neither)
            raise ValueError(f"`init_std` must be positive and finite, or None, got {self.init_std}.")
        if self.tie_word_embeddings != self.share_embeddings:
            raise ValueError(
                f"`tie_word_embeddings` ({self.tie_word_embeddings}) follows `share_embeddings` "
                f"({self.share_embeddings}): the paper's three-way tie is one switch; set `share_embeddings` only."
            )

    @property
    def head_dim_k(self) -> int:
        """d_k: per-head size of queries and keys."""
        return self.d_k if self.d_k is not None else self.d_model // self.num_heads

    @property
    def head_dim_v(self) -> int:
        """d_v: per-head size of values."""
        return self.d_v if self.d_v is not None else self.d_model // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VaswaniTransformerConfig":
        """The configuration of a paper preset ("base", "big" or a Table 3 row, see `available_presets()`)."""
        return cls(**{**_preset(name)["model"], **overrides})


__all__ = ["VaswaniTransformerConfig", "available_presets", "preset_training_arguments", "PRESETS"]
