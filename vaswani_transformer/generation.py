"""Decoding as the paper did it (Section 6.1): beam search with the GNMT length penalty.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 [Wu et al., 2016] ... We set the maximum
output length during inference to input length + 50, but terminate early when possible."

`model.generate(**inputs)` does exactly that by default (and so do `Seq2SeqTrainer(predict_with_generate=True)` and
models loaded with `trust_remote_code=True`), through three extension points of transformers:

- `VaswaniGenerationConfig.from_model_config` gives every new model the paper's generation config (saved as
  `generation_config.json`): `num_beams=4`, `length_penalty=0.6`, `early_stopping=True` and three custom fields that
  `GenerationConfig` keeps and saves, `length_penalty_type="gnmt"`, `max_len_a=1`, `max_len_b=50`.
- `VaswaniGenerationMixin.generate` resolves those fields, turns the length rule into transformers' `max_length` and,
  for deterministic beam search with `length_penalty_type="gnmt"`, hands `paper_beam_search` to transformers'
  `generate` as its `custom_generate` callable: transformers prepares the inputs (encoder run once, inputs expanded
  per beam, cache, logits processors, stopping criteria), `paper_beam_search` runs the decoding loop.
- Everything else (`length_penalty_type="transformers"`, greedy, sampling, constrained or assisted decoding) is
  transformers' own `generate`, unchanged.

This file is copied next to the weights for `trust_remote_code` users: it imports only torch and transformers.
"""

import functools
import math

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput


# transformers 5.24 renamed the key/value cache, as a model argument and as an output field, from `past_key_values` to
# `cache`. This package runs under both: CACHE_NAME is the installed version's name, and our models take either.
CACHE_NAME = "cache" if "cache" in GenerateBeamEncoderDecoderOutput.__dataclass_fields__ else "past_key_values"


def either_cache(cache, past_key_values):
    """The key/value cache given as `cache` (transformers >= 5.24) or as `past_key_values` (earlier), or None."""
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the key/value cache once, as `cache` or as `past_key_values`, not both.")
    return past_key_values if cache is None else cache


# The paper's decoding (Section 6.1). The names of the custom fields are those of the CLI (--beam --alpha
# --max-len-a --max-len-b) and of fairseq's `max_len_a * source length + max_len_b` rule.
PAPER_GENERATION_DEFAULTS = {
    "num_beams": 4,
    "length_penalty": 0.6,
    "early_stopping": True,
    "length_penalty_type": "gnmt",
    "max_len_a": 1,
    "max_len_b": 50,
}
LENGTH_PENALTY_TYPES = ("gnmt", "transformers")
_CUSTOM_FIELDS = ("length_penalty_type", "max_len_a", "max_len_b")
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
    - `max_len_a`, `max_len_b` (numbers or None): each sentence generates at most
      `int(max_len_a * source_length + max_len_b)` tokens, source_length being its number of non-padding tokens
      (its `</s>` included). Used unless `max_length` or `max_new_tokens` is passed to `generate` (or set in a
      `generation_config` passed to it); set `max_len_b=None` to fall back to the config's own `max_length`.
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


def _source_lengths(inputs, kwargs: dict, pad_token_id) -> torch.Tensor:
    """Number of real (non-padding) source tokens per sentence, from the attention mask or else the ids."""
    attention_mask = kwargs.get("attention_mask")
    if attention_mask is not None:
        return attention_mask.sum(-1)
    input_ids = inputs if inputs is not None else kwargs.get("input_ids")
    if input_ids is not None:
        if pad_token_id is None:
            return torch.full(input_ids.shape[:1], input_ids.shape[-1], device=input_ids.device)
        return (input_ids != pad_token_id).sum(-1)
    for name in ("inputs_embeds", "encoder_outputs"):
        states = kwargs.get(name)
        if states is not None:
            states = states if torch.is_tensor(states) else states[0]
            return torch.full(states.shape[:1], states.shape[1], device=states.device)
    raise ValueError(
        "generate() needs `input_ids` (or `inputs_embeds`, `encoder_outputs`, `attention_mask`) to apply the length "
        "rule max_len_a * source length + max_len_b; pass them, or pass `max_length`/`max_new_tokens`."
    )


def _check_custom_fields(length_penalty_type, max_len_a, max_len_b):
    if length_penalty_type not in LENGTH_PENALTY_TYPES:
        raise ValueError(
            f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {length_penalty_type!r}."
        )
    for name, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"`{name}` must be a non-negative number or None, got {value!r}.")


