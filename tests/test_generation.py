"""The paper's decoding (beam 4, GNMT length penalty 0.6, source length + 50) against an independent reference."""

import json
import math
import shutil

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, GenerationConfig, GenerationMixin
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.generation import PAPER_GENERATION_DEFAULTS

PAD, BOS, EOS = 0, 1, 2
VOCAB = 40


def tiny_model(seed: int = 0, eos_bias: float = 0.0) -> VaswaniTransformerForConditionalGeneration:
    """A random float64 model; `eos_bias` > 0 makes </s> likelier (hypotheses then end at various steps).

    The bias is the last decoder LayerNorm's bias, pointed along the (tied) </s> output embedding.
    """
    torch.manual_seed(seed)
    config = VaswaniTransformerConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=64, dropout=0.0
    )
    model = VaswaniTransformerForConditionalGeneration(config).double().eval()
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


@torch.no_grad()
def reference_beam_search(model, source, num_beams: int, alpha: float, max_new_tokens: int, prompt=(BOS,)):
    """Plain beam search for one unpadded sentence: full forward each step, no cache, Python lists.

    Same definitions as `paper_beam_search`: each step the 2 * num_beams best continuations (by log P) are taken;
    those among the first num_beams that end with </s> or reach max_new_tokens are finished with score
    log P / ((5 + |Y|) / 6) ** alpha, |Y| = generated tokens including </s>; the best num_beams others continue.
    Runs to the maximum length (no early stop). Returns [(score, tokens after <s>)] best first. A decoder `prompt`
    is forced (not scored, not counted in |Y|).
    """
    alive = [(0.0, list(prompt))]
    finished = []
    for step in range(1, max_new_tokens + 1):
        decoder_input_ids = torch.tensor([tokens for _, tokens in alive])
        logits = model(
            input_ids=source[None].expand(len(alive), -1), decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits[:, -1]
        log_probs = torch.log_softmax(logits.double(), dim=-1).tolist()
        candidates = [
            (score + log_probs[beam][token], tokens + [token])
            for beam, (score, tokens) in enumerate(alive)
            for token in range(VOCAB)
        ]
        candidates.sort(key=lambda candidate: -candidate[0])
        alive = []
        for rank, (score, tokens) in enumerate(candidates[: 2 * num_beams]):
            if tokens[-1] == EOS or step == max_new_tokens:
                if rank < num_beams:
                    finished.append((score / gnmt(step, alpha), tokens[1:]))
            elif len(alive) < num_beams:
                alive.append((score, tokens))
        if not alive:
            break
    finished.sort(key=lambda hypothesis: -hypothesis[0])
    return finished[:num_beams]


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


# --- against the reference -------------------------------------------------------------------------------------------

# (seed, eos_bias, alpha, max_len_b)
REFERENCE_CASES = [(0, 0.0, 0.6, 6), (2, 1.5, 0.6, 6), (4, 1.25, 0.6, 10)]


@pytest.mark.parametrize(
    "seed, eos_bias, alpha, max_len_b", REFERENCE_CASES + [(5, 1.25, 1.5, 6), (1, 1.75, -0.5, 6), (3, 0.0, 0.6, 50)]
)
def test_matches_an_independent_reference_beam_search(seed, eos_bias, alpha, max_len_b):
    model = tiny_model(seed, eos_bias)
    inputs = random_sources(seed + 100)
    output = model.generate(
        **inputs,
        length_penalty=alpha,
        max_len_b=max_len_b,
        num_return_sequences=4,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert isinstance(output, GenerateBeamEncoderDecoderOutput)
    width = output.sequences.shape[1]
    longest = 0
    for sentence, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"])):
        source = ids[mask.bool()]
        expected = reference_beam_search(model, source, 4, alpha, max_new_tokens=len(source) + max_len_b)
        longest = max([longest] + [len(tokens) for _, tokens in expected])
        assert torch.equal(
            output.sequences[4 * sentence : 4 * sentence + 4], padded([tokens for _, tokens in expected], width)
        )
        torch.testing.assert_close(
            output.sequences_scores[4 * sentence : 4 * sentence + 4],
            torch.tensor([score for score, _ in expected], dtype=torch.float64),
        )
    assert width == 1 + longest
    # One hypothesis per sentence stops earlier (when nothing can beat the best) and is still the reference's best.
    best = model.generate(**inputs, length_penalty=alpha, max_len_b=max_len_b, return_dict_in_generate=True)
    assert torch.equal(best.sequences, output.sequences[::4, : best.sequences.shape[1]])
    assert (output.sequences[::4, best.sequences.shape[1] :] == PAD).all()


def test_a_decoder_prompt_is_continued_and_not_counted():
    model = tiny_model(2, eos_bias=1.5)
    inputs = random_sources(13, lengths=(4,))
    prompt = torch.tensor([[BOS, 17, 23]])
    output = model.generate(
        **inputs, decoder_input_ids=prompt, max_len_b=5, num_return_sequences=4, return_dict_in_generate=True,
        output_scores=True,
    )  # fmt: skip
    expected = reference_beam_search(model, inputs["input_ids"][0], 4, 0.6, max_new_tokens=4 + 5, prompt=[BOS, 17, 23])
    assert torch.equal(output.sequences, padded([tokens for _, tokens in expected], output.sequences.shape[1]))
    expected_scores = torch.tensor([score for score, _ in expected], dtype=torch.float64)
    torch.testing.assert_close(output.sequences_scores, expected_scores)


def test_reference_cases_include_early_ends_and_the_length_limit():
    """The cases above have best hypotheses ending with </s> mid-way, and others cut at the maximum length."""
    kinds = set()
    for seed, eos_bias, _, max_len_b in REFERENCE_CASES:
        inputs = random_sources(seed + 100)
        sequences = tiny_model(seed, eos_bias).generate(**inputs, max_len_b=max_len_b)
        for tokens, limit in zip(hypotheses(sequences), inputs["attention_mask"].sum(-1).tolist()):
            if tokens[-1] != EOS:
                kinds.add("cut at the limit" if len(tokens) == limit + max_len_b else "?")
            else:
                kinds.add("</s> mid-way" if 1 < len(tokens) < limit + max_len_b else "</s> at an end")
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
    model = tiny_model(0)
    inputs = random_sources(11, lengths=(2, 9, 5))
    # The eos token is forbidden (and pad, to count lengths), so each sentence runs to its limit.
    sequences = model.generate(**inputs, max_len_a=max_len_a, max_len_b=max_len_b, suppress_tokens=[EOS, PAD])
    source_lengths = inputs["attention_mask"].sum(-1).tolist()
    generated = [len(tokens) for tokens in hypotheses(sequences)]
    assert generated == [int(max_len_a * length + max_len_b) for length in source_lengths]


def test_learned_positions_cap_the_length_rule_at_the_decoder_positions():
    """Table 3 row E: source length + 50 may exceed max_position_embeddings; generation stops at the last position."""
    torch.manual_seed(0)
    config = VaswaniTransformerConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, num_heads=4, d_ff=64, dropout=0.0,
        position_encoding="learned", max_position_embeddings=12,
    )  # fmt: skip
    model = VaswaniTransformerForConditionalGeneration(config).eval()
    inputs = random_sources(11, lengths=(2, 9, 5))
    sequences = model.generate(**inputs, suppress_tokens=[EOS, PAD])
    # The decoder reads the start token and 11 generated tokens (12 positions); the 12th generated token is not read.
    assert [len(tokens) for tokens in hypotheses(sequences)] == [12, 12, 12]
    with pytest.raises(ValueError, match="learned positions"):  # an explicit longer length still fails clearly
        model.generate(**inputs, max_new_tokens=20, suppress_tokens=[EOS, PAD])


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
    # ... unless the rule is switched off.
    model.generation_config.max_len_b = None
    assert model.generate(**inputs, suppress_tokens=[EOS]).shape == (3, 20)


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


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"length_penalty_type": "wu"}, "length_penalty_type"),
        ({"max_len_a": -1}, "max_len_a"),
        ({"max_len_b": "50"}, "max_len_b"),
        ({"max_len_a": 0, "max_len_b": 0}, "at least one generated token"),
        ({"output_attentions": True, "return_dict_in_generate": True}, "length_penalty_type='transformers'"),
        ({"num_return_sequences": 5}, "num_return_sequences"),
        ({"streamer": object()}, "streamer"),
    ],
)
def test_bad_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model().generate(**random_sources(0), **kwargs)


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
