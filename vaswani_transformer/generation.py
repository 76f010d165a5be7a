"""Decoding as the paper did it (Section 6.1): beam search with the GNMT length penalty.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [Wu et al., 2016] ... We set the maximum
output length during inference to input length + 50, but terminate early when possible."

`model.generate(**inputs)` does exactly that by default (and so do `Seq2SeqTrainer(predict_with_generate=True)` and
models loaded with `trust_remote_code=True`), through three extension points of transformers:

- `VaswaniGenerationConfig.from_model_config` gives every new model the paper's generation config (saved as
  `generation_config.json`): `num_beams=4`, `length_penalty=0.6`, `early_stopping=True` and four custom fields that
  `GenerationConfig` keeps and saves, `length_penalty_type="gnmt"`, `beam_search_rules="t2t"`, `max_len_a=1`,
  `max_len_b=50`.
- `VaswaniGenerationMixin.generate` resolves those fields, turns the length rule into transformers' `max_length` and,
  for deterministic beam search with `length_penalty_type="gnmt"`, hands `paper_beam_search` to transformers'
  `generate` as its `custom_generate` callable: transformers prepares the inputs (encoder run once, inputs expanded
  per beam, cache (dynamic or static), logits processors, stopping criteria), `paper_beam_search` runs the decoding
  loop in named steps, as tensor2tensor's `beam_search` does (`_top_candidates` = grow_topk, `_grow_finished`,
  `_grow_alive`, `_sentences_done` = _is_not_finished), with tensor2tensor's rules by default or fairseq's.
- Everything else (`length_penalty_type="transformers"`, greedy, sampling, constrained or assisted decoding) is
  transformers' own `generate`, unchanged but for the length rule (greedy search and sampling stop each sentence at
  its own limit through a stopping criterion).

This file is copied next to the weights for `trust_remote_code` users: it imports only torch and transformers.
"""

import copy
import functools
import inspect
import math
import numbers
import types
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import (
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput
from transformers.utils import logging


logger = logging.get_logger(__name__)

# Attention kernels whose cross-attention lets a source row serve several consecutive target rows (its beams): the
# model groups their queries (`modeling_vaswani_transformer._grouped_queries`); under others the decoder copies it.
# Add the name of a registered kernel that takes any number of queries per row and a mask that broadcasts over them.
SHARED_SOURCE_KERNELS = {"eager", "sdpa"}
# A compiled decoding step takes the search's update into its graph where it can (`_search_compiles`); False: the
# search runs uncompiled after the compiled step (the benchmark's comparison row).
_SEARCH_COMPILES = True

# The paper's decoding (Section 6.1). max_len_a/max_len_b are fairseq's `max_len_a * source length + max_len_b` rule.
PAPER_GENERATION_DEFAULTS = {
    "num_beams": 4,
    "length_penalty": 0.6,
    "early_stopping": True,
    "length_penalty_type": "gnmt",
    "beam_search_rules": "t2t",
    "max_len_a": 1,
    "max_len_b": 50,
}
LENGTH_PENALTY_TYPES = ("gnmt", "transformers")
BEAM_SEARCH_RULES = ("t2t", "fairseq")
CUSTOM_GENERATION_FIELDS = ("length_penalty_type", "beam_search_rules", "max_len_a", "max_len_b")
_MISSING = object()


def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / (5 + 1)) ** alpha (Wu et al., 2016, eq. 14); `length` is an int or a tensor."""
    return ((5 + length) / 6) ** alpha


class VaswaniGenerationConfig(GenerationConfig):
    """A `GenerationConfig` whose model-derived default is the paper's decoding (see `PAPER_GENERATION_DEFAULTS`).

    Custom fields (kept and saved by `GenerationConfig` like any unknown keyword):

    - `length_penalty_type` (`"gnmt"` or `"transformers"`): how `length_penalty` (alpha) ranks finished beam search
      hypotheses. `"gnmt"`: log P(Y|X) / ((5 + |Y|) / 6) ** alpha, the paper's; `"transformers"`: transformers' own
      log P(Y|X) / |Y| ** alpha (its built-in beam search, unchanged).
    - `beam_search_rules` (`"t2t"` or `"fairseq"`): which hypotheses may finish and when a sentence stops in
      `paper_beam_search` (with `length_penalty_type="gnmt"`). `"t2t"`, the default, is tensor2tensor's beam search,
      the one behind the paper's numbers; `"fairseq"` is fairseq's `SequenceGenerator` (see `paper_beam_search`).
    - `max_len_a`, `max_len_b` (numbers or None): each sentence generates at most
      `int(max_len_a * source_length + max_len_b)` tokens, source_length being its number of non-padding tokens
      (its `</s>` included). Used unless `max_length` or `max_new_tokens` is set: passed to `generate`, in a
      `generation_config` passed to it, or in the model's own generation config (in a config a `max_length` of 20,
      transformers' default, which Seq2SeqTrainer writes into the model's, does not count; and `max_len_a`/
      `max_len_b` passed to `generate` beat a length saved there); set `max_len_b=None` to fall back to the config's
      own `max_length`.
      With learned positions (Table 3 row E) the rule is capped at the decoder's `max_position_embeddings`.
    """

    @classmethod
    def from_model_config(cls, model_config) -> "VaswaniGenerationConfig":
        generation_config = super().from_model_config(model_config)
        for name, value in PAPER_GENERATION_DEFAULTS.items():
            if getattr(generation_config, name, None) is None:
                setattr(generation_config, name, value)
        # A deliberate generation config, not a copy of model-config fields: saved with `_from_model_config: false`,
        # otherwise `GenerationConfig.from_pretrained` would drop the custom fields when loading it back.
        generation_config._from_model_config = False
        generation_config._original_object_hash = hash(generation_config)
        return generation_config


def _resolve_custom_field(name: str, kwargs: dict, generation_config, model_generation_config):
    """kwargs > the `generation_config` passed to `generate` > the model's generation config > the paper's value."""
    if name in kwargs:
        return kwargs.pop(name)
    for config in (generation_config, model_generation_config):
        value = getattr(config, name, _MISSING) if config is not None else _MISSING
        if value is not _MISSING:
            return value
    return PAPER_GENERATION_DEFAULTS[name]


def source_padding_mask(input_ids: torch.Tensor | None, config) -> torch.Tensor | None:
    """A source given without `attention_mask`: its pad tokens are padding, as fairseq's encoder always reads them
    (transformers infers this for decoder-only models alone). None where pad and eos are one token, or no ids."""
    if input_ids is None or config.pad_token_id is None or config.pad_token_id == config.eos_token_id:
        return None
    return (input_ids != config.pad_token_id).long()


def _with_decoder_start(model, generation_config, kwargs: dict) -> None:
    """A decoder prompt none of whose rows starts with the decoder start token gets it in front (and a 1 in front of
    its mask), as transformers' `generate` does after the length rule is set (the same test): done first, the rule
    counts the prompt that is decoded."""
    prompt = kwargs.get("decoder_input_ids")
    if not torch.is_tensor(prompt) or prompt.ndim != 2 or prompt.shape[-1] == 0:
        return
    config, _ = model._prepare_generation_config(generation_config, **kwargs)
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    if start is None:
        return
    start = torch.as_tensor(start, dtype=prompt.dtype, device=prompt.device).view(-1, 1)
    start = start.expand(prompt.shape[0], 1) if start.shape[0] == 1 else start
    if start.shape[0] != prompt.shape[0] or not bool((prompt[:, 0] != start[:, 0]).all()):
        return  # (a start token per row for another batch size: transformers' error)
    kwargs["decoder_input_ids"] = torch.cat([start, prompt], dim=-1)
    mask = kwargs.get("decoder_attention_mask")
    if torch.is_tensor(mask):
        kwargs["decoder_attention_mask"] = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=-1)


def _source_lengths(inputs, kwargs: dict, config) -> torch.Tensor:
    """Number of real (non-padding) source tokens per sentence, from the attention mask or else the ids (where pad
    and eos are one token, the tokens other than it and the sentence's own </s>)."""
    attention_mask = kwargs.get("attention_mask")
    if attention_mask is not None:
        return attention_mask.sum(-1)
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    if input_ids is not None:
        pad_token_id = config.pad_token_id
        if pad_token_id is None:
            return torch.full(input_ids.shape[:1], input_ids.shape[-1], device=input_ids.device)
        padding = input_ids == pad_token_id
        lengths = (~padding).sum(-1)
        return lengths + padding.any(-1) if pad_token_id == config.eos_token_id else lengths
    for name in ("inputs_embeds", "encoder_outputs"):
        states = kwargs.get(name)
        if states is not None:
            states = states if torch.is_tensor(states) else states[0]
            return torch.full(states.shape[:1], states.shape[1], device=states.device)
    raise ValueError(
        "generate() needs `input_ids` (or `inputs_embeds`, `encoder_outputs`, `attention_mask`) to apply the length "
        "rule max_len_a * source length + max_len_b; pass them, or pass `max_length`/`max_new_tokens`."
    )


def _check_custom_fields(length_penalty_type, beam_search_rules, max_len_a, max_len_b):
    if length_penalty_type not in LENGTH_PENALTY_TYPES:
        raise ValueError(
            f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {length_penalty_type!r}."
        )
    if beam_search_rules not in BEAM_SEARCH_RULES:
        raise ValueError(f"`beam_search_rules` must be one of {BEAM_SEARCH_RULES}, got {beam_search_rules!r}.")
    for name, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):  # (NaN fails it too)  # fmt: skip
            raise ValueError(f"`{name}` must be a non-negative finite number or None, got {value!r}.")


