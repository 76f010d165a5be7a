"""The paper's decoding (beam 4, GNMT length penalty 0.6, source length + 50) against an independent reference."""

import copy
import json
import math
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, AutoModelForSeq2SeqLM, GenerationConfig, GenerationMixin
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.generation import PAPER_GENERATION_DEFAULTS, SHARED_SOURCE_KERNELS

import helpers

PAD, BOS, EOS = 0, 1, 2
VOCAB = 40


def tiny_model(
    seed: int = 0, eos_bias: float = 0.0, vocab_size: int = VOCAB, **fields
) -> VaswaniTransformerForConditionalGeneration:
    """A random float64 model; `eos_bias` > 0 makes </s> likelier (hypotheses then end at various steps), < 0 rarer.

    The bias is the last decoder LayerNorm's bias, pointed along the (tied) </s> output embedding.
    """
    model = helpers.tiny_model(seed, vocab_size=vocab_size, **fields).double()
    if eos_bias:
        with torch.no_grad():
            eos_embedding = model.lm_head.weight[EOS]
            final_norm = model.model.decoder.layers[-1].feed_forward_residual.layer_norm
            final_norm.bias.copy_(eos_bias * eos_embedding / eos_embedding.norm())
    return model


def random_sources(seed: int, lengths=(5, 2, 8, 4)):
    """Right-padded sources ending with </s>, of the given real lengths, and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.full((len(lengths), max(lengths)), PAD)
    for row, length in enumerate(lengths):
        batch[row, : length - 1] = torch.randint(4, VOCAB, (length - 1,), generator=generator)
        batch[row, length - 1] = EOS
    return {"input_ids": batch, "attention_mask": (batch != PAD).long()}


def gnmt(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


INF = 1e7  # tensor2tensor's "infinity" for empty and excluded places


@torch.no_grad()
def step_log_probs(model, source, prefixes: list[list[int]], decoder_mask: list[int] | None = None) -> list[list]:
    """log P(next token | prefix, source) for each prefix: a full forward pass in float64, no cache."""
    decoder_input_ids = torch.tensor(prefixes)
    decoder_attention_mask = None
    if decoder_mask is not None:  # the prompt's mask, then ones for the generated tokens
        decoder_attention_mask = torch.tensor([decoder_mask + [1] * (len(p) - len(decoder_mask)) for p in prefixes])
    logits = model(
        input_ids=source[None].expand(len(prefixes), -1),
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        use_cache=False,
    ).logits[:, -1]
    return torch.log_softmax(logits.double(), dim=-1).tolist()


def top_continuations(model, source, alive, count, decoder_mask=None):
    """The `count` best (log P, tokens) continuations of the alive (log P, tokens) beams, best first."""
    log_probs = step_log_probs(model, source, [tokens for _, tokens in alive], decoder_mask)
    candidates = [
        (score + log_probs[beam][token], tokens + [token])
        for beam, (score, tokens) in enumerate(alive)
        for token in range(len(log_probs[beam]))
    ]
    candidates.sort(key=lambda candidate: -candidate[0])
    return candidates[:count]


def t2t_beam_search(model, source, beam_size, alpha, decode_length, prompt=(BOS,), top_beams=1, decoder_mask=None):
    """tensor2tensor's utils/beam_search.py (`beam_search` with its Transformer's `stop_early=(top_beams == 1)`),
    for one unpadded sentence, written from its description: plain Python lists, a full forward pass each step.

    i = 0, 1, ...: grow_topk takes the 2 * beam_size best continuations of the alive beams (scored
    log P / lp(i + 1), the same order as log P); grow_alive keeps the beam_size best of those that do not end with
    </s>; grow_finished keeps the beam_size best by score of the finished ones and those of the 2 * beam_size that
    end with </s>. _is_not_finished: go on while i < decode_length and not (best finished score (stop_early; else
    the lowest of the beam_size finished places, -INF where empty) > best alive log P / lp(decode_length)).
    At the end: the finished hypotheses if any, else the alive ones. Here the places left empty when fewer than
    `top_beams` finished take the alive beams (score log P / lp(decode_length)) after the finished ones.
    Returns ([(score, tokens after <s>)] best first, number of steps run).
    """
    alive = [(0.0, list(prompt))]
    finished = []  # (score, tokens), best first, at most beam_size
    i = 0
    while True:
        lower_bound_alive = alive[0][0] / gnmt(decode_length, alpha)
        places = [score for score, _ in finished] + [-INF] * (beam_size - len(finished))
        lowest_finished = max(places) if top_beams == 1 else min(places)
        if not (i < decode_length and not lowest_finished > lower_bound_alive):
            break
        topk = top_continuations(model, source, alive, 2 * beam_size, decoder_mask)
        alive = [(score, tokens) for score, tokens in topk if tokens[-1] != EOS][:beam_size]
        ended = [(score / gnmt(i + 1, alpha), tokens) for score, tokens in topk if tokens[-1] == EOS]
        finished = sorted(finished + ended, key=lambda hypothesis: -hypothesis[0])[:beam_size]
        i += 1
    cut = [(score / gnmt(decode_length, alpha), tokens) for score, tokens in alive]
    hypotheses = finished + cut[: max(0, top_beams - len(finished))]
    return [(score, tokens[1:]) for score, tokens in hypotheses][:top_beams], i


def fairseq_beam_search(model, source, beam_size, alpha, max_len, prompt=(BOS,), nbest=1, decoder_mask=None):
    """fairseq's sequence_generator.py (`SequenceGenerator._generate`) for one unpadded sentence, written from its
    description, with the paper's penalty log P / lp(|Y|) and the limit counting every generated token (fairseq
    appends a forced </s> after max_len tokens instead, and forbids <pad>).

    Each step the 2 * beam_size best continuations are taken; those among the first beam_size that end with </s>
    (or reach max_len) are finalized in that order while the sentence has fewer than beam_size (finalize_hypos);
    the sentence is finished once it has beam_size or at max_len (is_finished); otherwise the first beam_size that
    do not end with </s> are the next beams. The finalized hypotheses are then sorted by score.
    Returns ([(score, tokens after <s>)] best first, number of steps run).
    """
    alive = [(0.0, list(prompt))]
    finalized = []
    for step in range(1, max_len + 1):
        candidates = top_continuations(model, source, alive, 2 * beam_size, decoder_mask)
        for score, tokens in candidates[:beam_size]:
            if (tokens[-1] == EOS or step == max_len) and score > -math.inf and len(finalized) < beam_size:
                finalized.append((score / gnmt(step, alpha), tokens))
        if len(finalized) == beam_size or step == max_len:
            break
        alive = [(score, tokens) for score, tokens in candidates if tokens[-1] != EOS][:beam_size]
    finalized.sort(key=lambda hypothesis: -hypothesis[0])
    return [(score, tokens[1:]) for score, tokens in finalized][:nbest], step


def hypotheses(sequences: torch.Tensor) -> list[list[int]]:
    """Tokens after the start token, up to the first </s> included, else without trailing padding.

    (A hypothesis cut at the maximum length may itself end with generated pad tokens: tests that need exact lengths
    forbid pad, or compare padded tensors.)
    """
    result = []
    for row in sequences.tolist():
        assert row[0] == BOS
        tokens = row[1:]
        if EOS in tokens:
            tokens = tokens[: tokens.index(EOS) + 1]
        while tokens and tokens[-1] == PAD:
            tokens.pop()
        result.append(tokens)
    return result


def padded(token_lists: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([[BOS] + tokens + [PAD] * (width - 1 - len(tokens)) for tokens in token_lists])


# --- the default generation config -----------------------------------------------------------------------------------


def test_every_model_carries_the_paper_generation_config_and_saves_it(tmp_path):
    model = tiny_model()
    for name, value in PAPER_GENERATION_DEFAULTS.items():
        assert getattr(model.generation_config, name) == value
    model.generation_config.max_len_b = 7
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    expected = {**PAPER_GENERATION_DEFAULTS, "max_len_b": 7}
    assert {name: saved[name] for name in expected} == expected
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert {name: getattr(reloaded.generation_config, name) for name in expected} == expected
    assert GenerationConfig.from_pretrained(tmp_path).max_len_b == 7


@pytest.mark.parametrize("saved_with", ["no generation_config.json", "one derived from config.json"])
def test_a_folder_without_a_decoding_of_its_own_decodes_as_the_paper(tmp_path, saved_with):
    """A model folder with config.json and weights only (copied by hand, uploaded without it), or with a generation
    config transformers derived from config.json (`_from_model_config`): loading gives the paper's decoding, as the
    model built from its config has, not transformers' plain greedy search (before: num_beams None, greedy)."""
    model = tiny_model()
    model.save_pretrained(tmp_path)
    if saved_with == "no generation_config.json":
        (tmp_path / "generation_config.json").unlink()
    else:
        GenerationConfig.from_model_config(model.config).save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    for name, value in PAPER_GENERATION_DEFAULTS.items():
        assert getattr(reloaded.generation_config, name) == value, name
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])}
    inputs["attention_mask"] = (inputs["input_ids"] != 0).long()
    greedy = model.generate(**inputs, num_beams=1, max_new_tokens=6)
    decoded = reloaded.generate(**inputs, max_new_tokens=6)
    assert torch.equal(decoded, model.generate(**inputs, max_new_tokens=6))
    assert not torch.equal(decoded, greedy)  # the check can tell the two decodings apart