class VaswaniGenerationMixin(GenerationMixin):
    """`generate` whose default is the paper's beam search (see the module docstring and `paper_beam_search`)."""

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
        `length_penalty_type` ("gnmt", the default, or "transformers"), `max_len_a` and `max_len_b` (see
        `VaswaniGenerationConfig`). Deterministic beam search (`num_beams > 1`, no sampling, constraints, beam
        groups or assistant) with `length_penalty_type="gnmt"` runs `paper_beam_search`; anything else is
        transformers' own `generate`. The length rule applies in both cases (in transformers' own decoding as one
        `max_length` for the batch: the longest sentence's limit).
        """
        fields = {
            name: _resolve_custom_field(name, kwargs, generation_config, self.generation_config)
            for name in _CUSTOM_FIELDS
        }
        _check_custom_fields(**fields)
        length_given = kwargs.get("max_length") is not None or kwargs.get("max_new_tokens") is not None
        if generation_config is not None:
            length_given |= generation_config.max_length is not None or generation_config.max_new_tokens is not None

        sentence_max_new_tokens = None
        if not length_given and fields["max_len_b"] is not None:
            lengths = _source_lengths(inputs, kwargs, self.config.pad_token_id)
            sentence_max_new_tokens = (lengths * (fields["max_len_a"] or 0) + fields["max_len_b"]).long()
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
                sentence_max_new_tokens = sentence_max_new_tokens.clamp(max=max(room, 1))
            kwargs["max_length"] = prompt_length + int(sentence_max_new_tokens.max())

        effective_config, _ = self._prepare_generation_config(generation_config, **kwargs)
        if (
            fields["length_penalty_type"] == "gnmt"
            and custom_generate is None
            and effective_config.get_generation_mode(assistant_model) == GenerationMode.BEAM_SEARCH
        ):
            if streamer is not None:  # as transformers' beam search
                raise ValueError("`streamer` cannot be used with beam search: set `num_beams=1`.")
            if synced_gpus is None:
                synced_gpus = _default_synced_gpus(self)
            custom_generate = functools.partial(
                paper_beam_search,
                paper_sentence_max_new_tokens=sentence_max_new_tokens,
                paper_synced_gpus=bool(synced_gpus),
            )
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


def _default_synced_gpus(model) -> bool:
    """transformers' default: synchronise the loop across processes under DeepSpeed ZeRO-3 or FSDP."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    if torch.distributed.get_world_size() <= 1:
        return False
    from transformers.distributed.fsdp import is_fsdp_managed_module
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


_SUPPORTED_MODEL_KWARGS = {"encoder_outputs", "attention_mask", CACHE_NAME, "use_cache"}
# Logits processors and stopping criteria that look at each row on its own: finished sentences can leave the batch.
# Others (e.g. prefix_allowed_tokens_fn, encoder_repetition_penalty) index rows by sentence: the batch stays whole.
_ROW_INDEPENDENT = {
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "NoBadWordsLogitsProcessor",
    "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "SequenceBiasLogitsProcessor", "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty",
    "TemperatureLogitsWarper", "MaxTimeCriteria", "StopStringCriteria", "EosTokenCriteria", "MaxLengthCriteria",
}  # fmt: skip