class VaswaniGenerationMixin(GenerationMixin):
    """`generate` whose default is the paper's beam search (see the module docstring and `paper_beam_search`)."""

    def adjust_generation_fn(self, generation_config, *args, **kwargs):
        """`from_pretrained`'s loading of the generation config. A folder without a deliberate one (no
        `generation_config.json`, or one transformers derived from `config.json`) gets the paper's decoding, as a
        model built from its config does: transformers would derive a plain one (greedy search) from `config.json`."""
        super().adjust_generation_fn(generation_config, *args, **kwargs)
        if generation_config is None and getattr(self.generation_config, "_from_model_config", False):
            self.generation_config = VaswaniGenerationConfig.from_model_config(self.config)

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor=None,
        stopping_criteria=None,
        prefix_allowed_tokens_fn=None,
        synced_gpus: bool | None = None,
        assistant_model=None,
        streamer=None,
        negative_prompt_ids=None,
        negative_prompt_attention_mask=None,
        custom_generate=None,
        **kwargs,
    ):
        """transformers' `generate`, with the paper's beam search when the generation config asks for it.

        Extra generation-config fields (keyword arguments here, or attributes of the generation config):
        `length_penalty_type` ("gnmt", the default, or "transformers"), `beam_search_rules` ("t2t", the default, or
        "fairseq"), `max_len_a` and `max_len_b` (see `VaswaniGenerationConfig`). Deterministic beam search
        (`num_beams > 1`, no sampling, constraints, beam groups or assistant) with `length_penalty_type="gnmt"` runs
        `paper_beam_search`; anything else is transformers' own `generate`.

        The length rule applies in both cases: per sentence in the paper's beam search and in transformers' greedy
        search and sampling (a stopping criterion; `forced_eos_token_id` is forced at each sentence's own limit too),
        in transformers' other decoding as one `max_length` for the batch (the longest sentence's limit). It is not
        used where a length is set: `max_length` or `max_new_tokens` passed here, set in the `generation_config`
        passed here, or set in the model's own `generation_config` (saved with it) unless `max_len_a`/`max_len_b` are
        passed here, except a `max_length` of 20 in a config (transformers' default, which Seq2SeqTrainer writes into
        the model's config, and so into one saved from it and passed here; pass `max_length=20` to mean it).
        """
        rule_passed = any(
            kwargs.get(name) is not None or getattr(generation_config, name, None) is not None
            for name in ("max_len_a", "max_len_b")
        )  # a rule passed now beats a length saved in the model's generation config
        fields = {
            name: _resolve_custom_field(name, kwargs, generation_config, self.generation_config)
            for name in CUSTOM_GENERATION_FIELDS
        }
        _check_custom_fields(**fields)
        # the encoder, every decoding step's cross-attention and the length rule skip the source's pad tokens
        source_ids = inputs if inputs is not None else kwargs.get("input_ids")
        given = kwargs.get("attention_mask") is not None or kwargs.get("encoder_outputs") is not None
        if torch.is_tensor(source_ids) and not given:
            inferred = source_padding_mask(source_ids, self.config)
            if inferred is not None:
                kwargs["attention_mask"] = inferred
        _with_decoder_start(self, generation_config, kwargs)
        sentence_max_new_tokens = None
        saved = None if rule_passed else self.generation_config
        if not _length_given(kwargs, generation_config, saved) and fields["max_len_b"] is not None:
            lengths = _source_lengths(inputs, kwargs, self.config)
            # in double precision, as fairseq's int(a * length + b): float32 makes int(1.3 * 90) 116 (on the CPU: MPS
            # has no float64)
            rule = lengths.cpu().double() * (fields["max_len_a"] or 0) + fields["max_len_b"]
            sentence_max_new_tokens = rule.long().to(lengths.device)
            if int(sentence_max_new_tokens.min()) < 1:
                bad = int(sentence_max_new_tokens.argmin())
                raise ValueError(
                    f"max_len_a * source length + max_len_b is {int(sentence_max_new_tokens[bad])} for sentence {bad} "
                    f"(source length {int(lengths[bad])}): it must allow at least one generated token."
                )
            decoder_input_ids = kwargs.get("decoder_input_ids")
            prompt_length = decoder_input_ids.shape[-1] if decoder_input_ids is not None else 1
            if getattr(self.config, "position_encoding", None) == "learned":
                # The decoder reads every token but the last: at most max_position_embeddings + 1 in all.
                room = self.config.max_position_embeddings + 1 - prompt_length
                asked = int(sentence_max_new_tokens.max())
                sentence_max_new_tokens = sentence_max_new_tokens.clamp(max=max(room, 1))
                if asked > max(room, 1):  # as the CTranslate2 engine says it (once: translating runs many batches)
                    logger.warning_once(
                        f"Decoding limited to {max(room, 1)} new tokens by the decoder's "
                        f"{self.config.max_position_embeddings} learned positions, fewer than the length rule "
                        "(max_len_a * source length + max_len_b) allows some sentences."
                    )
            if self.generation_config.max_new_tokens is not None:  # saved: it would beat a max_length given here
                generation_config = _with_field(
                    generation_config, kwargs, "max_new_tokens", int(sentence_max_new_tokens.max())
                )
            else:
                generation_config = _with_field(
                    generation_config, kwargs, "max_length", prompt_length + int(sentence_max_new_tokens.max())
                )

        effective_config, _ = self._prepare_generation_config(generation_config, **kwargs)
        if sentence_max_new_tokens is None:
            _check_length_fits_learned_positions(self.config, effective_config, kwargs.get("decoder_input_ids"))
        num_beams = effective_config.num_beams
        if isinstance(num_beams, bool) or not isinstance(num_beams, numbers.Integral) or num_beams < 1:
            raise ValueError(f"`num_beams` must be a positive integer (1 for greedy decoding), got {num_beams!r}.")
        alpha = effective_config.length_penalty
        if alpha is not None and not (isinstance(alpha, numbers.Real) and math.isfinite(alpha)):  # NaN ranks nothing
            raise ValueError(f"`length_penalty` must be a finite number, got {alpha!r}.")
        mode = effective_config.get_generation_mode(assistant_model)
        if fields["length_penalty_type"] == "gnmt" and custom_generate is None and mode == GenerationMode.BEAM_SEARCH:
            if streamer is not None:  # as transformers' beam search
                raise ValueError("`streamer` cannot be used with beam search: set `num_beams=1`.")
            if synced_gpus is None:
                synced_gpus = _default_synced_gpus(self)
            if effective_config.stop_strings and kwargs.get("tokenizer") is not None:
                # transformers hands a callable custom_generate no `tokenizer`, so it could not build this criterion
                stop = StopStringCriteria(kwargs.pop("tokenizer"), effective_config.stop_strings)
                stopping_criteria = StoppingCriteriaList([*(stopping_criteria or []), stop])
                generation_config = _with_field(generation_config, kwargs, "stop_strings", None)
            custom_generate = functools.partial(
                paper_beam_search,
                paper_sentence_max_new_tokens=sentence_max_new_tokens,
                paper_synced_gpus=bool(synced_gpus),
                paper_beam_search_rules=fields["beam_search_rules"],
            )
        elif sentence_max_new_tokens is not None and custom_generate is None and mode in _ONE_ROW_PER_SEQUENCE:
            # transformers' max_length is the longest sentence's limit: each sentence stops (and ends) at its own
            stop = _SentenceMaxLength(sentence_max_new_tokens, prompt_length)
            stopping_criteria = StoppingCriteriaList([*(stopping_criteria or []), stop])
            if effective_config.forced_eos_token_id is not None:
                forced = _ForcedEOSAtSentenceLimits(
                    effective_config.forced_eos_token_id, sentence_max_new_tokens, prompt_length
                )
                logits_processor = LogitsProcessorList([*(logits_processor or []), forced])
        return super().generate(
            inputs,
            generation_config,
            logits_processor,
            stopping_criteria,
            prefix_allowed_tokens_fn,
            synced_gpus,
            assistant_model,
            streamer,
            negative_prompt_ids,
            negative_prompt_attention_mask,
            custom_generate,
            **kwargs,
        )