# --- against the reference -------------------------------------------------------------------------------------------

# (seed, eos_bias, alpha, max_len_b)
REFERENCE_CASES = [(0, 0.0, 0.6, 6), (2, 1.5, 0.6, 6), (4, 1.25, 0.6, 10)]
RULES = ["t2t", "fairseq"]


def reference(rules, model, source, alpha, limit, count=1, prompt=(BOS,), decoder_mask=None):
    """The reference beam search of `rules` with beam 4 for one sentence: ([(score, tokens)], steps run)."""
    if rules == "t2t":
        return t2t_beam_search(model, source, 4, alpha, limit, prompt, top_beams=count, decoder_mask=decoder_mask)
    return fairseq_beam_search(model, source, 4, alpha, limit, prompt, nbest=count, decoder_mask=decoder_mask)


def steps_run(scores: tuple, sentence: int, num_beams: int = 4) -> int:
    """Steps a sentence took part in: its rows of `output.scores` hold -inf once it has left the batch."""
    return sum(not bool(torch.isneginf(step[sentence * num_beams]).all()) for step in scores)


def assert_matches_reference(model, inputs, output, rules, alpha, max_len_a, max_len_b, count):
    width = output.sequences.shape[1]
    longest = 0
    for sentence, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"])):
        source = ids[mask.bool()]
        expected, steps = reference(rules, model, source, alpha, int(max_len_a * len(source) + max_len_b), count)
        longest = max([longest] + [len(tokens) for _, tokens in expected])
        rows = slice(count * sentence, count * sentence + count)
        assert torch.equal(output.sequences[rows], padded([tokens for _, tokens in expected], width)), sentence
        torch.testing.assert_close(
            output.sequences_scores[rows], torch.tensor([score for score, _ in expected], dtype=torch.float64)
        )
        assert steps_run(output.scores, sentence) == steps, sentence  # the same stopping rule
    assert width == 1 + longest


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize(
    "seed, eos_bias, alpha, max_len_b", REFERENCE_CASES + [(5, 1.25, 1.5, 6), (1, 1.75, -0.5, 6), (3, 0.0, 0.6, 50)]
)
def test_matches_an_independent_reference_beam_search(seed, eos_bias, alpha, max_len_b, rules):
    """Four hypotheses per sentence (t2t: the bound on the worst of the finished set) and one (t2t: on the best)."""
    model = tiny_model(seed, eos_bias)
    inputs = random_sources(seed + 100)
    for count in (4, 1):
        output = model.generate(
            **inputs, length_penalty=alpha, max_len_b=max_len_b, num_return_sequences=count, beam_search_rules=rules,
            return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip
        assert isinstance(output, GenerateBeamEncoderDecoderOutput)
        assert_matches_reference(model, inputs, output, rules, alpha, 1, max_len_b, count)


def test_a_vocabulary_past_the_blocked_top_k_threshold_matches_the_reference():
    """2,100 tokens x 4 beams = 8,400 candidates per sentence: `top_k` takes them in blocks of 128 (and a tail of 80
    that fills none); the same hypotheses and scores as the reference's sort of every candidate."""
    model = tiny_model(11, eos_bias=1.5, vocab_size=2100)
    inputs = random_sources(111)
    output = model.generate(**inputs, max_len_b=6, return_dict_in_generate=True, output_scores=True)
    assert_matches_reference(model, inputs, output, "t2t", 0.6, 1, 6, 1)


def test_top_k_gives_torch_topk_values_at_indices_that_hold_them():
    """Long rows (blocks of 128, a tail, ties, -inf, float32 and float64) and short ones (torch's own `topk`): the
    values of `torch.topk`, best first, at distinct indices that hold them."""
    from vaswani_transformer.generation import top_k

    generator = torch.Generator().manual_seed(0)
    cases = [torch.randn(64, 4 * 8000, generator=generator), torch.randn(3, 4 * 37000 + 5, generator=generator),
             torch.randint(0, 3, (8, 9000), generator=generator).double(), torch.randn(2, 100, generator=generator)]
    cases[0][0, : 3 * 8000] = float("-inf")  # one running beam only, as at the first step
    cases[1][1, -5:] = 1e9  # the best in the tail
    for x in cases:
        for k in (8, 3):
            values, indices = top_k(x, k)
            assert torch.equal(values, x.topk(k, dim=-1).values)
            assert torch.equal(x.gather(1, indices), values)
            assert all(len(set(row)) == k for row in indices.tolist())


def random_batch(seed: int, count: int, max_length: int = 9):
    """`count` right-padded random sources of random lengths 2..max_length (ending with </s>) and their mask."""
    generator = torch.Generator().manual_seed(seed)
    return random_sources(seed, lengths=torch.randint(2, max_length + 1, (count,), generator=generator).tolist())


MANY_SENTENCE_MODELS = [(7, 1.75), (8, 1.5)]  # (seed, eos_bias), each decoding random_batch(seed, 64)


@pytest.mark.parametrize("rules", RULES)
def test_matches_the_reference_on_many_sentences(rules):
    """128 sentences of two tiny models, with a short limit (0.5 * source length + 2) that many reach."""
    for seed, eos_bias in MANY_SENTENCE_MODELS:
        model = tiny_model(seed, eos_bias)
        inputs = random_batch(seed, 64)
        output = model.generate(
            **inputs, max_len_a=0.5, max_len_b=2, beam_search_rules=rules, return_dict_in_generate=True,
            output_scores=True,
        )  # fmt: skip
        assert_matches_reference(model, inputs, output, rules, 0.6, 0.5, 2, 1)


def test_the_two_rule_sets_decode_differently_and_t2t_is_the_default():
    """Sanity check that the rules matter on these sentences: t2t and fairseq disagree on a good share of them."""
    model = tiny_model(8, 1.5)
    inputs = random_batch(8, 64)
    t2t = hypotheses(model.generate(**inputs, max_len_a=0.5, max_len_b=2, beam_search_rules="t2t"))
    fairseq = hypotheses(model.generate(**inputs, max_len_a=0.5, max_len_b=2, beam_search_rules="fairseq"))
    assert sum(a != b for a, b in zip(t2t, fairseq)) >= 8
    assert hypotheses(model.generate(**inputs, max_len_a=0.5, max_len_b=2)) == t2t
    model.generation_config.beam_search_rules = "fairseq"  # a saved setting of the model's generation config
    assert hypotheses(model.generate(**inputs, max_len_a=0.5, max_len_b=2)) == fairseq


@pytest.mark.parametrize("rules", RULES)
def test_a_decoder_prompt_is_continued_and_not_counted(rules):
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(13, lengths=(4,))
    prompt = torch.tensor([[BOS, 17, 23]])
    output = model.generate(
        **inputs, decoder_input_ids=prompt, max_len_b=5, num_return_sequences=4, beam_search_rules=rules,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    expected, _ = reference(rules, model, inputs["input_ids"][0], 0.6, 4 + 5, count=4, prompt=[BOS, 17, 23])
    assert torch.equal(output.sequences, padded([tokens for _, tokens in expected], output.sequences.shape[1]))
    expected_scores = torch.tensor([score for score, _ in expected], dtype=torch.float64)
    torch.testing.assert_close(output.sequences_scores, expected_scores)


@pytest.mark.parametrize("rules", RULES)
def test_reference_cases_include_early_ends_and_the_length_limit(rules):
    """The cases above have best hypotheses ending with </s> mid-way, and others cut at the maximum length."""
    kinds = set()
    cases = [(seed, bias, random_sources(seed + 100), 1, max_len_b) for seed, bias, _, max_len_b in REFERENCE_CASES]
    cases += [(seed, eos_bias, random_batch(seed, 64), 0.5, 2) for seed, eos_bias in MANY_SENTENCE_MODELS]
    for seed, eos_bias, inputs, max_len_a, max_len_b in cases:
        sequences = tiny_model(seed, eos_bias).generate(
            **inputs, max_len_a=max_len_a, max_len_b=max_len_b, beam_search_rules=rules
        )
        for tokens, length in zip(hypotheses(sequences), inputs["attention_mask"].sum(-1).tolist()):
            limit = int(max_len_a * length + max_len_b)
            if tokens[-1] != EOS:
                kinds.add("cut at the limit" if len(tokens) == limit else "?")
            else:
                kinds.add("</s> mid-way" if 1 < len(tokens) < limit else "</s> at an end")
    assert {"cut at the limit", "</s> mid-way"} <= kinds


def test_batched_equals_one_by_one_and_cache_equals_no_cache():
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(7, lengths=(3, 9, 5, 6, 2))
    batched = model.generate(**inputs, max_len_b=8, return_dict_in_generate=True, output_scores=True)
    no_cache = model.generate(
        **inputs, max_len_b=8, use_cache=False, return_dict_in_generate=True, output_scores=True
    )
    assert hypotheses(batched.sequences) == hypotheses(no_cache.sequences)
    torch.testing.assert_close(batched.sequences_scores, no_cache.sequences_scores)
    for row, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"])):
        single = model.generate(
            input_ids=ids[mask.bool()][None], max_len_b=8, return_dict_in_generate=True, output_scores=True
        )
        assert hypotheses(single.sequences) == hypotheses(batched.sequences[row : row + 1])
        torch.testing.assert_close(single.sequences_scores, batched.sequences_scores[row : row + 1])


def test_a_sentence_s_beams_read_one_copy_of_its_source_and_match_the_search_over_copies():
    """The search's cross-attention keys and values come from one row per sentence (its beams share them, through
    finished sentences leaving the batch) under eager, sdpa and a registered kernel added to `SHARED_SOURCE_KERNELS`;
    the hypotheses and scores are those of the same search with each beam reading its own copy of the source (as
    under any other registered kernel)."""
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(7, lengths=(3, 9, 5, 6, 2))
    for name in ("vaswani_test_copied_source", "vaswani_test_shared_source"):
        AttentionInterface.register(name, sdpa_attention_forward)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    SHARED_SOURCE_KERNELS.add("vaswani_test_shared_source")
    results, key_rows = {}, {}
    for implementation in ("eager", "sdpa", "vaswani_test_shared_source", "vaswani_test_copied_source"):
        model.set_attn_implementation(implementation)
        rows = key_rows[implementation] = []
        with model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
            lambda module, args, output, rows=rows: rows.append(args[0].shape[0])
        ):
            results[implementation] = model.generate(**inputs, max_len_b=8, return_dict_in_generate=True,
                                                     output_scores=True)  # fmt: skip
    # The first decoding step computes them (later steps read the cache): 5 sentences, not 5 x 4 beams.
    assert {name: rows[0] for name, rows in key_rows.items()} == {
        "eager": 5, "sdpa": 5, "vaswani_test_shared_source": 5, "vaswani_test_copied_source": 5 * 4
    }  # fmt: skip
    copied = results.pop("vaswani_test_copied_source")
    assert len({len(h) for h in hypotheses(copied.sequences)}) > 1  # sentences left the batch on the way
    for shared in results.values():
        assert hypotheses(shared.sequences) == hypotheses(copied.sequences)
        torch.testing.assert_close(shared.sequences_scores, copied.sequences_scores)


def test_sentence_dependent_logits_processors_see_their_own_rows():
    """prefix_allowed_tokens_fn indexes rows by sentence: batched must equal one by one (the batch stays whole)."""
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(8)
    allowed = [[EOS, *range(4 + 5 * i, 14 + 5 * i)] for i in range(4)]
    batched = hypotheses(
        model.generate(**inputs, max_len_b=6, prefix_allowed_tokens_fn=lambda batch_id, ids: allowed[batch_id])
    )
    for row, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"])):
        single = model.generate(
            input_ids=ids[mask.bool()][None], max_len_b=6, prefix_allowed_tokens_fn=lambda _, ids: allowed[row]
        )
        assert hypotheses(single) == [batched[row]]
        assert set(batched[row]) <= set(allowed[row])


@pytest.mark.parametrize("rules", RULES)
def test_sentences_done_keep_their_hypotheses_where_the_batch_stays_whole(rules):
    """A logits processor outside the row-independent ones (here one that changes nothing) or a static cache keeps
    the batch whole: sentences already done run along with the others, and must not change their finished
    hypotheses any more (with t2t's rules a hypothesis cut at the limit replaced one that had finished there). The
    same tokens, scores and steps as the default path (finished sentences leave the batch) and the reference."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class NoOp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores

    model = tiny_model(0, eos_bias=0.25)
    inputs = random_batch(50, 12)  # a short limit, 0.5 * source length + 2, that most sentences reach
    for count in (1, 4):
        kwargs = dict(max_len_a=0.5, max_len_b=2, num_return_sequences=count, beam_search_rules=rules,
                      return_dict_in_generate=True, output_scores=True)  # fmt: skip
        default = model.generate(**inputs, **kwargs)
        for whole in (dict(logits_processor=LogitsProcessorList([NoOp()])), dict(cache_implementation="static")):
            output = model.generate(**inputs, **kwargs, **whole)
            assert torch.equal(output.sequences, default.sequences), (count, whole)
            torch.testing.assert_close(output.sequences_scores, default.sequences_scores)
            assert_matches_reference(model, inputs, output, rules, 0.6, 0.5, 2, count)


@pytest.mark.parametrize("rules", RULES)
def test_forced_eos_comes_at_each_sentences_own_limit(rules):
    """`forced_eos_token_id`: transformers' processor forces </s> at one max_length for the batch (the longest
    sentence's limit); each sentence of a batch ends with </s> at its own limit, as decoded alone."""
    model = tiny_model(2)
    inputs = random_sources(102, lengths=(2, 8))
    kwargs = dict(max_len_b=4, forced_eos_token_id=EOS, beam_search_rules=rules, return_dict_in_generate=True,
                  output_scores=True)  # fmt: skip
    batch = model.generate(**inputs, **kwargs)
    forced_at_limit = False
    for row, length in enumerate(inputs["attention_mask"].sum(-1).tolist()):
        alone = model.generate(input_ids=inputs["input_ids"][row : row + 1, :length], **kwargs)
        (tokens,) = hypotheses(alone.sequences)
        assert hypotheses(batch.sequences[row : row + 1]) == [tokens], row
        torch.testing.assert_close(batch.sequences_scores[row], alone.sequences_scores[0])
        assert tokens[-1] == EOS and len(tokens) <= length + 4
        forced_at_limit |= len(tokens) == length + 4
    assert forced_at_limit  # the shorter sentence runs to its limit


def test_a_stopping_criterion_finishes_hypotheses_like_an_extra_eos_token():
    from transformers import StoppingCriteria, StoppingCriteriaList

    class EndsWith(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 39

    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(12)
    with_criterion = model.generate(**inputs, max_len_b=8, stopping_criteria=StoppingCriteriaList([EndsWith()]))
    with_two_eos = model.generate(**inputs, max_len_b=8, eos_token_id=[EOS, 39])
    assert torch.equal(with_criterion, with_two_eos)
    assert (with_two_eos == 39).any()


def test_stop_strings_with_the_tokenizer_end_hypotheses_as_their_criterion_does():
    """`generate(stop_strings=..., tokenizer=...)` with the paper's search gives what the stop-string criterion gives
    passed explicitly (transformers hands a callable custom_generate no tokenizer: the search builds the criterion
    itself), from the call or from the generation config; sentences that write the string end with it."""
    from transformers import StoppingCriteriaList, StopStringCriteria

    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, seed=5).eval()
    inputs = tokenizer(["the cat sat on the mat", "a dog ran", "birds fly over the house today"], return_tensors="pt",
                       padding=True)  # fmt: skip
    settings = dict(max_len_a=0, max_len_b=10)
    plain = tokenizer.batch_decode(model.generate(**inputs, **settings), skip_special_tokens=True)
    criterion = StoppingCriteriaList([StopStringCriteria(tokenizer, ["x<"])])
    explicit = model.generate(**inputs, stopping_criteria=criterion, **settings)
    from_call = model.generate(**inputs, stop_strings=["x<"], tokenizer=tokenizer, **settings)
    config = GenerationConfig.from_dict({**model.generation_config.to_dict(), "stop_strings": ["x<"]})
    from_config = model.generate(**inputs, generation_config=config, tokenizer=tokenizer, **settings)
    assert torch.equal(from_call, explicit) and torch.equal(from_config, explicit)
    texts = tokenizer.batch_decode(from_call, skip_special_tokens=True)
    assert all(text.endswith("x<") and text.count("x<") == 1 for text in texts)
    # where the plain search wrote the string, cut just after it; the second sentence ('!!!...' to the length limit)
    # now has a finished hypothesis, which wins over beams cut at the limit
    assert [texts[0], texts[2]] == [plain[0][: plain[0].index("x<") + 2], plain[2][: plain[2].index("x<") + 2]]
    assert "x<" not in plain[1]


def test_a_generation_config_passed_alone_stays_alone():
    """transformers deprecates a `generation_config` passed together with loose generation fields: the length rule
    (max_length) and the stop-string criterion go into a copy of the caller's config, not beside it, and the caller's
    config object is left as it was. The tokens equal those of the same fields passed as keywords."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as transformers_logging

    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, seed=5).eval()
    inputs = tokenizer(["the cat sat on the mat", "a dog ran"], return_tensors="pt", padding=True)
    config = GenerationConfig.from_dict({**model.generation_config.to_dict(), "max_len_a": 0, "max_len_b": 10,
                                         "stop_strings": ["x<"]})  # fmt: skip
    before = config.to_dict()
    transformers_logging.warning_once.cache_clear()  # the deprecation is logged once per message and process
    with CaptureLogger(transformers_logging.get_logger("transformers.generation.utils")) as captured:
        output = model.generate(**inputs, generation_config=config, tokenizer=tokenizer)
    assert "generation_config" not in captured.out, captured.out
    assert config.to_dict() == before
    expected = model.generate(**inputs, max_len_a=0, max_len_b=10, stop_strings=["x<"], tokenizer=tokenizer)
    assert torch.equal(output, expected)


def test_a_source_without_attention_mask_has_its_pad_tokens_masked_as_fairseq_does():
    """Padded source ids without `attention_mask` (transformers infers a mask for decoder-only models alone): the
    encoder, the cross-attention and every decoding step skip the pad tokens, as fairseq's encoder does. The same
    tokens as with the mask and as each sentence alone, the same forward logits; a source given as inputs_embeds
    decodes as its ids."""
    model = tiny_model(3, eos_bias=1.0)
    inputs = random_sources(31)
    padded = inputs["input_ids"]
    assert (padded == PAD).any()
    with_mask = model.generate(**inputs, max_len_b=6)
    assert torch.equal(model.generate(input_ids=padded, max_len_b=6), with_mask)
    assert torch.equal(model.generate(padded, max_len_b=6, num_beams=1), model.generate(**inputs, max_len_b=6, num_beams=1))
    for row, length in enumerate(inputs["attention_mask"].sum(-1).tolist()):
        alone = model.generate(input_ids=padded[row : row + 1, :length], max_len_b=6)
        assert hypotheses(alone)[0] == hypotheses(with_mask)[row]
    decoder_input_ids = with_mask[:, :4]
    with torch.no_grad():
        masked = model(**inputs, decoder_input_ids=decoder_input_ids).logits
        assert torch.equal(model(input_ids=padded, decoder_input_ids=decoder_input_ids).logits, masked)
        encoded = model.get_encoder()(input_ids=padded).last_hidden_state
        assert torch.equal(encoded, model.get_encoder()(**inputs).last_hidden_state)
    embeds = model.get_input_embeddings()(padded)
    assert torch.equal(model.generate(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], max_len_b=6),
                       with_mask)  # fmt: skip


def test_search_stops_early_when_no_running_beam_can_win():
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(102)
    output = model.generate(**inputs, return_dict_in_generate=True, output_scores=True)
    assert all(tokens[-1] == EOS for tokens in hypotheses(output.sequences))
    assert len(output.scores) < int(inputs["attention_mask"].sum(-1).min()) + 50


def test_num_return_sequences_gives_the_best_k_in_order():
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(3)
    four = model.generate(**inputs, num_return_sequences=4, return_dict_in_generate=True, output_scores=True)
    two = model.generate(**inputs, num_return_sequences=2, return_dict_in_generate=True, output_scores=True)
    best = model.generate(**inputs)
    scores = four.sequences_scores.view(-1, 4)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    assert hypotheses(two.sequences) == [h for i, h in enumerate(hypotheses(four.sequences)) if i % 4 < 2]
    torch.testing.assert_close(two.sequences_scores.view(-1, 2), scores[:, :2])
    assert hypotheses(best) == hypotheses(four.sequences)[::4]
    # Padding is pad_token_id and the batch is cropped to its longest hypothesis.
    assert best.shape[1] == 1 + max(len(tokens) for tokens in hypotheses(best))
    for row, tokens in zip(best.tolist(), hypotheses(best)):
        assert row[1 + len(tokens) :] == [PAD] * (len(row) - 1 - len(tokens))


def test_output_scores_recompose_the_sequence_scores():
    """transformers' compute_transition_scores over `scores` and `beam_indices` gives back log P(Y|X)."""
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(5)
    output = model.generate(
        **inputs, num_return_sequences=3, return_dict_in_generate=True, output_scores=True, output_logits=True
    )
    steps = len(output.scores)
    assert all(step.shape == (4 * 4, VOCAB) for step in output.scores)
    assert len(output.logits) == steps and output.beam_indices.shape[0] == 4 * 3
    transition = model.compute_transition_scores(output.sequences, output.scores, output.beam_indices)
    lengths = (output.beam_indices >= 0).sum(-1)
    log_p = transition.sum(-1)
    expected = log_p / ((5 + lengths.double()) / 6) ** 0.6
    torch.testing.assert_close(output.sequences_scores, expected)


def test_transformers_length_penalty_is_one_setting_away_and_exactly_transformers():
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(9)
    ours = model.generate(**inputs, length_penalty_type="transformers", return_dict_in_generate=True)
    longest = int(inputs["attention_mask"].sum(-1).max())
    builtin = GenerationMixin.generate(model, **inputs, max_length=1 + longest + 50, return_dict_in_generate=True)
    assert torch.equal(ours.sequences, builtin.sequences)
    # Also as a saved setting of the model's generation config.
    model.generation_config.length_penalty_type = "transformers"
    assert torch.equal(model.generate(**inputs), builtin.sequences)


def test_the_two_penalties_rank_differently_somewhere():
    """Sanity check that the setting matters: GNMT and |Y|^alpha disagree on some sentence with alpha = 0.6."""
    differ = False
    for seed in range(6):
        model = tiny_model(seed, eos_bias=1.5)
        inputs = random_sources(seed)
        gnmt_ids = hypotheses(model.generate(**inputs, max_len_b=10))
        hf_ids = hypotheses(model.generate(**inputs, max_len_b=10, length_penalty_type="transformers"))
        differ |= gnmt_ids != hf_ids
    assert differ


# --- the length rule -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_len_a, max_len_b", [(1, 50), (1, 3), (0.5, 2), (0, 4)])
def test_every_sentence_stops_at_its_own_maximum_length(max_len_a, max_len_b):
    """The paper's beam search, greedy search and sampling (two sequences per sentence)."""
    model = tiny_model(0)
    inputs = random_sources(11, lengths=(2, 9, 5))
    source_lengths = inputs["attention_mask"].sum(-1).tolist()
    limits = [int(max_len_a * length + max_len_b) for length in source_lengths]
    for decoding, copies in ((dict(), 1), (dict(num_beams=1), 1), (dict(num_beams=1, do_sample=True), 2)):
        # The eos token is forbidden (and pad, to count lengths), so each sentence runs to its limit.
        sequences = model.generate(
            **inputs, max_len_a=max_len_a, max_len_b=max_len_b, suppress_tokens=[EOS, PAD], num_return_sequences=copies,
            **decoding,
        )  # fmt: skip
        generated = [len(tokens) for tokens in hypotheses(sequences)]
        assert generated == [limit for limit in limits for _ in range(copies)], decoding


def test_the_length_rule_is_computed_in_double_precision_as_fairseq_and_ctranslate2_do():
    """int(1.3 * 90) is 117 in Python's (double) arithmetic, 116 in float32 (1.3 * 90 = 116.99999): fairseq and our
    CTranslate2 engine compute the rule in double, and so must `generate`."""
    model = tiny_model(0)
    inputs = random_sources(12, lengths=(90, 170))
    assert [int(1.3 * n) for n in (90, 170)] == [117, 221]
    assert (torch.tensor([90, 170]) * 1.3).long().tolist() != [117, 221]  # what float32 gives
    for decoding in (dict(), dict(num_beams=1)):
        sequences = model.generate(**inputs, max_len_a=1.3, max_len_b=0, suppress_tokens=[EOS, PAD], **decoding)
        assert [len(tokens) for tokens in hypotheses(sequences)] == [117, 221], decoding


@pytest.mark.parametrize("forced_eos", [False, True])
def test_greedy_search_decodes_each_sentence_of_a_batch_as_alone(forced_eos):
    """num_beams=1 is transformers' greedy search, whose max_length is one for the batch (the longest sentence's
    limit): each sentence stops at its own limit (with `forced_eos_token_id`, ends there with </s>), as alone."""
    model = tiny_model(2)
    inputs = random_sources(102, lengths=(2, 8, 5))
    kwargs = dict(num_beams=1, max_len_b=4, forced_eos_token_id=EOS if forced_eos else None)
    batch = hypotheses(model.generate(**inputs, **kwargs))
    stopped_short = False
    for row, length in enumerate(inputs["attention_mask"].sum(-1).tolist()):
        alone = hypotheses(model.generate(input_ids=inputs["input_ids"][row : row + 1, :length], **kwargs))
        assert batch[row : row + 1] == alone, row
        assert len(alone[0]) <= length + 4 and (alone[0][-1] == EOS or not forced_eos)
        stopped_short |= len(alone[0]) == length + 4 < 8 + 4  # at its limit, short of the batch's longest
    assert stopped_short


@pytest.mark.parametrize("learned", [False, True])
def test_a_decoder_prompt_without_the_start_token_gets_it_and_the_length_rule_counts_it(learned):
    """transformers puts the start token before a decoder prompt that lacks it: every decoding then continues [<s>,
    17, 23] and generates max_len_a * source length + max_len_b tokens after it, as from the prompt with its <s>
    (before, the rule counted a prompt one token short: greedy search and sampling stopped a token early, forced
    </s> a step early, and learned positions ran past their table)."""
    fields = dict(position_encoding="learned", max_position_embeddings=8) if learned else {}
    model = tiny_model(2, eos_bias=-8.0, **fields)  # </s> only where forced
    inputs = random_sources(13, lengths=(4,))
    limit = 8 + 1 - 3 if learned else 4 + 3  # the decoder reads <s> 17 23 and all but the last new token
    for decoding in (dict(), dict(num_beams=1), dict(num_beams=1, forced_eos_token_id=EOS)):
        kwargs = dict(max_len_b=3, **decoding)
        with_start = model.generate(**inputs, decoder_input_ids=torch.tensor([[BOS, 17, 23]]), **kwargs)
        without = model.generate(**inputs, decoder_input_ids=torch.tensor([[17, 23]]), **kwargs)
        assert torch.equal(without, with_start), decoding
        assert without[0, :3].tolist() == [BOS, 17, 23] and without.shape[1] == 3 + limit, decoding
        assert (without[0, -1] == EOS) == ("forced_eos_token_id" in decoding), decoding


def test_the_length_rule_counts_a_source_s_end_where_pad_and_eos_are_one_token():
    """pad_token_id == eos_token_id and no attention_mask: the source's length counts its </s>, as with a mask (before,
    its </s> was taken for padding: one token fewer allowed)."""
    model = helpers.tiny_model(3, vocab_size=VOCAB, pad_token_id=EOS).double()
    source = torch.tensor([[5, 6, 7, EOS]])
    for decoding in (dict(), dict(num_beams=1)):
        kwargs = dict(max_len_a=1, max_len_b=2, suppress_tokens=[EOS], **decoding)
        unmasked = model.generate(input_ids=source, **kwargs)
        assert unmasked.shape[1] == 1 + 1 * 4 + 2, decoding
        assert torch.equal(unmasked, model.generate(input_ids=source, attention_mask=torch.ones_like(source), **kwargs))


class _CTRLPenalty:
    """The repetition penalty of CTRL (Keskar et al., 2019) as a logits processor written here: a token already in
    the row has its score divided by `penalty` where positive, multiplied where negative; a new tensor."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for row in range(scores.shape[0]):
            for token in set(input_ids[row].tolist()):
                value = scores[row, token]
                out[row, token] = value / self.penalty if value > 0 else value * self.penalty
        return out


def test_the_paper_search_takes_transformers_repetition_penalty():
    """transformers' `repetition_penalty` processor returns a view of a wider tensor: the paper's beam search takes it
    (before, it failed: 'view size is not compatible'), with the tokens of the same rule written out."""
    model = tiny_model(4, eos_bias=-2.0)
    inputs = random_sources(21, lengths=(5, 3))
    penalised = model.generate(**inputs, repetition_penalty=3.0, max_len_b=6)
    from transformers import LogitsProcessorList

    written = model.generate(**inputs, logits_processor=LogitsProcessorList([_CTRLPenalty(3.0)]), max_len_b=6)
    assert torch.equal(penalised, written)
    assert not torch.equal(penalised, model.generate(**inputs, max_len_b=6))


def test_learned_positions_cap_the_length_rule_at_the_decoder_positions(caplog):
    """Table 3 row E: source length + 50 may exceed max_position_embeddings; generation stops at the last position,
    with a warning (as the CTranslate2 engine gives; before, without a word)."""
    torch.manual_seed(0)
    config = VaswaniTransformerConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, num_heads=4, d_ff=64, dropout=0.0,
        position_encoding="learned", max_position_embeddings=12,
    )  # fmt: skip
    model = VaswaniTransformerForConditionalGeneration(config).eval()
    inputs = random_sources(11, lengths=(2, 9, 5))
    with caplog.at_level("WARNING", logger="vaswani_transformer.generation"):
        sequences = model.generate(**inputs, suppress_tokens=[EOS, PAD])
    # The decoder reads the start token and 11 generated tokens (12 positions); the 12th generated token is not read.
    assert [len(tokens) for tokens in hypotheses(sequences)] == [12, 12, 12]
    assert "Decoding limited to 12 new tokens by the decoder's 12 learned positions, fewer than the length rule" in \
        caplog.text
    # An explicit longer length fails before decoding, naming what was asked and what fits (not the input)
    for asked, name in ((dict(max_new_tokens=20), "max_new_tokens=20"), (dict(max_length=14), "max_length=14")):
        for decoding in (dict(), dict(num_beams=1)):
            with pytest.raises(ValueError, match=rf"{name} asks for more tokens than the decoder's 12 learned "
                                                 r"positions allow: at most max_new_tokens=12 \(max_length=13\)"):
                model.generate(**inputs, suppress_tokens=[EOS, PAD], **asked, **decoding)
    assert model.generate(**inputs, max_new_tokens=12, suppress_tokens=[EOS, PAD]).shape == (3, 13)


def test_an_explicit_length_overrides_the_rule_and_trainer_kwargs_are_honoured():
    model = tiny_model(0)
    inputs = random_sources(11, lengths=(2, 9, 5))
    assert model.generate(**inputs, max_length=6, suppress_tokens=[EOS]).shape == (3, 6)
    assert model.generate(**inputs, max_new_tokens=4, suppress_tokens=[EOS]).shape == (3, 5)
    # What Seq2SeqTrainer passes: max_length, num_beams, synced_gpus.
    greedy = model.generate(**inputs, max_length=8, num_beams=1, synced_gpus=False)
    assert torch.equal(greedy, GenerationMixin.generate(model, **inputs, max_length=8, num_beams=1))
    # Seq2SeqTrainer(predict_with_generate=True) also passes the labels: generation ignores them, as transformers does.
    labels = torch.randint(4, VOCAB, (3, 7))
    assert torch.equal(model.generate(**inputs, labels=labels), model.generate(**inputs))
    # A max_length set in the model's generation config (Seq2SeqTrainer fills in 20) does not beat the rule...
    model.generation_config.max_length = 20
    assert model.generate(**inputs, suppress_tokens=[EOS]).shape == (3, 1 + 9 + 50)
    # ... nor in that config passed back to generate (as is, or saved and read with GenerationConfig.from_pretrained)
    for passed in (model.generation_config, copy.deepcopy(model.generation_config)):
        assert model.generate(**inputs, generation_config=passed, suppress_tokens=[EOS]).shape == (3, 1 + 9 + 50)
    assert model.generate(**inputs, max_length=20, suppress_tokens=[EOS]).shape == (3, 20)  # as a keyword it counts
    # ... unless the rule is switched off.
    model.generation_config.max_len_b = None
    assert model.generate(**inputs, suppress_tokens=[EOS]).shape == (3, 20)


def test_a_length_set_in_the_model_generation_config_beats_the_rule_and_survives_a_reload(tmp_path):
    """`max_new_tokens` or `max_length` set in the model's own generation config (as a user or a converted checkpoint
    saves it) counts as given, as when passed to `generate`: in the paper's beam search as in greedy decoding, also
    after save_pretrained/from_pretrained; a length rule passed to `generate` beats it. (transformers' default
    max_length, 20, there does not count: the test above.)"""
    inputs = random_sources(100, lengths=(3, 5))
    plain = tiny_model(0)  # its generation config sets no length
    for saved, value in (("max_new_tokens", 4), ("max_length", 6)):
        model = tiny_model(0)
        setattr(model.generation_config, saved, value)
        model.save_pretrained(tmp_path / saved)
        reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / saved, dtype=torch.float64)
        assert getattr(reloaded.generation_config, saved) == value
        for num_beams in (4, 1):
            expected = plain.generate(**inputs, num_beams=num_beams, suppress_tokens=[EOS], **{saved: value})
            assert expected.shape == (2, 5 if saved == "max_new_tokens" else 6)
            for candidate in (model, reloaded):
                assert torch.equal(candidate.generate(**inputs, num_beams=num_beams, suppress_tokens=[EOS]), expected)
                # a length rule passed to generate (`vaswani-translate --max_len_b 7`) beats the saved length
                for rule in (dict(max_len_b=7), dict(max_len_a=0, max_len_b=7)):
                    ruled = candidate.generate(**inputs, num_beams=num_beams, suppress_tokens=[EOS, PAD], **rule)
                    limits = [int(rule.get("max_len_a", 1) * n + 7) for n in (3, 5)]
                    assert [len(tokens) for tokens in hypotheses(ruled)] == limits, (saved, rule)


# --- a transformers citizen: attentions, hidden states, the returned cache, decoder masks, static caches -------------


def test_attentions_and_hidden_states_of_the_chosen_beams_equal_a_forward_pass():
    """Per step, in transformers' beam search layout; the rows named by beam_indices equal teacher forcing."""
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(5)
    batch, beams, layers, heads = 4, 4, 2, 4
    output = model.generate(
        **inputs, max_len_b=6, return_dict_in_generate=True, output_attentions=True, output_hidden_states=True,
        output_scores=True,
    )  # fmt: skip
    steps = len(output.scores)
    assert len(output.cross_attentions) == len(output.decoder_attentions) == len(output.decoder_hidden_states) == steps
    for step in range(steps):
        assert [a.shape for a in output.cross_attentions[step]] == [(batch * beams, heads, 1, 8)] * layers
        assert [a.shape for a in output.decoder_attentions[step]] == [(batch * beams, heads, 1, step + 1)] * layers
        assert [h.shape for h in output.decoder_hidden_states[step]] == [(batch * beams, 1, 32)] * (layers + 1)
    teacher = model(
        **inputs, decoder_input_ids=output.sequences, output_attentions=True, output_hidden_states=True, use_cache=False
    )
    for layer in range(layers):  # one row per sentence, as transformers' beam search returns them
        torch.testing.assert_close(output.encoder_attentions[layer], teacher.encoder_attentions[layer])
    for sentence in range(batch):
        for step, row in enumerate(output.beam_indices[sentence][output.beam_indices[sentence] >= 0].tolist()):
            for layer in range(layers):
                torch.testing.assert_close(
                    output.cross_attentions[step][layer][row, :, -1], teacher.cross_attentions[layer][sentence, :, step]
                )
                torch.testing.assert_close(
                    output.decoder_attentions[step][layer][row, :, -1],
                    teacher.decoder_attentions[layer][sentence, :, step, : step + 1],
                )
            torch.testing.assert_close(
                output.decoder_hidden_states[step][-1][row, -1], teacher.decoder_hidden_states[-1][sentence, step]
            )