def paper_beam_search(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    paper_sentence_max_new_tokens: torch.Tensor | None = None,
    paper_synced_gpus: bool = False,
    **model_kwargs,
):
    """Beam search ranking finished hypotheses by log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha.

    Called by transformers' `generate` (as `custom_generate`) with `input_ids` of shape (batch * num_beams, P):
    the decoder start token (P = 1) or a decoder prompt, repeated for each beam.

    Definitions (the test's reference beam search uses the same):

    - |Y| is the number of generated tokens (after the decoder start token and any decoder prompt), the final
      `</s>` included. log P(Y|X) is the sum of the log-probabilities of those tokens, after the logits processors
      (none by default), computed in float32 (float64 for a float64 model).
    - Each step, for each sentence, the 2 * num_beams best continuations of its running beams (by log P) are taken,
      best first. Those among the first num_beams that end with an eos token, hit a stopping criterion, or reach the
      sentence's maximum length become finished hypotheses (scored with the penalty); the best num_beams of the
      others are the running beams of the next step. A sentence keeps its num_beams best finished hypotheses.
    - Maximum length per sentence: `paper_sentence_max_new_tokens` (max_len_a * source length + max_len_b), or
      `generation_config.max_length` minus P when the caller gave a length.
    - Early stop: a sentence stops when it has `num_return_sequences` finished hypotheses and no running beam can
      beat the worst of them at any length it can still reach (the best running log P / lp(length), maximised over
      the reachable lengths, is at most that finished score). Log-probabilities only decrease, so this is exact:
      the hypotheses returned are those of the search run to the maximum length (`early_stopping` is therefore not
      consulted). With one returned hypothesis this is the paper's (tensor2tensor's) rule: stop when the best
      finished hypothesis beats the best running one scored at the maximum length. The bound is dropped if a
      logits processor ever makes a score positive.

    Returns what transformers' beam search returns: the best `num_return_sequences` hypotheses per sentence, best
    first, starting with the prompt and right-padded with `pad_token_id` (a LongTensor), or with
    `return_dict_in_generate=True` a `GenerateBeamEncoderDecoderOutput` with `sequences`, `sequences_scores` (the
    penalised score, with `output_scores`), `scores` (per step, the processed log-probabilities of the
    batch * num_beams rows; rows of sentences already finished hold -inf), `logits` (with `output_logits`, same
    layout) and `beam_indices`. Finished sentences leave the batch (their cache rows are dropped), unless
    `synced_gpus` or a non-dynamic cache keeps the batch whole.
    """
    model_kwargs.pop("labels", None)  # Seq2SeqTrainer passes them; generation does not use them (as in transformers)
    unsupported = set(model_kwargs) - _SUPPORTED_MODEL_KWARGS
    if generation_config.output_attentions or generation_config.output_hidden_states:
        unsupported |= {"output_attentions/output_hidden_states"}
    if unsupported:
        raise ValueError(
            f"The paper's beam search does not support {sorted(unsupported)}; pass length_penalty_type='transformers' "
            "to use transformers' beam search."
        )
    if not model.config.is_encoder_decoder:
        raise ValueError("paper_beam_search is for encoder-decoder models.")

    num_beams = generation_config.num_beams
    num_return_sequences = generation_config.num_return_sequences or 1
    alpha = generation_config.length_penalty
    pad_token_id = generation_config._pad_token_tensor
    pad_token_id = int(pad_token_id) if pad_token_id is not None else 0
    eos_ids = generation_config._eos_token_tensor
    eos_ids = eos_ids.reshape(-1).to(input_ids.device) if eos_ids is not None else input_ids.new_empty(0)
    return_dict = generation_config.return_dict_in_generate
    output_scores = return_dict and generation_config.output_scores
    output_logits = return_dict and generation_config.output_logits
    use_cache = bool(model_kwargs.get("use_cache", True))

    device = input_ids.device
    total_rows, prompt_length = input_ids.shape
    batch_size = total_rows // num_beams
    if paper_sentence_max_new_tokens is not None:
        limits = paper_sentence_max_new_tokens.to(device).long()
    else:
        limits = torch.full((batch_size,), generation_config.max_length - prompt_length, device=device)
    if int(limits.min()) < 1:
        raise ValueError(f"max_length ({generation_config.max_length}) leaves no token to generate.")
    max_new = int(limits.max())
    # Stopping criteria other than eos and max length (which are handled here) are evaluated on the candidates.
    extra_criteria = [c for c in stopping_criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria))]

    encoder_outputs = model_kwargs["encoder_outputs"]
    encoder_states = encoder_outputs.last_hidden_state
    attention_mask = model_kwargs.get("attention_mask")
    cache = model_kwargs.get(CACHE_NAME) if use_cache else None
    rows_independent = all(type(item).__name__ in _ROW_INDEPENDENT for item in [*logits_processor, *stopping_criteria])
    drop_finished = not paper_synced_gpus and rows_independent and (
        cache is None
        or (
            isinstance(cache, EncoderDecoderCache)
            and isinstance(cache.self_attention_cache, DynamicCache)
            and isinstance(cache.cross_attention_cache, DynamicCache)
        )
    )

    # Running state over the active sentences (A of them, rows a * num_beams + k).
    active = torch.arange(batch_size, device=device)
    sequences = input_ids
    history = input_ids.new_empty(total_rows, 0)  # beam_indices of the running beams (rows of the full batch)
    # Float32 (or the model's float64): the first beam of each sentence starts at 0, the copies at -inf.
    score_dtype = torch.float64 if encoder_states.dtype == torch.float64 else torch.float32
    running_scores = torch.full((batch_size, num_beams), -math.inf, dtype=score_dtype, device=device)
    running_scores[:, 0] = 0.0
    # Finished hypotheses per sentence of the full batch, best first.
    finished_scores = torch.full((batch_size, num_beams), -math.inf, dtype=score_dtype, device=device)
    finished_sequences = input_ids.new_full((batch_size, num_beams, prompt_length + max_new), pad_token_id)
    finished_history = input_ids.new_full((batch_size, num_beams, max_new), -1)
    finished_lengths = input_ids.new_zeros(batch_size, num_beams)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    bound_valid = True
    all_scores = () if output_scores else None
    all_logits = () if output_logits else None

    num_candidates = 2 * num_beams
    candidate_rank = torch.arange(num_candidates, device=device)
    this_peer_finished = False
    step = 0
    while model._has_unfinished_sequences(this_peer_finished, paper_synced_gpus, device=device):
        decoder_input_ids = sequences[:, -1:] if (cache is not None and step > 0) else sequences
        outputs = model(
            encoder_outputs=(encoder_states,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=use_cache,
            **{CACHE_NAME: cache},
            return_dict=True,
        )
        step += 1
        logits = outputs.logits[:, -1, :]
        del outputs
        if this_peer_finished:  # synced_gpus: keep the other processes company
            sequences = torch.cat([sequences, sequences[:, -1:]], dim=-1)
            continue
        log_probs = nn.functional.log_softmax(logits.to(score_dtype), dim=-1)
        if len(logits_processor) > 0:
            log_probs = logits_processor(sequences, log_probs)
            if bound_valid and bool((log_probs > 0).any()):
                bound_valid = False
        num_active, vocab_size = active.shape[0], log_probs.shape[-1]
        if output_scores or output_logits:
            rows = (active[:, None] * num_beams + torch.arange(num_beams, device=device)).reshape(-1)
            if output_scores:
                all_scores += (_scatter_rows(log_probs, rows, total_rows),)
            if output_logits:
                all_logits += (_scatter_rows(logits.to(score_dtype), rows, total_rows),)

        # 2 * num_beams best continuations per sentence over num_beams * vocab.
        candidates = (running_scores[:, :, None] + log_probs.view(num_active, num_beams, vocab_size)).view(
            num_active, num_beams * vocab_size
        )
        top_scores, top_indices = candidates.topk(num_candidates, dim=-1)
        top_beams = torch.div(top_indices, vocab_size, rounding_mode="floor")
        top_tokens = top_indices % vocab_size
        source_rows = torch.arange(num_active, device=device)[:, None] * num_beams + top_beams  # (A, 2K)
        origins = active[:, None] * num_beams + top_beams  # the same rows, numbered in the full batch

        def extend(candidates: torch.Tensor):
            """Token sequences (and beam_indices) of the chosen candidates, shape (A, n) -> (A * n, length + 1)."""
            rows = source_rows.gather(1, candidates).reshape(-1)
            tokens = top_tokens.gather(1, candidates).reshape(-1, 1)
            extended = torch.cat([sequences[rows], tokens], dim=-1)
            if not return_dict:
                return extended, history
            return extended, torch.cat([history[rows], origins.gather(1, candidates).reshape(-1, 1)], dim=-1)

        generated = sequences.shape[-1] + 1 - prompt_length  # |Y| of the candidates
        limit = limits[active]
        ends = torch.isin(top_tokens, eos_ids)
        if extra_criteria:
            all_candidates, _ = extend(candidate_rank.expand(num_active, -1))
            for criterion in extra_criteria:
                ends |= criterion(all_candidates, all_scores).view(num_active, num_candidates).to(device)
        at_limit = limit <= generated
        ends |= at_limit[:, None]
        is_done = done[active]
        newly_finished = ends & (candidate_rank < num_beams) & ~is_done[:, None]

        # Merge the new finished hypotheses into the kept ones, for the sentences that have some.
        merging = newly_finished.any(-1).nonzero().squeeze(-1)
        if merging.numel() > 0:
            sentences, count = active[merging], merging.numel()
            penalised = top_scores[merging, :num_beams] / gnmt_length_penalty(generated, alpha)
            penalised = penalised.masked_fill(~newly_finished[merging, :num_beams], -math.inf)
            best_scores, best = torch.cat([finished_scores[sentences], penalised], dim=-1).topk(num_beams, dim=-1)
            width = prompt_length + max_new
            new_sequences, new_history = extend(candidate_rank[:num_beams].expand(num_active, -1))
            new_sequences = new_sequences.view(num_active, num_beams, -1)[merging]
            new_sequences = nn.functional.pad(new_sequences, (0, width - new_sequences.shape[-1]), value=pad_token_id)
            merged_sequences = torch.cat([finished_sequences[sentences], new_sequences], dim=1)
            finished_sequences[sentences] = merged_sequences.gather(1, best[:, :, None].expand(-1, -1, width))
            if return_dict:
                new_history = new_history.view(num_active, num_beams, -1)[merging]
                new_history = nn.functional.pad(new_history, (0, max_new - new_history.shape[-1]), value=-1)
                merged_history = torch.cat([finished_history[sentences], new_history], dim=1)
                finished_history[sentences] = merged_history.gather(1, best[:, :, None].expand(-1, -1, max_new))
            merged_lengths = torch.cat(
                [finished_lengths[sentences], finished_lengths.new_full((count, num_beams), generated)], dim=1
            )
            finished_scores[sentences] = best_scores
            finished_lengths[sentences] = merged_lengths.gather(1, best)

        # The next running beams: the best num_beams continuations that did not end (dead ones at -inf).
        order = torch.where(ends, candidate_rank + num_candidates, candidate_rank)
        selected = order.topk(num_beams, dim=-1, largest=False).indices  # sorted: best first
        running_scores = top_scores.gather(1, selected)
        running_scores = running_scores.masked_fill(ends.gather(1, selected), -math.inf)
        cache_rows = source_rows.gather(1, selected).reshape(-1)
        sequences, history = extend(selected)

        # Which sentences are done: at their limit, or no running beam can beat their worst kept hypothesis.
        best_running = running_scores[:, 0]
        now_done = at_limit | torch.isneginf(best_running)
        if bound_valid:
            next_length = gnmt_length_penalty(torch.full_like(best_running, generated + 1), alpha)
            last_length = gnmt_length_penalty(limit.to(score_dtype), alpha)
            bound = torch.maximum(best_running / next_length, best_running / last_length)
            worst_kept = finished_scores[active, num_return_sequences - 1]
            now_done |= ~torch.isneginf(worst_kept) & (bound <= worst_kept)
        done[active] = is_done | now_done

        keep = ~done[active]
        if drop_finished and not bool(keep.all()):
            kept_rows = (
                torch.arange(num_active, device=device)[keep][:, None] * num_beams
                + torch.arange(num_beams, device=device)
            ).reshape(-1)
            active = active[keep]
            running_scores = running_scores[keep]
            sequences = sequences[kept_rows]
            history = history[kept_rows]
            cache_rows = cache_rows[kept_rows]
            encoder_states = encoder_states[kept_rows]
            if attention_mask is not None:
                attention_mask = attention_mask[kept_rows]
            if cache is not None:
                cache.cross_attention_cache.reorder_cache(kept_rows)
        if cache is not None:
            cache.self_attention_cache.reorder_cache(cache_rows)
        this_peer_finished = bool(done.all())

    # Best num_return_sequences per sentence, best first, cropped to the longest.
    output_length = int(finished_lengths[:, :num_return_sequences].max())
    sequences = finished_sequences[:, :num_return_sequences, : prompt_length + output_length]
    sequences = sequences.reshape(batch_size * num_return_sequences, -1)
    if not return_dict:
        return sequences
    beam_indices = finished_history[:, :num_return_sequences, :output_length].reshape(sequences.shape[0], -1)
    encoder_output = model_kwargs["encoder_outputs"]
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=finished_scores[:, :num_return_sequences].reshape(-1) if output_scores else None,
        scores=all_scores,
        logits=all_logits,
        beam_indices=beam_indices,
        encoder_attentions=encoder_output.get("attentions") if generation_config.output_attentions else None,
        encoder_hidden_states=encoder_output.get("hidden_states") if generation_config.output_hidden_states else None,
    )


def _scatter_rows(values: torch.Tensor, rows: torch.Tensor, total_rows: int) -> torch.Tensor:
    """Rows of the active sentences placed in a (batch * num_beams, vocab) tensor; other rows -inf."""
    if values.shape[0] == total_rows:
        return values.clone()
    full = values.new_full((total_rows, values.shape[-1]), -math.inf)
    full[rows] = values
    return full