# transformers' decoding modes whose rows are the sentences (or their num_return_sequences copies), run to the end
_ONE_ROW_PER_SEQUENCE = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


class _SentenceMaxLength(StoppingCriteria):
    """Each sentence's own maximum length in transformers' greedy search and sampling, whose `max_length` is one for
    the batch (the longest sentence's): a row stops once it has generated its sentence's limit."""

    def __init__(self, limits: torch.Tensor, prompt_length: int):
        self.limits = limits  # (batch,) generated tokens per sentence
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        limits = _row_limits(self.limits, input_ids.shape[0], input_ids.device)
        return limits <= input_ids.shape[-1] - self.prompt_length


class _ForcedEOSAtSentenceLimits(LogitsProcessor):
    """transformers' `ForcedEOSTokenLogitsProcessor` at each sentence's own maximum length (transformers builds it with
    one `max_length` for the batch, the longest sentence's): a row whose next token is its sentence's last may only
    take the forced eos token."""

    def __init__(self, eos_token_id, limits: torch.Tensor, prompt_length: int):
        self.eos_ids = torch.as_tensor(eos_token_id).reshape(-1)
        self.limits = limits  # (batch,) generated tokens per sentence
        self.limit_values = frozenset(limits.tolist())
        self.prompt_length = prompt_length
        self.sentences = None  # each row's sentence, where the beam search sets it (its rows change every step)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[-1] + 1 - self.prompt_length  # |Y| with this step's token
        if generated not in self.limit_values:
            return scores
        if self.sentences is not None:
            limits = self.limits.to(scores.device)[self.sentences]
        else:
            limits = _row_limits(self.limits, scores.shape[0], scores.device)
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.eos_ids.to(scores.device)] = 0
        return torch.where((limits == generated)[:, None], forced, scores)