@pytest.mark.parametrize("rules", RULES)
def test_the_returned_cache_holds_the_returned_sequences_and_decoding_continues_from_it(rules):
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(5)
    output = model.generate(
        **inputs, max_len_b=6, num_return_sequences=2, beam_search_rules=rules, return_dict_in_generate=True
    )
    assert output.cache.get_seq_length() == output.sequences.shape[1] - 1
    repeated = {name: value.repeat_interleave(2, dim=0) for name, value in inputs.items()}
    following = torch.randint(4, VOCAB, (output.sequences.shape[0], 3), generator=torch.Generator().manual_seed(0))
    continued = model(
        **repeated, decoder_input_ids=torch.cat([output.sequences[:, -1:], following], dim=-1), cache=output.cache
    )
    full = model(**repeated, decoder_input_ids=torch.cat([output.sequences, following], dim=-1), use_cache=False)
    torch.testing.assert_close(continued.logits, full.logits[:, -4:])
    assert output.cache.get_seq_length() == output.sequences.shape[1] + 3
    # No cache without use_cache, and none unless return_dict_in_generate.
    assert model.generate(**inputs, max_len_b=6, use_cache=False, return_dict_in_generate=True).cache is None


@pytest.mark.parametrize("rules", RULES)
def test_a_left_padded_decoder_prompt_uses_its_attention_mask(rules):
    """Batched prompts of different lengths, left-padded: each equals the reference run with its own padded prompt.

    (Each real token has the position it has alone: `test_a_left_padded_decoder_prompt_decodes_as_the_prompt_alone`.)
    """
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(13, lengths=(4, 6))
    prompts = torch.tensor([[BOS, 17, 23], [PAD, BOS, 30]])
    prompt_mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    output = model.generate(
        **inputs, decoder_input_ids=prompts, decoder_attention_mask=prompt_mask, max_len_b=4, beam_search_rules=rules,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    width = output.sequences.shape[1]
    for row, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"])):
        source, prompt, decoder_mask = ids[mask.bool()], prompts[row].tolist(), prompt_mask[row].tolist()
        expected, _ = reference(rules, model, source, 0.6, len(source) + 4, prompt=prompt, decoder_mask=decoder_mask)
        (score, tokens), = expected
        assert output.sequences[row].tolist() == prompt[:1] + tokens + [PAD] * (width - 1 - len(tokens)), row
        torch.testing.assert_close(output.sequences_scores[row].item(), score)
    # The mask is used: without it the padded prompt scores differently.
    unmasked = model.generate(
        **inputs, decoder_input_ids=prompts, max_len_b=4, beam_search_rules=rules, return_dict_in_generate=True,
        output_scores=True,
    )  # fmt: skip
    assert abs(unmasked.sequences_scores[1] - output.sequences_scores[1]) > 1e-3


@pytest.mark.parametrize("decoding", ["greedy", "greedy-static", "greedy-compiled", "t2t", "fairseq", "t2t-static"])
def test_a_left_padded_decoder_prompt_decodes_as_the_prompt_alone(decoding):
    """A batch of left-padded decoder prompts (with decoder_attention_mask) gives each sentence the tokens and logits
    (greedy) or scores (beam) of its prompt alone, unpadded: the padding is not counted as positions, in the cached
    steps too, also where transformers turns the mask into a 4-D one (static cache, compiled step)."""
    from transformers import CompileConfig

    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(13, lengths=(4, 6, 3))
    prompts = [[BOS, 17, 23, 9], [BOS, 30], [BOS]]
    width = max(map(len, prompts))
    prompt_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    mode, _, cache = decoding.partition("-")
    kwargs = dict(return_dict_in_generate=True, output_scores=True)
    if mode == "greedy":
        kwargs.update(num_beams=1, do_sample=False, max_new_tokens=5, output_logits=True)
    else:
        kwargs.update(beam_search_rules=mode, max_len_b=4)
    if cache:
        kwargs.update(cache_implementation="static")
    compiled = {}
    if cache == "compiled":  # the batch only: the sentences alone run the same steps uncompiled
        compiled["compile_config"] = CompileConfig(fullgraph=True, backend="eager")
        compiled["compile_config"]._compile_all_devices = True  # transformers compiles only on accelerators otherwise
    batch = model.generate(
        **inputs, decoder_input_ids=prompt_ids, decoder_attention_mask=prompt_mask, **kwargs, **compiled
    )
    for row, prompt in enumerate(prompts):
        source = inputs["input_ids"][row][inputs["attention_mask"][row].bool()]
        alone = model.generate(input_ids=source[None], decoder_input_ids=torch.tensor([prompt]), **kwargs)
        tokens = batch.sequences[row, width - len(prompt) :].tolist()
        tokens = tokens[: alone.sequences.shape[1]]
        assert tokens == alone.sequences[0].tolist(), row
        if mode == "greedy":
            steps = len(alone.logits)  # alone, a sentence stops at its </s>; in the batch it waits for the others
            torch.testing.assert_close(torch.stack(batch.logits[:steps])[:, row], torch.stack(alone.logits)[:, 0])
        else:
            torch.testing.assert_close(batch.sequences_scores[row], alone.sequences_scores[0])


def test_a_static_cache_and_a_compiled_forward_give_the_same_tokens():
    from transformers import CompileConfig

    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(4)
    expected = model.generate(**inputs, max_len_b=6, return_dict_in_generate=True, output_scores=True)
    static = model.generate(
        **inputs, max_len_b=6, cache_implementation="static", return_dict_in_generate=True, output_scores=True
    )
    assert torch.equal(static.sequences, expected.sequences)
    torch.testing.assert_close(static.sequences_scores, expected.sequences_scores)
    # transformers compiles the decoding steps with a static cache (on a CPU only when asked to).
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True
    compiled = model.generate(**inputs, max_len_b=6, cache_implementation="static", compile_config=compile_config)
    assert hasattr(model, "_compiled_call")
    assert torch.equal(compiled, expected.sequences)


def test_suppress_tokens_gives_the_tokens_and_scores_of_transformers_suppress_processor():
    # The search writes -inf into the suppressed columns itself when `SuppressTokensLogitsProcessor`s are the only
    # processors; with another (identity) processor beside it transformers' processor runs.
    from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor, TemperatureLogitsWarper

    model = tiny_model(2, eos_bias=0.5)
    inputs = random_sources(3)
    plain = model.generate(**inputs, max_len_b=6)
    picked = plain[:, 1:][plain[:, 1:] > EOS].unique()[:3]  # tokens the search picks unless suppressed
    ids = [*picked.tolist(), VOCAB + 3, -1]  # ids outside the vocabulary suppress nothing
    kwargs = dict(max_len_b=6, return_dict_in_generate=True, output_scores=True)
    ours = model.generate(**inputs, suppress_tokens=ids, **kwargs)
    processors = LogitsProcessorList([SuppressTokensLogitsProcessor(ids), TemperatureLogitsWarper(1.0)])
    transformers_ = model.generate(**inputs, logits_processor=processors, **kwargs)
    assert len(picked) == 3 and not torch.isin(ours.sequences, picked).any()
    assert torch.equal(ours.sequences, transformers_.sequences)
    assert torch.equal(ours.sequences_scores, transformers_.sequences_scores)
    assert len(ours.scores) == len(transformers_.scores)
    assert all(torch.equal(a, b) for a, b in zip(ours.scores, transformers_.scores))


def test_beam_reordering_keeps_a_static_cache_s_tensors_where_they_are():
    # transformers' reorder_cache put new tensors in the static layers' place every step: on a GPU the compiled step's
    # CUDA graphs, which replay on the static addresses, were skipped ("mutated inputs").
    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(4)
    expected = model.generate(**inputs, max_len_b=6)
    addresses = []

    def record(module, args, kwargs):
        layers = kwargs["cache"].self_attention_cache.layers
        if all(layer.is_initialized for layer in layers):
            addresses.append([(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in layers])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        static = model.generate(**inputs, max_len_b=6, cache_implementation="static")
    finally:
        handle.remove()
    assert torch.equal(static, expected)
    assert len(addresses) >= 5 and all(step == addresses[0] for step in addresses)


def test_a_compiled_decoding_step_is_compiled_once():
    # The step's decoder input was a slice of the growing sequences, whose row stride changed every step: each step
    # recompiled the decoder (and with fullgraph=True failed at torch's recompile limit of 8).
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = tiny_model(1)
    inputs = random_sources(2)
    expected = model.generate(**inputs, max_new_tokens=12, suppress_tokens=[2])
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    compiled = model.generate(**inputs, max_new_tokens=12, suppress_tokens=[2], cache_implementation="static",
                              compile_config=compile_config)  # fmt: skip
    assert torch.equal(compiled, expected)
    assert counters["stats"]["unique_graphs"] == 1  # 11 one-token steps after the uncompiled first one: one graph


def _compiled_with_the_search(model, inputs, backend: str, **kwargs):
    """`generate` with a static cache and a compiled step (the search in its graph); the graphs torch made for it."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    compile_config = CompileConfig(fullgraph=True, backend=backend)
    compile_config._compile_all_devices = True  # transformers compiles only on accelerators otherwise
    torch._dynamo.reset()
    counters.clear()
    output = model.generate(**inputs, **kwargs, cache_implementation="static", compile_config=compile_config)
    return output, counters["stats"]["unique_graphs"]


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_len_b=6),  # t2t, natural lengths, each sentence's own limit (max_len_a * source length + 6)
        dict(max_len_b=6, beam_search_rules="fairseq"),
        dict(max_len_b=6, num_return_sequences=2),
        dict(max_new_tokens=7, suppress_tokens=[EOS]),  # every hypothesis cut at the limit
        dict(max_len_b=6, length_penalty=0.0, num_beams=3),
    ],
)
def test_a_compiled_step_with_the_search_in_its_graph_gives_the_eager_search_s_tokens(settings):
    # With a static cache and a compiled step on a CPU, the search's update runs in the step's graph: branch-free
    # (every sentence merges its finished set every step; t2t's fill at the limit every step) on fixed-width
    # sequences. torch's "eager" backend runs the traced graph as traced, so this checks those rewritten steps.
    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    expected = model.generate(**inputs, **settings)
    compiled, graphs = _compiled_with_the_search(model, inputs, "eager", **settings)
    assert "_compiled_decode_and_update" in model.__dict__
    assert graphs == 1  # the steps after the uncompiled first one: one graph of the decoder and the search
    assert torch.equal(compiled, expected)


def test_the_search_in_a_compiled_step_follows_new_batch_shapes():
    # transformers' default CompileConfig (dynamic=None): a second batch shape recompiles with symbolic sizes, which
    # the search's fixed-width buffers and branch-free steps must trace as well.
    from transformers import CompileConfig

    model = tiny_model(3, eos_bias=1.5)
    compile_config = CompileConfig(backend="eager")
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    for seed, lengths in enumerate([(5, 2, 8, 4), (7,), (3, 9, 4), (6, 6)]):
        inputs = random_sources(seed, lengths=lengths)
        expected = model.generate(**inputs, max_len_b=6)
        compiled = model.generate(**inputs, max_len_b=6, cache_implementation="static", compile_config=compile_config)
        assert torch.equal(compiled, expected), lengths
    assert "_compiled_decode_and_update" in model.__dict__


def test_the_search_in_a_compiled_step_steps_aside_at_torch_s_recompile_limit():
    # Every model and every setting of the search (beams, rules, lengths, batch shapes) compile one function, whose
    # graphs count against torch's recompile limit (8 per function): past it, with fullgraph=True, generate failed.
    # It now goes on with the compiled step alone, the search outside its graph (here, the limit lowered to 1).
    from transformers import CompileConfig

    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        for settings in (dict(max_len_b=6), dict(max_len_b=6, num_beams=3), dict(max_len_b=6, num_beams=3)):
            expected = model.generate(**inputs, **settings)
            compiled = model.generate(**inputs, **settings, cache_implementation="static",
                                      compile_config=compile_config)  # fmt: skip
            assert torch.equal(compiled, expected), settings


def test_the_search_in_a_compiled_step_leaves_a_done_sentence_s_finished_places_in_their_order():
    # t2t at a sentence's limit: its running beams take the finished places left empty, after the finished ones (so a
    # sentence with a finished hypothesis returns it, as t2t does), whatever their penalised scores. The branch-free
    # merge of the next step re-sorted that done sentence's places: with a large length penalty, which favours the
    # longer beams, a beam cut at the limit came first instead of the sentence's one finished hypothesis.
    model = tiny_model(3, eos_bias=0.8)
    inputs = random_sources(5)
    settings = dict(max_len_b=6, length_penalty=3.5)
    expected = model.generate(**inputs, **settings)
    assert expected[1, 1] == EOS  # (the second sentence's one finished hypothesis: </s> first)
    compiled, graphs = _compiled_with_the_search(model, inputs, "eager", **settings)
    assert graphs == 1
    assert torch.equal(compiled, expected)


def test_a_search_runs_its_compiled_graph_without_dynamo_s_guard_check_once_two_steps_passed_it():
    # dynamo checks its guards (the model, the cache, the search's state) at every call of a compiled function: a
    # tenth of a batch-1 step on a CPU. A search's steps now look the graph up themselves (through dynamo where none
    # passes, to compile one), and once two steps in a row passed the same graph's guards, the later ones run it
    # unchecked: one call through dynamo per search here, not one per step, and the same tokens. Under a compiler
    # stance (here "force_eager") every step goes through dynamo.
    from transformers import CompileConfig

    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    settings = dict(max_new_tokens=10, suppress_tokens=[EOS])  # (9 compiled steps after the uncompiled first)
    expected = model.generate(**inputs, **settings)
    _compiled_with_the_search(model, inputs, "eager", **settings)
    key, compiled, backend = model.__dict__["_compiled_decode_and_update"]
    calls = []

    def through_dynamo(*args):
        calls.append(args)
        return compiled(*args)

    model.__dict__["_compiled_decode_and_update"] = (key, through_dynamo, backend)
    output, graphs = _compiled_with_the_search(model, inputs, "eager", **settings)
    assert torch.equal(output, expected) and graphs == 1
    assert len(calls) == 1
    calls.clear()
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True
    with torch.compiler.set_stance("force_eager"):  # (the graph compiled above is still there)
        output = model.generate(**inputs, **settings, cache_implementation="static", compile_config=compile_config)
    assert torch.equal(output, expected)
    assert len(calls) == 9


def test_a_model_with_forward_hooks_has_every_compiled_step_checked():
    """A forward hook's Python state can change what dynamo's guards decide between steps: here a float counter
    (symbolic under the "eager" backend, so one graph passed the first steps) makes </s> likeliest from the 6th
    decoder call on. Unchecked after two steps, the graph kept running the branch it was traced with and decoded
    to the limit; with hooks every step is checked, and the tokens are the eager search's."""
    model = tiny_model(0, eos_bias=-1.0)
    inputs = random_sources(5)
    calls = {"t": 0.0}

    def from_the_sixth_call(module, inputs, output):
        calls["t"] += 1.0
        return output + 100.0 * (torch.arange(output.shape[-1]) == EOS) if calls["t"] >= 6.0 else output

    model.lm_head.register_forward_hook(from_the_sixth_call)
    expected = model.generate(**inputs, max_len_b=12)
    assert calls["t"] == 6.0 and (expected[:, 1:] == EOS).any(dim=1).all()  # every sentence ends at the 6th step
    calls["t"] = 0.0
    output, _ = _compiled_with_the_search(model, inputs, "eager", max_len_b=12)
    assert torch.equal(output, expected) and calls["t"] == 6.0


def test_a_search_runs_the_graph_of_its_own_compile_config_not_one_another_config_compiled():
    # The search's own lookup of its graph (above) matched guards only, so a second compile config in the same process
    # (another backend, mode or options: e.g. "aot_eager" to check inductor's graph) ran the first one's graph and
    # never compiled its own. Dynamo keeps one cache entry per backend; the lookup now takes only its own backend's.
    from transformers import CompileConfig

    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    settings = dict(max_new_tokens=10, suppress_tokens=[EOS])  # (9 compiled steps after the uncompiled first)
    expected = model.generate(**inputs, **settings)
    compiled, ran = {"first": 0, "second": 0}, {"first": 0, "second": 0}

    def counting_backend(name):
        def backend(graph_module, example_inputs, **options):
            compiled[name] += 1

            def run(*args):
                ran[name] += 1
                return graph_module.forward(*args)

            return run

        return backend

    configs = {name: CompileConfig(fullgraph=True, backend=counting_backend(name), mode=None) for name in ran}
    torch._dynamo.reset()
    for name in ("first", "second", "first"):
        configs[name]._compile_all_devices = True
        output = model.generate(**inputs, **settings, cache_implementation="static", compile_config=configs[name])
        assert torch.equal(output, expected)
    assert compiled == {"first": 1, "second": 1}
    assert ran == {"first": 2 * 9, "second": 9}


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor needs a C++ compiler")
def test_the_search_compiled_by_inductor_gives_the_eager_search_s_tokens():
    # Inductor's own kernels, at the beam search benchmark's size (the Multi30k recipe's model, random weights), one
    # sentence, 24 tokens. With the static cache's reordering inside the same graph, after the step had written the
    # cache, this gave other tokens from the fifth step on (torch 2.13's inductor gathered the cache's rows in place,
    # reading rows it had already overwritten): the reordering stays outside.
    torch.manual_seed(0)
    size = dict(d_model=256, encoder_layers=3, decoder_layers=3, num_heads=4, d_ff=1024)
    model = VaswaniTransformerForConditionalGeneration(
        VaswaniTransformerConfig(vocab_size=8000, dropout=0.0, **size)
    ).eval()
    generator = torch.Generator().manual_seed(0)
    length = int(torch.randint(15, 26, (1,), generator=generator))  # (the benchmark's first source)
    source = torch.cat([torch.randint(4, 8000, (1, length - 1), generator=generator), torch.tensor([[EOS]])], 1)
    inputs = {"input_ids": source, "attention_mask": torch.ones_like(source)}
    settings = dict(max_new_tokens=24, suppress_tokens=[EOS])
    expected = model.generate(**inputs, **settings)
    compiled, graphs = _compiled_with_the_search(model, inputs, "inductor", **settings)
    assert graphs == 1
    assert torch.equal(compiled, expected)


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor needs a C++ compiler")
def test_the_search_compiled_by_inductor_merges_finished_hypotheses_as_the_eager_search_does():
    # The test above never finishes a hypothesis before the limit. Here </s> is likelier, so four sentences finish
    # at different steps and their finished sets merge with new ones every step: gathers from tensors the graph also
    # writes, the pattern torch 2.13's inductor compiled wrongly for the static cache (README, "The cause").
    model = tiny_model(3, eos_bias=0.8)
    inputs = random_sources(5)
    settings = dict(max_len_b=6, num_return_sequences=2)
    expected = model.generate(**inputs, **settings)
    ended = (expected == EOS).any(dim=1)
    assert len(set((expected != PAD).sum(dim=1)[ended].tolist())) >= 3  # (finished at three different steps)
    compiled, graphs = _compiled_with_the_search(model, inputs, "inductor", **settings)
    assert graphs == 1
    assert torch.equal(compiled, expected)


def test_a_model_that_decoded_with_a_compiled_step_pickles_and_decodes_the_same(tmp_path):
    # generate keeps its compiled calls on the model (transformers' `_compiled_call`, our `_compiled_decode_and_update`)
    # and torch.compile's wrappers cannot be pickled: `torch.save(model)` failed after any compiled decoding.
    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    expected, _ = _compiled_with_the_search(model, inputs, "eager", max_len_b=6)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(loaded.generate(**inputs, max_len_b=6), expected)
    assert torch.equal(_compiled_with_the_search(loaded, inputs, "eager", max_len_b=6)[0], expected)


def test_a_compiled_step_keeps_the_search_out_of_its_graph_where_steps_differ():
    # Per-step outputs (here scores) are recorded outside: the step alone is compiled, the search runs as always.
    model = tiny_model(3, eos_bias=1.5)
    inputs = random_sources(5)
    kwargs = dict(max_len_b=6, return_dict_in_generate=True, output_scores=True)
    expected = model.generate(**inputs, **kwargs)
    compiled, graphs = _compiled_with_the_search(model, inputs, "eager", **kwargs)
    assert "_compiled_decode_and_update" not in model.__dict__ and graphs == 1
    assert torch.equal(compiled.sequences, expected.sequences)
    assert len(compiled.scores) == len(expected.scores)
    for step, expected_scores in zip(compiled.scores, expected.scores):  # (the static cache's step: not to the bit)
        torch.testing.assert_close(step, expected_scores)


def test_synced_gpus_gives_the_same_result(tmp_path):
    import torch.distributed as dist

    model = tiny_model(1, eos_bias=1.5)
    inputs = random_sources(4)
    expected = model.generate(**inputs, max_len_b=8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert torch.equal(model.generate(**inputs, max_len_b=8, synced_gpus=True), expected)
    finally:
        dist.destroy_process_group()


def test_synced_gpus_keeps_a_finished_process_stepping_past_its_own_length(tmp_path):
    # Two processes (gloo): the first one's sentences stop after 3 tokens, the second's after 9, so the first keeps
    # stepping along, repeating its last token, 6 steps past the width of its own search. Each returns what it
    # returns alone.
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        import torch.distributed as dist
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_generation import random_sources, tiny_model

        rank = int(sys.argv[1])
        model = tiny_model(1)
        inputs = random_sources(rank, lengths=(3, 5) if rank == 0 else (6, 4))
        settings = dict(max_len_a=0, max_len_b=3 if rank == 0 else 9, suppress_tokens=[2])
        alone = model.generate(**inputs, **settings)
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'rendezvous'}", rank=rank, world_size=2)
        try:
            synced = model.generate(**inputs, **settings, synced_gpus=True)
        finally:
            dist.destroy_process_group()
        assert alone.shape[1] == (4 if rank == 0 else 10), alone.shape
        assert torch.equal(synced, alone), (synced, alone)
    """))
    processes = [
        subprocess.Popen([sys.executable, str(script), str(rank)], stderr=subprocess.PIPE, text=True) for rank in (0, 1)
    ]
    errors = [process.communicate(timeout=300)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"length_penalty_type": "wu"}, "length_penalty_type"),
        ({"max_len_a": -1}, "max_len_a"),
        ({"max_len_b": "50"}, "max_len_b"),
        ({"max_len_a": 0, "max_len_b": 0}, "at least one generated token"),
        ({"beam_search_rules": "marian"}, "beam_search_rules"),
        ({"num_return_sequences": 5}, "num_return_sequences"),
        ({"streamer": object()}, "streamer"),
        ({"num_beams": 0}, "num_beams"),
        ({"num_beams": -2}, "num_beams"),
        ({"num_beams": 0, "length_penalty_type": "transformers"}, "num_beams"),
        # NaN and infinite values: NaN scores rank beams arbitrarily, without a word (2026-11-29)
        ({"length_penalty": float("nan")}, "`length_penalty` must be a finite number, got nan"),
        ({"length_penalty": float("inf"), "length_penalty_type": "transformers"},
         "`length_penalty` must be a finite number, got inf"),
        ({"max_len_a": float("nan")}, "`max_len_a` must be a non-negative finite number"),
        ({"max_len_b": float("inf")}, "`max_len_b` must be a non-negative finite number"),
    ],
)
def test_bad_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model().generate(**random_sources(0), **kwargs)


def test_vaswani_translate_refuses_num_beams_0_with_an_error_line(tmp_path, capsys):
    from vaswani_transformer.translate import main

    helpers.save_tiny_model(tmp_path / "model")
    (tmp_path / "in.txt").write_text("the cat sat\n")
    argv = ["--model_name_or_path", str(tmp_path / "model"), "--input", str(tmp_path / "in.txt"), "--no_progress"]
    assert main([*argv, "--num_beams", "0"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: `num_beams` must be a positive integer (1 for greedy decoding), got 0."
    )


# --- remote code -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_remote_code_generate_in_a_process_without_the_package(tmp_path, python_without_package):
    model = tiny_model(1, eos_bias=1.5).float()
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    folder = tmp_path / "copy"
    shutil.copytree(saved, folder)
    assert (folder / "generation.py").exists()
    inputs = random_sources(6)
    torch.save(inputs, tmp_path / "inputs.pt")
    python_without_package(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        assert model.generation_config.length_penalty_type == "gnmt"
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        torch.save(model.generate(**inputs), {str(tmp_path / "ids.pt")!r})
        """,
        cwd=tmp_path,
    )
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(saved)
    expected = reloaded.generate(**inputs)
    assert torch.equal(torch.load(tmp_path / "ids.pt"), expected)
    assert torch.equal(model.generate(**inputs), expected)