def _row_limits(limits: torch.Tensor, rows: int, device) -> torch.Tensor:
    """The sentence limits repeated for rows that hold each sentence's returned sequences one after another."""
    return limits.to(device).repeat_interleave(rows // limits.shape[0])


def _check_length_fits_learned_positions(config, generation_config, decoder_input_ids) -> None:
    """A length asked for (`max_new_tokens`, `max_length`) past a learned position table is an error naming it, before
    decoding (the decoder reads every token but the last: `max_length` up to `max_position_embeddings` + 1)."""
    if getattr(config, "position_encoding", None) != "learned":
        return
    prompt_length = decoder_input_ids.shape[-1] if decoder_input_ids is not None else 1
    max_new_tokens, max_length = generation_config.max_new_tokens, generation_config.max_length
    if max_new_tokens is not None:
        asked, name = prompt_length + max_new_tokens, f"max_new_tokens={max_new_tokens}"
    elif max_length is not None:
        asked, name = max_length, f"max_length={max_length}"
    else:
        return
    if asked > config.max_position_embeddings + 1:
        most = config.max_position_embeddings + 1 - prompt_length
        raise ValueError(f"{name} asks for more tokens than the decoder's {config.max_position_embeddings} learned "
                         f"positions allow: at most max_new_tokens={most} (max_length={most + prompt_length}).")


def _length_given(kwargs: dict, generation_config: GenerationConfig | None, model_generation_config) -> bool:
    """Whether `max_length` or `max_new_tokens` is set: passed to `generate`, in the `generation_config` passed to
    it, or in the model's own generation config (None: not asked, because a length rule was passed; transformers
    fills the unset fields of the former from it). In either config,
    a `max_length` equal to transformers' default (20) does not count: Seq2SeqTrainer writes the defaults into the
    model's generation config after its first evaluation step."""
    if kwargs.get("max_length") is not None or kwargs.get("max_new_tokens") is not None:
        return True
    if generation_config is not None and config_sets_a_length(vars(generation_config)):
        return True
    # a length rule passed to `generate` (model_generation_config None) beats the model's saved length
    return model_generation_config is not None and config_sets_a_length(vars(model_generation_config))


TRANSFORMERS_DEFAULT_MAX_LENGTH = GenerationConfig._get_default_generation_params()["max_length"]  # 20


def config_sets_a_length(fields: dict) -> bool:
    """Whether a generation config's fields (`vars(config)`, or its saved JSON) set a length: `max_new_tokens`, or a
    `max_length` other than transformers' default (20), which Seq2SeqTrainer writes into the model's config."""
    return fields.get("max_new_tokens") is not None or fields.get("max_length") not in (
        None, TRANSFORMERS_DEFAULT_MAX_LENGTH)  # fmt: skip


def _with_field(generation_config: GenerationConfig | None, kwargs: dict, name: str, value) -> GenerationConfig | None:
    """Set the generation field `name` for this call: in a copy of the caller's generation config when one was passed
    (transformers deprecates a config together with loose generation fields), else as a keyword argument."""
    if generation_config is not None and name not in kwargs:
        generation_config = copy.deepcopy(generation_config)
        setattr(generation_config, name, value)
    else:
        kwargs[name] = value
    return generation_config


def _default_synced_gpus(model) -> bool:
    """transformers' default: synchronise the loop across processes under DeepSpeed ZeRO-3 or FSDP."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    if torch.distributed.get_world_size() <= 1:
        return False
    from transformers.distributed.fsdp import is_fsdp_managed_module
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


_SUPPORTED_MODEL_KWARGS = {"encoder_outputs", "attention_mask", "decoder_attention_mask", "cache", "use_cache"}
# Seq2SeqTrainer passes the labels, and transformers adds logits_to_keep where a model takes it: the search reads only
# the last position's logits and never the labels (as transformers' own beam search); output_attentions and
# output_hidden_states come again in the generation config; a source given as inputs_embeds is already in
# encoder_outputs (transformers leaves it among the keyword arguments).
_IGNORED_MODEL_KWARGS = ("labels", "logits_to_keep", "output_attentions", "output_hidden_states", "inputs_embeds")
# Logits processors and stopping criteria that look at each row on its own: finished sentences can leave the batch.
# Others (e.g. prefix_allowed_tokens_fn, encoder_repetition_penalty) index rows by sentence: the batch stays whole.
_ROW_INDEPENDENT = {
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoBadWordsLogitsProcessor",
    "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "SequenceBiasLogitsProcessor", "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty",
    "TemperatureLogitsWarper", "MaxTimeCriteria", "StopStringCriteria", "EosTokenCriteria", "MaxLengthCriteria",
    "_ForcedEOSAtSentenceLimits",
}  # fmt: skip


@dataclass
class _Search:
    """What stays fixed during one beam search."""

    rules: str  # "t2t" or "fairseq"
    num_beams: int  # K
    num_return_sequences: int
    alpha: float
    eos_ids: torch.Tensor
    limits: torch.Tensor  # (batch,) maximum number of generated tokens per sentence
    limit_values: frozenset  # the same numbers on the host: the steps at which some sentence reaches its limit
    prompt_length: int
    pad_token_id: int
    width: int  # prompt_length + the largest limit
    extra_criteria: list  # stopping criteria other than eos and max length, applied to the candidates
    keep_history: bool  # beam_indices are returned


@dataclass
class _Alive:
    """The running beams of the active sentences (A of them, rows a * K + k), best first (t2t's alive set)."""

    active: torch.Tensor  # (A,) their numbers in the full batch
    sequences: torch.Tensor  # (A * K, width): `length` tokens, then padding (one shape for the whole search)
    scores: torch.Tensor  # (A, K) log P(Y|X); -inf for a dead beam
    history: torch.Tensor | None  # (A * K, generated) beam_indices: rows of the full batch
    length: int | torch.Tensor  # tokens so far (prompt included); a 0-d tensor in a compiled step's graph


@dataclass
class _Finished:
    """The finished hypotheses of every sentence of the full batch, best first (t2t's finished set)."""

    scores: torch.Tensor  # (batch, K) log P(Y|X) / lp(Y); -inf for an empty place
    sequences: torch.Tensor  # (batch, K, width), right-padded
    history: torch.Tensor  # (batch, K, width - prompt_length) beam_indices, -1 after the end
    lengths: torch.Tensor  # (batch, K) |Y|


@dataclass
class _Candidates:
    """The 2K best continuations of each active sentence, best first (t2t's topk set)."""

    scores: torch.Tensor  # (A, 2K) log P(Y|X)
    tokens: torch.Tensor  # (A, 2K) the new token
    rows: torch.Tensor  # (A, 2K) the running row it continues
    stops: torch.Tensor  # (A, 2K) ends with an eos token or meets a stopping criterion
    generated: int  # |Y| of every candidate


def paper_beam_search(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    paper_sentence_max_new_tokens: torch.Tensor | None = None,
    paper_synced_gpus: bool = False,
    paper_beam_search_rules: str = "t2t",
    **model_kwargs,
):
    """Beam search ranking finished hypotheses by log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha.

    Called by transformers' `generate` (as `custom_generate`) with `input_ids` of shape (batch * K, P), K = num_beams:
    the decoder start token (P = 1) or a decoder prompt, repeated for each beam.

    Definitions (the tests' reference beam searches use the same, written from tensor2tensor's and fairseq's code):

    - |Y| is the number of generated tokens (after the decoder start token and any decoder prompt), the final
      `</s>` included. log P(Y|X) is the sum of the log-probabilities of those tokens, after the logits processors
      (none by default), computed in float32 (float64 for a float64 model). An eos token and any stopping criterion
      end a hypothesis alike.
    - Maximum length per sentence: `paper_sentence_max_new_tokens` (max_len_a * source length + max_len_b), or
      `generation_config.max_length` minus P when the caller gave a length. A hypothesis reaching it is cut there;
      `forced_eos_token_id` forces its eos token as each sentence's last token (transformers' processor would force
      it at the batch's one `max_length`).
    - Each step, per sentence: (1) the 2K best continuations of its K running beams by log P are the candidates;
      (2) some of them join the sentence's finished set, which keeps its K best by penalised score; (3) the K best
      candidates that did not end are the next running beams; (4) the sentence stops or goes on.

    `beam_search_rules="t2t"` (the default; tensor2tensor's `beam_search`, which gave the paper's numbers):

    - (2) any of the 2K candidates that ends joins the finished set (`grow_finished`).
    - (4) a sentence stops at its maximum length, or when (`_is_not_finished`) its best finished score (with
      num_return_sequences=1, t2t's `stop_early`) or its K-th best (with more, t2t's `stop_early=False` as its
      Transformer sets it for several beams) is greater than the best running log P divided by lp(maximum length).
      With alpha >= 0 this is exact: no running beam can do better at any length. t2t checks all sentences of a
      batch together; here each stops on its own, as if decoded alone.
    - At the maximum length the finished hypotheses are returned; the running beams, cut at the limit, are returned
      only where fewer finished (t2t: where none finished), after the finished ones.

    `beam_search_rules="fairseq"` (fairseq's `SequenceGenerator`):

    - (2) only candidates among the top K that end, or reach the maximum length, are finished, and only the first K
      of a sentence are kept (`finalize_hypos`), then ranked by score.
    - (4) a sentence stops as soon as it has K finished hypotheses, or at its maximum length (`is_finished`).
      fairseq forbids `<pad>` and appends a forced `</s>` one step after the limit; here the limit counts every
      generated token and nothing is forbidden.

    t2t's bound is dropped if a logits processor ever makes a log-probability positive (the search then runs to the
    maximum length). `early_stopping` is not consulted.

    Returns what transformers' beam search returns: the best `num_return_sequences` hypotheses per sentence, best
    first, starting with the prompt and right-padded with `pad_token_id` (a LongTensor), or with
    `return_dict_in_generate=True` a `GenerateBeamEncoderDecoderOutput` with `sequences`, `sequences_scores` (the
    penalised score, with `output_scores`), `beam_indices`, and per step, in the layout of transformers' beam search
    (rows: the batch * K running beams of that step): `scores` (the processed log-probabilities), `logits`,
    `decoder_attentions`, `cross_attentions`, `decoder_hidden_states`; and `encoder_attentions`,
    `encoder_hidden_states`. Rows of sentences already finished hold -inf (scores, logits) or 0. With the key/value
    cache, `cache` holds the returned sequences but their last token (one decoder pass over them), so that decoding
    can continue from it. A sentence's beams share one row of its encoder output and cross-attention cache (under
    `SHARED_SOURCE_KERNELS`, with a dynamic cache). Finished sentences leave the batch (their cache rows are
    dropped), unless `synced_gpus`, a sentence-dependent logits processor or a non-dynamic (e.g. static) cache keeps
    the batch whole: they then run along without changing their finished hypotheses, their rows of the per-step
    outputs as if they had left. With a static cache and a compiled step on a CPU, the search's own update goes into
    the step's graph (`_search_compiles`: one graph, the same tokens).
    """
    search, alive, finished, cache, model_kwargs = _start(
        model, input_ids, logits_processor, stopping_criteria, generation_config,
        paper_sentence_max_new_tokens, paper_beam_search_rules, model_kwargs,
    )  # fmt: skip
    K = search.num_beams
    logits_processor, forced_eos = _forced_eos_per_sentence(logits_processor, generation_config, search)
    suppressed = _only_suppressed_tokens(logits_processor)
    device = input_ids.device
    total_rows = input_ids.shape[0]
    use_cache = cache is not None
    encoder_states = model_kwargs["encoder_outputs"].last_hidden_state
    attention_mask = model_kwargs.get("attention_mask")
    rows_can_change = cache is None or _is_dynamic(cache)  # a static cache's size is fixed in advance
    # A sentence's K beams read one copy of its source (and one cross-attention cache row), not K.
    shared_source = rows_can_change and model.config._attn_implementation in SHARED_SOURCE_KERNELS
    if shared_source:
        encoder_states = encoder_states[::K]
        attention_mask = attention_mask[::K] if attention_mask is not None else None
    decoder_prompt_mask = model_kwargs.get("decoder_attention_mask")
    score_dtype = alive.scores.dtype
    # transformers' rule (as in its `_sample`): a compiled forward for static caches on accelerators or when asked.
    compiled = model._valid_auto_compile_criteria({"cache": cache}, generation_config)
    decode_forward = model.get_compiled_call(generation_config.compile_config) if compiled else model.__call__
    drop_finished = not paper_synced_gpus and _rows_independent(logits_processor, stopping_criteria) and rows_can_change
    record = _StepOutputs(generation_config, total_rows)

    bound_valid = True
    done = torch.zeros(input_ids.shape[0] // K, dtype=torch.bool, device=device)
    this_peer_finished = False
    step = 0
    # Where every step after the first runs the same operations on the same shapes, one graph of the decoding step and
    # the search's update replaces the compiled step (`_decode_and_update`).
    step_and_update = compiled and _search_compiles(
        search, logits_processor, suppressed, record, paper_synced_gpus, rows_can_change, decoder_prompt_mask, device
    )
    if step_and_update:
        decode_and_update = _ChecksUntilSteady(*_compiled_decode_and_update(model, generation_config.compile_config),
                                               checked=_has_forward_hooks(model))  # fmt: skip
    while model._has_unfinished_sequences(this_peer_finished, paper_synced_gpus, device=device):
        if step_and_update and step > 0:
            length = alive.length
            alive.length = torch.tensor(length, device=device)
            try:
                sequences, scores, cache_rows = decode_and_update(
                    model, search, alive, finished, done, encoder_states, attention_mask, cache, suppressed
                )
            except _recompile_limit_errors():  # (raised before the graph runs: nothing has changed)
                alive.length = length
                step_and_update = False
                logger.warning_once(_AT_THE_RECOMPILE_LIMIT)
                continue
            step += 1
            alive = _Alive(alive.active, sequences, scores, None, length + 1)
            # Outside the graph: inside it, after the step's own cache writes, torch 2.13's inductor gathered the
            # rows in place, reading rows it had already overwritten (README, "The cause, pinned down").
            _reorder_self_attention(cache, cache_rows, length)
            this_peer_finished = bool(done.all())
            continue
        # The first step reads the whole prompt (not compiled, as transformers' prefill); later ones one token.
        forward = decode_forward if step > 0 else model.__call__
        length = alive.length
        # The last token as its own tensor: a slice's row stride is the sequences' width, and a compiled step would
        # be recompiled for a new stride.
        outputs = forward(
            encoder_outputs=(encoder_states,),
            attention_mask=attention_mask,
            decoder_input_ids=alive.sequences[:, length - 1 : length].contiguous()
            if (use_cache and step > 0)
            else alive.sequences[:, :length],
            decoder_attention_mask=_decoder_mask(decoder_prompt_mask, length),
            cache=cache,
            use_cache=use_cache,
            output_attentions=record.attentions is not None,
            output_hidden_states=record.hidden_states is not None,
            return_dict=True,
        )
        step += 1
        if this_peer_finished:  # synced_gpus: keep the other processes company, repeating the last token
            if length == alive.sequences.shape[-1]:  # (the other processes' sentences may be longer)
                alive.sequences = nn.functional.pad(alive.sequences, (0, 1), value=search.pad_token_id)
            alive.sequences[:, length] = alive.sequences[:, length - 1]
            alive.length = length + 1
            continue
        if step == 1 and suppressed is not None:  # ids outside the vocabulary suppress nothing there
            vocab_size = outputs.logits.shape[-1]
            suppressed = suppressed[(suppressed >= 0) & (suppressed < vocab_size)].to(device)
        # A compiled step's CUDA graphs write their outputs into the same memory at the next step: a copy, as
        # transformers' `_sample` makes (kept when `output_logits`).
        logits = outputs.logits[:, -1, :].to(score_dtype, copy=compiled)
        log_probs = nn.functional.log_softmax(logits, dim=-1)
        # Where the batch stays whole, sentences already done run along: nothing of theirs may change any more.
        running = ~done[alive.active]
        if suppressed is not None:  # the same -inf columns as transformers' processors, without their full copies
            log_probs[:, suppressed] = -math.inf
        elif len(logits_processor) > 0:
            if forced_eos is not None:
                forced_eos.sentences = alive.active.repeat_interleave(K)
            # (contiguous: transformers' repetition penalty returns a view of a wider tensor)
            log_probs = logits_processor(alive.sequences[:, :length], log_probs).contiguous()
            best = log_probs.amax(dim=-1).view(-1, K)[running]  # one pass; the running sentences' rows
            bound_valid = bound_valid and not bool((best > 0).any())
        record.add(outputs, log_probs, logits, alive.active, K, running)
        del outputs

        alive, cache_rows = _search_update(
            search, alive, finished, done, log_probs, running, bound_valid, record.scores
        )

        keep = ~done[alive.active]
        if drop_finished and not bool(keep.all()):
            kept = keep.nonzero()[:, 0]  # the sentences that go on
            kept_rows = (kept[:, None] * K + torch.arange(K, device=device)).reshape(-1)
            alive = _Alive(
                alive.active[keep], alive.sequences[kept_rows], alive.scores[keep],
                alive.history[kept_rows] if alive.history is not None else None, alive.length,
            )  # fmt: skip
            cache_rows = cache_rows[kept_rows]
            source_rows = kept if shared_source else kept_rows
            encoder_states = encoder_states[source_rows]
            attention_mask = attention_mask[source_rows] if attention_mask is not None else None
            decoder_prompt_mask = decoder_prompt_mask[kept_rows] if decoder_prompt_mask is not None else None
            if cache is not None:
                cache.cross_attention_cache.reorder_cache(source_rows)
        if cache is not None:
            _reorder_self_attention(cache, cache_rows, length)
        this_peer_finished = bool(done.all())

    return _outputs(model, search, finished, record, generation_config, model_kwargs, use_cache)


def _search_update(search: _Search, alive: _Alive, finished: _Finished, done, log_probs, running, bound_valid,
                   scores_so_far, branch_free: bool = False):
    """Steps 1-4 from one step's log-probabilities: the finished sets grow in place, `done` marks the sentences that
    stop; returns the next running beams and the rows of the current ones they continue (for the cache)."""
    candidates = _top_candidates(search, alive, log_probs, scores_so_far)
    at_limit = (search.limits[alive.active] <= candidates.generated) & running
    may_finish = _may_finish(search, finished, alive, candidates, at_limit) & running[:, None]
    _grow_finished(search, finished, alive, candidates, may_finish, branch_free)
    alive, cache_rows = _grow_alive(search, alive, candidates)
    if search.rules == "t2t" and (branch_free or candidates.generated in search.limit_values):
        _fill_with_alive_at_limit(search, finished, alive, at_limit, candidates.generated)
    done[alive.active] |= _sentences_done(search, finished, alive, at_limit, bound_valid)
    return alive, cache_rows


def _decode_and_update(model, search: _Search, alive: _Alive, finished: _Finished, done, encoder_states,
                       attention_mask, cache, suppressed):
    """One decoding step of the running beams' last tokens and the search's update after it (`_search_update`,
    branch-free), as one compiled graph (`_search_compiles`): `alive.length` is a tensor, so every step runs the same
    operations on the same shapes. Returns the next running beams' sequences and scores, and the cache rows."""
    rows = alive.sequences.shape[0]
    outputs = model(
        encoder_outputs=(encoder_states,),
        attention_mask=attention_mask,
        decoder_input_ids=alive.sequences.gather(1, (alive.length - 1).expand(rows, 1)),
        cache=cache,
        use_cache=True,
        return_dict=True,
    )
    log_probs = nn.functional.log_softmax(outputs.logits[:, -1, :].to(alive.scores.dtype), dim=-1)
    if suppressed is not None:
        log_probs = log_probs.index_fill(1, suppressed, -math.inf)
    running = ~done[alive.active]
    alive, cache_rows = _search_update(search, alive, finished, done, log_probs, running, True, None, True)
    return alive.sequences, alive.scores, cache_rows


def _search_compiles(search: _Search, logits_processor, suppressed, record, synced_gpus: bool, rows_can_change,
                     decoder_prompt_mask, device) -> bool:
    """Whether a compiled decoding step takes the search's update into its graph (`_decode_and_update`): on a CPU
    (GPUs: not measured yet), the batch whole (a static cache), no logits processor but `suppress_tokens`, no
    stopping criterion but eos and the length, no per-step outputs or beam_indices to record, no decoder prompt
    mask, no synced_gpus."""
    return (
        device.type == "cpu"
        and _SEARCH_COMPILES
        and not rows_can_change
        and (suppressed is not None or len(logits_processor) == 0)
        and not search.extra_criteria
        and not search.keep_history
        and record.empty
        and decoder_prompt_mask is None
        and not synced_gpus
    )


_AT_THE_RECOMPILE_LIMIT = (
    "The decoding step compiled with the beam search's update has reached torch._dynamo.config.recompile_limit (one "
    "function for every model and search setting): the compiled step runs alone, the search outside its graph."
)


def _recompile_limit_errors() -> tuple[type[Exception], ...]:
    """torch's error at a function's recompile limit under fullgraph=True (its name in torch 2.13; none if absent)."""
    error = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)
    return (error,) if error is not None else ()


class _ChecksUntilSteady:
    """A search's calls of the compiled `_decode_and_update`, with dynamo's guard check (~0.3-0.8 ms a step at batch 1
    on a CPU, a tenth of the step) until it is redundant. Each call looks up the graph whose guards its arguments pass
    (`_graph_passing`; none: through dynamo, which compiles one). Once two calls in a row passed the same graph, the
    later calls run it unchecked: their arguments are the same objects, mutated in place, and the tensors that graph
    returned from arguments that passed its guards, so of the kind that passed them (the branch-free steps change no
    Python state that dynamo guards: one graph for every step). Per search, so thread-safe, unlike
    `torch.compiler.set_stance(skip_guard_eval_unsafe=True)`, which is global to the process. A model with forward
    hooks is `checked` at every call: a hook's Python state may change what a guard decides from one step to the next
    (a float counter passed two steps of dynamo's "eager" backend, then its graph ran a branch the hook had left)."""

    def __init__(self, compiled, backend, checked: bool = False):
        self.compiled = compiled
        self.backend = backend  # only its graphs (`_dynamo_backend`): another compile config's are not this one's
        self.graph = None  # the graph the last call passed
        self.steady = False
        self.checked = checked

    def __call__(self, *args):
        if self.steady:
            return self.graph(*args)
        graph = _graph_passing(args, self.backend) if self.backend is not None else None
        self.steady = not self.checked and graph is not None and self.graph is not None and \
            graph.__code__ is self.graph.__code__  # fmt: skip
        self.graph = graph
        return graph(*args) if graph is not None else self.compiled(*args)


def _has_forward_hooks(model: torch.nn.Module) -> bool:
    """Whether a forward hook (or pre-hook) of any of the model's modules, or a global one, runs in its forward."""
    hooks = torch.nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


_DECODE_AND_UPDATE_SIGNATURE = inspect.signature(_decode_and_update)


def _dynamo_backend(compiled) -> object | None:
    """The backend dynamo matches its cache entries against when `compiled` (`torch.compile` of a function) is called:
    its callback's innermost `_torchdynamo_orig_backend`, as dynamo's own lookup finds it; None where this torch's
    compiled functions hold it otherwise."""
    try:
        cells = dict(zip(compiled.__code__.co_freevars, (cell.cell_contents for cell in compiled.__closure__ or ())))
        backend = cells["self"].callback
    except (AttributeError, KeyError, ValueError):
        return None
    while hasattr(backend, "_torchdynamo_orig_backend"):
        backend = backend._torchdynamo_orig_backend
    return backend


def _graph_passing(args, backend):
    """The code torch.compile holds for `_decode_and_update`, compiled by `backend` (`_dynamo_backend`), whose guards
    `args` pass, as a function that runs it without checking them again (dynamo's own cache lookup, as its
    "fail_on_recompile" stance reads it); None where no graph passes, where dynamo is disabled or a compiler stance
    other than the default is set, or where this torch keeps its cache otherwise."""
    cache_entries = getattr(torch._C._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
    stance = getattr(getattr(torch._dynamo.eval_frame, "_stance", None), "stance", None)
    if cache_entries is None or stance != "default" or torch._dynamo.config.disable:
        return None
    arguments = _DECODE_AND_UPDATE_SIGNATURE.bind(*args).arguments
    original = _decode_and_update.__code__
    try:
        for entry in cache_entries(original):
            code = entry.code
            if code.co_freevars or code.co_varnames[: code.co_argcount] != original.co_varnames[: original.co_argcount]:
                return None  # (not the frame's own code with the same arguments, as torch 2.13 makes it)
            same_backend = entry.backend is backend or (
                type(entry.backend) is type(backend) and entry.backend == backend
            )  # dynamo's own test (two torch.compile calls with the same options share graphs)
            if same_backend and entry.guard_manager.check(arguments):
                return types.FunctionType(code, _decode_and_update.__globals__)
    except (AttributeError, TypeError):  # another torch's cache entries
        return None
    return None


# What `generate` keeps on a model between calls: torch.compile's wrappers, which pickling leaves out.
COMPILED_CALLS = ("_compiled_call", "_compiled_decode_and_update")


def _compiled_decode_and_update(model, compile_config):
    """(`_decode_and_update` compiled with the `compile_config` transformers compiles the decoding step with, the
    backend dynamo matches its graphs against: `_dynamo_backend`), kept on the model as transformers keeps its
    compiled step (a new compiled callable would compile anew)."""
    options = compile_config.to_dict() if compile_config is not None else model._default_compile_config().to_dict()
    key = tuple(sorted((name, repr(value)) for name, value in options.items()))
    kept = model.__dict__.get("_compiled_decode_and_update")
    if kept is None or kept[0] != key:
        compiled = torch.compile(_decode_and_update, **options)
        kept = model.__dict__["_compiled_decode_and_update"] = (key, compiled, _dynamo_backend(compiled))
    return kept[1:]


def _start(model, input_ids, logits_processor, stopping_criteria, generation_config, sentence_limits, rules, kwargs):
    """Checks the arguments; the fixed settings, the first running beams, an empty finished set and the cache."""
    for name in _IGNORED_MODEL_KWARGS:
        kwargs.pop(name, None)
    unsupported = set(kwargs) - _SUPPORTED_MODEL_KWARGS
    if unsupported:
        raise ValueError(
            f"The paper's beam search does not support {sorted(unsupported)}; pass length_penalty_type='transformers' "
            "to use transformers' beam search."
        )
    if not model.config.is_encoder_decoder:
        raise ValueError("paper_beam_search is for encoder-decoder models.")
    if rules not in BEAM_SEARCH_RULES:
        raise ValueError(f"`beam_search_rules` must be one of {BEAM_SEARCH_RULES}, got {rules!r}.")
    K = generation_config.num_beams
    device = input_ids.device
    total_rows, prompt_length = input_ids.shape
    batch_size = total_rows // K
    if sentence_limits is not None:
        limits = sentence_limits.to(device).long()
    else:
        limits = torch.full((batch_size,), generation_config.max_length - prompt_length, device=device)
    limit_values = frozenset(limits.tolist())
    if min(limit_values) < 1:
        raise ValueError(f"max_length ({generation_config.max_length}) leaves no token to generate.")
    eos_ids = generation_config._eos_token_tensor
    pad_token_id = generation_config._pad_token_tensor
    pad_token_id = int(pad_token_id) if pad_token_id is not None else 0
    return_dict = generation_config.return_dict_in_generate
    search = _Search(
        rules=rules,
        num_beams=K,
        num_return_sequences=generation_config.num_return_sequences or 1,
        alpha=generation_config.length_penalty,
        eos_ids=eos_ids.reshape(-1).to(device) if eos_ids is not None else input_ids.new_empty(0),
        limits=limits,
        limit_values=limit_values,
        prompt_length=prompt_length,
        pad_token_id=pad_token_id,
        width=prompt_length + max(limit_values),
        extra_criteria=[c for c in stopping_criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria))],
        keep_history=bool(return_dict),
    )
    # Float32 (or the model's float64): the first beam of each sentence starts at 0, the copies at -inf.
    encoder_states = kwargs["encoder_outputs"].last_hidden_state
    score_dtype = torch.float64 if encoder_states.dtype == torch.float64 else torch.float32
    scores = torch.full((batch_size, K), -math.inf, dtype=score_dtype, device=device)
    scores[:, 0] = 0.0
    sequences = input_ids.new_full((total_rows, search.width), pad_token_id)
    sequences[:, :prompt_length] = input_ids
    alive = _Alive(
        torch.arange(batch_size, device=device), sequences, scores,
        input_ids.new_empty(total_rows, 0) if search.keep_history else None, prompt_length,
    )  # fmt: skip
    finished = _Finished(
        scores=torch.full((batch_size, K), -math.inf, dtype=score_dtype, device=device),
        sequences=input_ids.new_full((batch_size, K, search.width), pad_token_id),
        history=input_ids.new_full((batch_size, K, search.width - prompt_length), -1),
        lengths=input_ids.new_zeros(batch_size, K),
    )
    cache = kwargs.get("cache") if kwargs.get("use_cache", True) else None
    return search, alive, finished, cache, kwargs


def _forced_eos_per_sentence(logits_processor, generation_config, search: _Search):
    """The logits processors with the batch-wide forced eos (built from `max_length`) forced at each sentence's
    limit instead, in its place; and that processor (None if there is none)."""
    processors, forced_eos = LogitsProcessorList(), None
    for processor in logits_processor:
        batch_wide = isinstance(processor, ForcedEOSTokenLogitsProcessor)
        if batch_wide and processor.max_length == generation_config.max_length:
            processor = _ForcedEOSAtSentenceLimits(processor.eos_token_id, search.limits, search.prompt_length)
            forced_eos = processor
        processors.append(processor)
    return processors, forced_eos


def _only_suppressed_tokens(logits_processor) -> torch.Tensor | None:
    """The token ids suppressed where transformers' `SuppressTokensLogitsProcessor`s are the only logits processors
    (`suppress_tokens`), else None. transformers' processor makes a vocabulary-sized mask and a copy of the scores
    every step; the search writes -inf into those columns in place (the same scores, ~1 ms less a step at 64 x
    32,000)."""
    if len(logits_processor) == 0 or any(type(p) is not SuppressTokensLogitsProcessor for p in logits_processor):
        return None
    return torch.cat([p.suppress_tokens.reshape(-1) for p in logits_processor])


def _rows_independent(logits_processor, stopping_criteria) -> bool:
    """Whether every logits processor and stopping criterion treats each row on its own."""
    return all(type(item).__name__ in _ROW_INDEPENDENT for item in [*logits_processor, *stopping_criteria])


def _reorder_self_attention(cache, rows: torch.Tensor, length: int) -> None:
    """The self-attention cache's rows in the order of the new beams; a static cache's tensors stay where they are,
    and only their first `length` positions, those written so far, move (at batch 16, copying all of them took 2.2 ms
    a step on a 2-core VM).

    transformers' `reorder_cache` puts new tensors in a static layer's place: a compiled step's CUDA graphs (its
    "reduce-overhead" mode on a GPU) replay on the static addresses, and skip the graphs where they change.
    """
    self_attention = cache.self_attention_cache
    if isinstance(self_attention, DynamicCache):
        self_attention.reorder_cache(rows)
        return
    for layer in self_attention.layers:
        if getattr(layer, "is_compileable", False) and layer.is_initialized:
            keys, values = layer.keys[:, :, :length], layer.values[:, :, :length]
            keys.copy_(keys.index_select(0, rows))
            values.copy_(values.index_select(0, rows))
        else:
            layer.reorder_cache(rows)


def _is_dynamic(cache) -> bool:
    """An encoder-decoder cache of two dynamic caches, whose rows can be dropped."""
    return (
        isinstance(cache, EncoderDecoderCache)
        and isinstance(cache.self_attention_cache, DynamicCache)
        and isinstance(cache.cross_attention_cache, DynamicCache)
    )


def _decoder_mask(prompt_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """The decoder attention mask over `length` tokens: the prompt's mask, then ones for the generated tokens."""
    if prompt_mask is None:
        return None
    return nn.functional.pad(prompt_mask, (0, length - prompt_mask.shape[-1]), value=1)


def top_k(x: torch.Tensor, k: int, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """`x.topk(k, dim=-1)` of a 2-D `x` (the same values, best first; among equal values possibly other indices). On
    a CPU, for long rows, from the k blocks of `block` entries with the largest maxima (and the tail that fills no
    block): every value of the top k lies in one of them, since fewer than k blocks have a maximum above the k-th
    value. torch's CPU `topk` compares each entry in turn (4.5-5 ms for 64 rows of 4 x 8,000 candidates, one thread);
    a vectorised `amax` over the blocks and two small `topk`s take about a tenth of that."""
    rows, n = x.shape
    if x.device.type != "cpu" or n < 8 * k * block:
        return x.topk(k, dim=-1)
    full = n - n % block
    best_blocks = x[:, :full].unflatten(1, (-1, block)).amax(-1).topk(k, dim=-1).indices
    columns = (best_blocks[:, :, None] * block + torch.arange(block, device=x.device)).view(rows, k * block)
    if full < n:
        columns = torch.cat([columns, torch.arange(full, n, device=x.device).expand(rows, -1)], dim=1)
    values, picked = x.gather(1, columns).topk(k, dim=-1)
    return values, columns.gather(1, picked)


def _top_candidates(search: _Search, alive: _Alive, log_probs: torch.Tensor, scores_so_far) -> _Candidates:
    """Step 1 (t2t `grow_topk`): the 2K best continuations of each sentence's running beams by log P(Y|X)."""
    K = search.num_beams
    num_active, vocab_size = alive.scores.shape[0], log_probs.shape[-1]
    # In place: the step's log-probabilities are not read again (recorded scores are copies).
    totals = log_probs.view(num_active, K, vocab_size).add_(alive.scores[:, :, None]).view(num_active, K * vocab_size)
    scores, indices = top_k(totals, 2 * K)
    rows = torch.arange(num_active, device=scores.device)[:, None] * K + torch.div(
        indices, vocab_size, rounding_mode="floor"
    )
    tokens = indices % vocab_size
    stops = torch.isin(tokens, search.eos_ids)
    generated = alive.length + 1 - search.prompt_length
    if search.extra_criteria:
        sequences, _ = _grown(search, alive, rows, tokens)
        sequences = sequences[:, : alive.length + 1]
        for criterion in search.extra_criteria:
            stops |= criterion(sequences, scores_so_far).view(num_active, 2 * K).to(stops.device)
    return _Candidates(scores, tokens, rows, stops, generated)


def _grown(search: _Search, alive: _Alive, rows: torch.Tensor, tokens: torch.Tensor):
    """Sequences (and beam_indices) of the running `rows` extended by `tokens`, flattened: (n * m, width) with
    `length + 1` tokens (and (n * m, generated + 1))."""
    rows, tokens = rows.reshape(-1), tokens.reshape(-1, 1)
    sequences = alive.sequences[rows]
    if isinstance(alive.length, torch.Tensor):  # in a compiled step's graph: one graph for every step
        sequences.scatter_(1, alive.length.expand(rows.shape[0], 1), tokens)
    else:
        sequences[:, alive.length] = tokens[:, 0]
    if alive.history is None:
        return sequences, None
    K = search.num_beams
    origins = alive.active[torch.div(rows, K, rounding_mode="floor")] * K + rows % K
    return sequences, torch.cat([alive.history[rows], origins[:, None]], dim=-1)


def _may_finish(search: _Search, finished: _Finished, alive: _Alive, candidates: _Candidates, at_limit):
    """Step 2a: t2t, any candidate that ends; fairseq, those of the top K that end or reach the limit, K at most."""
    may_finish = candidates.stops & ~torch.isneginf(candidates.scores)
    if search.rules == "t2t":
        return may_finish
    K = search.num_beams
    may_finish = (candidates.stops | at_limit[:, None]) & ~torch.isneginf(candidates.scores)
    may_finish[:, K:] = False
    taken = (~torch.isneginf(finished.scores[alive.active])).sum(-1, keepdim=True)
    return may_finish & (taken + may_finish.cumsum(-1) <= K)  # first come, first kept (fairseq's finalize_hypos)


def _grow_finished(
    search: _Search, finished: _Finished, alive: _Alive, candidates: _Candidates, may_finish, branch_free: bool
):
    """Step 2b (t2t `grow_finished`): each sentence keeps the K best of its finished and newly finished hypotheses.
    Only the sentences with a hypothesis to add, unless `branch_free` (the same operations every step: all)."""
    if branch_free:
        merging = torch.arange(may_finish.shape[0], device=may_finish.device)
    else:
        merging = may_finish.any(-1).nonzero().squeeze(-1)
        if merging.numel() == 0:
            return
    K, count = search.num_beams, merging.shape[0]
    sentences = alive.active[merging]
    penalised = candidates.scores[merging] / gnmt_length_penalty(candidates.generated, search.alpha)
    penalised = penalised.masked_fill(~may_finish[merging], -math.inf)
    kept = finished.scores[sentences]
    best_scores, best = torch.cat([kept, penalised], dim=-1).topk(K, dim=-1)
    if branch_free:  # a sentence with nothing to add keeps its places as they are (t2t's fill leaves them unsorted)
        adds = may_finish[merging].any(-1, keepdim=True)
        best = torch.where(adds, best, torch.arange(K, device=best.device))
        best_scores = torch.where(adds, best_scores, kept)
    sequences, history = _grown(search, alive, candidates.rows[merging], candidates.tokens[merging])
    lengths = _filled(finished.lengths, (count, 2 * K), candidates.generated)
    _take(finished, sentences, best, best_scores, sequences.view(count, 2 * K, -1), history, lengths, search)


def _filled(like: torch.Tensor, shape: tuple, value: int | torch.Tensor) -> torch.Tensor:
    """A tensor of `shape` holding `value` (a number, or a 0-d tensor in a compiled step), of `like`'s kind."""
    if isinstance(value, torch.Tensor):
        return value.to(like.dtype).expand(shape)
    return like.new_full(shape, value)


def _take(finished: _Finished, sentences, best, best_scores, sequences, history, lengths, search: _Search):
    """Finished places of `sentences` := entries `best` of [their finished hypotheses, the given new ones]."""
    count, new = sequences.shape[:2]
    width = search.width
    merged = torch.cat([finished.sequences[sentences], sequences], dim=1)
    finished.sequences[sentences] = merged.gather(1, best[:, :, None].expand(-1, -1, width))
    if history is not None:
        history = history.view(count, new, -1)
        history = nn.functional.pad(history, (0, width - search.prompt_length - history.shape[-1]), value=-1)
        merged = torch.cat([finished.history[sentences], history], dim=1)
        finished.history[sentences] = merged.gather(1, best[:, :, None].expand(-1, -1, history.shape[-1]))
    finished.lengths[sentences] = torch.cat([finished.lengths[sentences], lengths], dim=1).gather(1, best)
    finished.scores[sentences] = best_scores


def _grow_alive(search: _Search, alive: _Alive, candidates: _Candidates):
    """Step 3 (t2t `grow_alive`): the K best candidates that did not end run on, best first (dead ones at -inf)."""
    rank = torch.arange(2 * search.num_beams, device=candidates.scores.device)
    picks = torch.where(candidates.stops, rank + rank.numel(), rank).topk(search.num_beams, largest=False).indices
    scores = candidates.scores.gather(1, picks).masked_fill(candidates.stops.gather(1, picks), -math.inf)
    rows = candidates.rows.gather(1, picks)
    sequences, history = _grown(search, alive, rows, candidates.tokens.gather(1, picks))
    return _Alive(alive.active, sequences, scores, history, alive.length + 1), rows.reshape(-1)


def _fill_with_alive_at_limit(search: _Search, finished: _Finished, alive: _Alive, at_limit, generated: int):
    """Step 3b (t2t, at the maximum length): running beams, cut there, take the finished places left empty."""
    K, count = search.num_beams, alive.active.shape[0]
    kept = finished.scores[alive.active]
    taken = (~torch.isneginf(kept)).sum(-1, keepdim=True)
    place = torch.arange(K, device=taken.device)
    # Place j of a sentence at its limit takes running beam j - taken (entry K + j - taken) if no finished one has it;
    # every other place keeps what it has (all active sentences at once: no host sync).
    best = torch.where((place >= taken) & at_limit[:, None], K + place - taken, place)
    new_scores = alive.scores / gnmt_length_penalty(generated, search.alpha)
    best_scores = torch.cat([kept, new_scores], dim=1).gather(1, best)
    lengths = _filled(finished.lengths, (count, K), generated)
    sequences = alive.sequences.view(count, K, -1)
    _take(finished, alive.active, best, best_scores, sequences, alive.history, lengths, search)


def _sentences_done(search: _Search, finished: _Finished, alive: _Alive, at_limit, bound_valid: bool):
    """Step 4: which active sentences stop (the rules are in `paper_beam_search`'s docstring)."""
    best_alive = alive.scores[:, 0]
    done = at_limit | torch.isneginf(best_alive)
    kept = finished.scores[alive.active]
    if search.rules == "fairseq":
        return done | ~torch.isneginf(kept[:, -1])
    if bound_valid:  # t2t `_is_not_finished`
        reference = kept[:, 0] if search.num_return_sequences == 1 else kept[:, -1]
        bound = best_alive / gnmt_length_penalty(search.limits[alive.active].to(best_alive.dtype), search.alpha)
        done |= reference > bound
    return done


class _StepOutputs:
    """Per-step outputs in transformers' beam search layout: one row per running beam of the full batch."""

    def __init__(self, generation_config: GenerationConfig, total_rows: int):
        wanted = generation_config.return_dict_in_generate
        self.total_rows = total_rows
        self.scores = () if wanted and generation_config.output_scores else None
        self.logits = () if wanted and generation_config.output_logits else None
        self.attentions = ((), ()) if wanted and generation_config.output_attentions else None
        self.hidden_states = () if wanted and generation_config.output_hidden_states else None

    @property
    def empty(self) -> bool:
        """Nothing is recorded."""
        return self.scores is None and self.logits is None and self.attentions is None and self.hidden_states is None

    def add(self, outputs, log_probs, logits, active: torch.Tensor, num_beams: int, running: torch.Tensor):
        """Records one step's outputs of the running sentences' rows (other rows: -inf scores and logits, else 0)."""
        if self.empty:
            return
        rows = (active[:, None] * num_beams + torch.arange(num_beams, device=active.device)).view(-1)
        done_rows = ~running.repeat_interleave(num_beams)

        def place(values, fill):
            return _scatter_rows(values, rows, done_rows, self.total_rows, fill)

        if self.scores is not None:
            self.scores += (place(log_probs, -math.inf),)
        if self.logits is not None:
            self.logits += (place(logits, -math.inf),)
        if self.attentions is not None:
            decoder, cross = self.attentions
            self.attentions = (
                decoder + (tuple(place(a, 0.0) for a in outputs.decoder_attentions),),
                cross + (tuple(place(a, 0.0) for a in outputs.cross_attentions),),
            )
        if self.hidden_states is not None:
            self.hidden_states += (tuple(place(h, 0.0) for h in outputs.decoder_hidden_states),)


def _scatter_rows(values: torch.Tensor, rows: torch.Tensor, done_rows: torch.Tensor, total_rows: int, fill: float):
    """Rows of the active sentences placed in a tensor of `total_rows` rows; other rows and `done_rows` hold `fill`."""
    values = values.masked_fill(done_rows.view(-1, *[1] * (values.dim() - 1)), fill)
    if values.shape[0] == total_rows:
        return values
    full = values.new_full((total_rows, *values.shape[1:]), fill)
    full[rows] = values
    return full


def _outputs(model, search: _Search, finished: _Finished, record: _StepOutputs, generation_config, kwargs, use_cache):
    """The best num_return_sequences hypotheses per sentence, best first, cropped to the longest; or the output dict."""
    n = search.num_return_sequences
    batch_size = finished.scores.shape[0]
    output_length = int(finished.lengths[:, :n].max())
    sequences = finished.sequences[:, :n, : search.prompt_length + output_length].reshape(batch_size * n, -1)
    if not generation_config.return_dict_in_generate:
        return sequences
    encoder_outputs = kwargs["encoder_outputs"]
    decoder_attentions, cross_attentions = record.attentions if record.attentions is not None else (None, None)
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=finished.scores[:, :n].reshape(-1) if generation_config.output_scores else None,
        scores=record.scores,
        logits=record.logits,
        beam_indices=finished.history[:, :n, :output_length].reshape(batch_size * n, -1),
        encoder_attentions=encoder_outputs.get("attentions") if generation_config.output_attentions else None,
        encoder_hidden_states=encoder_outputs.get("hidden_states") if generation_config.output_hidden_states else None,
        decoder_attentions=decoder_attentions,
        cross_attentions=cross_attentions,
        decoder_hidden_states=record.hidden_states,
        cache=_cache_of(model, search, sequences, kwargs) if use_cache else None,
    )


def _cache_of(model, search: _Search, sequences: torch.Tensor, kwargs: dict):
    """A fresh key/value cache of the returned sequences but their last token: one decoder pass over them."""
    K, n = search.num_beams, search.num_return_sequences
    # Row b * K of the expanded inputs is sentence b's; each returned sequence takes its sentence's row.
    rows = torch.arange(sequences.shape[0] // n, device=sequences.device).repeat_interleave(n) * K
    attention_mask = kwargs.get("attention_mask")
    outputs = model(
        encoder_outputs=(kwargs["encoder_outputs"].last_hidden_state[rows],),
        attention_mask=attention_mask[rows] if attention_mask is not None else None,
        decoder_input_ids=sequences[:, :-1],
        decoder_attention_mask=_decoder_mask(
            kwargs["decoder_attention_mask"][rows] if kwargs.get("decoder_attention_mask") is not None else None,
            sequences.shape[-1] - 1,
        ),
        use_cache=True,
        return_dict=True,
    )
    return outputs.cache
