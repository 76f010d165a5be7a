"""Training cost (vaswani_transformer.flops): a hand count, the model's own layers, the paper's Table 2, a run."""

import json
import subprocess
import sys

import pytest
import torch

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.flops import (
    PAPER_REPORTED_FLOPS,
    main,
    model_flops_per_target_token,
    measure_matmul_peak,
    model_flops_utilization,
    paper_estimate,
    required_utilization,
    training_flops,
    training_hours,
)
from test_training import run_script, tiny_args, write_fixture


def tiny_config(**overrides):
    """d_k != d_v and 2+1 layers, so that swapped dimensions or layer counts change the count."""
    values = dict(vocab_size=11, d_model=8, d_ff=16, num_heads=2, d_k=3, d_v=5, encoder_layers=2, decoder_layers=1)
    return VaswaniTransformerConfig(**{**values, **overrides})


def test_per_token_flops_equal_a_hand_count_term_by_term():
    # d_model 8, d_ff 16, h 2, d_k 3, d_v 5, vocabulary 11; source 3 tokens, target 4. Counted in multiply-adds.
    S, T = 3, 4
    # Encoder, per layer and source token: Q 8x6, K 8x6, V 8x10, output 10x8; scores 3 keys x 2 heads x 3,
    # weighted sums 3 x 2 x 5; FFN 8x16 + 16x8.
    enc_token = (48 + 48 + 80 + 80) + (18 + 30) + (128 + 128)
    assert enc_token == 560
    encoder = 2 * S * enc_token  # 2 layers
    # Decoder self-attention: projections as above; position i (1-based) sees i keys under the causal mask.
    self_projections = 48 + 48 + 80 + 80
    self_attention_all = sum(i * 2 * (3 + 5) for i in range(1, T + 1))  # scores + sums over all target positions
    # Encoder-decoder attention: Q 8x6 and output 10x8 per target token, 3 source keys each;
    # K 8x6 and V 8x10 of every encoder output (per source token).
    cross_query = 48 + 80 + S * 2 * (3 + 5)
    cross_memory = S * (48 + 80)
    ffn = 128 + 128
    decoder = T * (self_projections + cross_query + ffn) + self_attention_all + cross_memory  # 1 layer
    output_layer = T * 8 * 11
    multiply_adds = encoder + decoder + output_layer
    assert multiply_adds == 3360 + 2912 + 384 + 352
    expected = 3 * 2 * multiply_adds / T  # 2 FLOPs a multiply-add; forward + backward = 3 forwards
    assert model_flops_per_target_token(tiny_config(), S, T) == pytest.approx(expected, rel=1e-12)
    assert training_flops(tiny_config(), 1000, S, T) == pytest.approx(1000 * expected, rel=1e-12)


def test_weight_terms_equal_the_linear_layers_of_a_real_model():
    """With one-token sentences (no attention cost beyond one key), forward FLOPs per target token are 2 x every
    linear weight of the instantiated model (tied output layer included) plus the one-key attention terms."""
    config = tiny_config(encoder_layers=2, decoder_layers=3)
    model = VaswaniTransformerForConditionalGeneration(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    one_key = 2 * (3 + 5)  # scores + sums of both heads over one key
    attention = (config.encoder_layers + 2 * config.decoder_layers) * one_key
    assert model_flops_per_target_token(config, 1, 1) == pytest.approx(3 * 2 * (linear + attention), rel=1e-12)


@pytest.mark.parametrize("preset", ["base", "big"])
def test_paper_runs_are_within_table_2s_order_of_magnitude(preset):
    estimate = paper_estimate(preset)
    # ~6 x parameters per token (Kaplan et al.): 63M / 213M parameters, plus small attention terms.
    parameters = {"base": 63e6, "big": 213e6}[preset]
    assert 6 * parameters * 0.9 < estimate.flops_per_target_token < 6 * parameters * 1.2
    assert estimate.target_tokens == {"base": 1e5, "big": 3e5}[preset] * 25_000
    paper = PAPER_REPORTED_FLOPS[preset]
    assert paper == {"base": 3.3e18, "big": 2.3e19}[preset]
    # Table 2 is time x GPUs x peak rate (footnote 5): model FLOPs lie below it, at a plausible utilisation.
    # Big is within a factor 3 (0.42); base is 0.29 of it, a factor 3.5.
    assert paper / 4 < estimate.flops < paper
    assert estimate.implied_utilization == pytest.approx(estimate.flops / paper)


def test_model_flops_utilization_and_bad_input():
    assert model_flops_utilization(4e12, 2.0, 8e12) == pytest.approx(0.25)
    for peak in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="peak_flops_per_second"):
            model_flops_utilization(4e12, 2.0, peak)
    with pytest.raises(ValueError, match="seconds"):
        model_flops_utilization(4e12, 0, 8e12)
    with pytest.raises(ValueError, match="source_length"):
        model_flops_per_target_token(tiny_config(), 0, 4)
    with pytest.raises(ValueError, match="preset"):
        paper_estimate("C-N2")


def test_module_prints_the_paper_table():
    result = subprocess.run([sys.executable, "-m", "vaswani_transformer.flops"], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| base | 100,000 |" in result.stdout and "| big | 300,000 |" in result.stdout
    assert "3.3e+18" in result.stdout and "2.3e+19" in result.stdout


def test_training_summary_and_model_card_hold_tokens_times_per_token_flops(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=120, n_valid=4)
    out = tmp_path / "out"
    result = run_script(tiny_args(data, out, "--max_steps", "3", "--save_strategy", "no"))
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "training_summary.json").read_text())["summary"]
    # Average lengths of the training set, from the saved tokenizer, independently of the training code.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    sources = (data / "train.src").read_text(encoding="utf-8").splitlines()
    targets = (data / "train.tgt").read_text(encoding="utf-8").splitlines()
    encoded = tokenizer(sources, text_target=targets)
    mean_source = sum(map(len, encoded["input_ids"])) / len(sources)
    mean_target = sum(map(len, encoded["labels"])) / len(targets)
    config = VaswaniTransformerConfig.from_pretrained(out)
    per_token = model_flops_per_target_token(config, mean_source, mean_target)
    assert summary["model_flops_per_target_token"] == pytest.approx(per_token, rel=1e-9)
    assert summary["target_tokens_seen"] > 0
    assert summary["training_flops"] == pytest.approx(summary["target_tokens_seen"] * per_token, rel=1e-9)
    assert "Training cost:" in result.stdout
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "training compute (model FLOPs, forward + backward)" in card
    assert f"{summary['training_flops']:g}" in card


def test_wall_clock_hours_reproduce_the_papers_footnote():
    # Footnote 5: Table 2 = training time x 8 GPUs x 9.5 TFLOPS; base trained 12 hours, big 3.5 days.
    assert training_hours(PAPER_REPORTED_FLOPS["base"], 8, 9.5e12, 1.0) == pytest.approx(12, rel=0.01)
    assert training_hours(PAPER_REPORTED_FLOPS["big"], 8, 9.5e12, 1.0) / 24 == pytest.approx(3.5, rel=0.01)
    # Halving the utilisation doubles the time; the inverse gives the utilisation back.
    assert training_hours(1e18, 4, 1e14, 0.5) == pytest.approx(1e18 / (4 * 1e14 * 0.5) / 3600, rel=1e-12)
    assert required_utilization(1e18, training_hours(1e18, 4, 1e14, 0.25), 4, 1e14) == pytest.approx(0.25, rel=1e-12)
    with pytest.raises(ValueError, match="utilization"):
        training_hours(1e18, 8, 1e14, 0.0)


def test_flops_command_prints_both_tables_and_takes_its_options(capsys):
    out = subprocess.run([sys.executable, "-m", "vaswani_transformer.flops", "--devices", "8", "--utilization", "0.5"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "| base | 100,000 |" in out and "50% model FLOPs utilisation" in out
    # 8 P100s at 50%: base 9.51e17 model FLOPs / (8 x 9.5e12 x 0.5) s.
    hours = paper_estimate("base").flops / (8 * 9.5e12 * 0.5) / 3600
    assert f"| P100 fp32 (the paper's figure) | 9.5 TFLOPS | {hours:,.2f} |" in out
    bad = subprocess.run([sys.executable, "-m", "vaswani_transformer.flops", "--device", "8"], capture_output=True, text=True)
    assert bad.returncode == 2 and "did you mean --devices" in bad.stderr
    # Values out of range are refused while parsing: no half-printed table, no traceback (one real process, the
    # other values through the same main in this process).
    bad = subprocess.run([sys.executable, "-m", "vaswani_transformer.flops", "--utilization", "30"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
    assert "error: argument --utilization: must be a number in (0, 1], got 30" in bad.stderr
    for option, value, message in (("--devices", "0", "must be >= 1, got 0"),
                                   ("--utilization", "nan", "must be a number in (0, 1], got nan")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main([option, value])
        captured = capsys.readouterr()
        assert exit_info.value.code == 2 and captured.out == ""
        assert f"error: argument {option}: {message}" in captured.err


@pytest.mark.parametrize("dtype", ["float32", torch.bfloat16])
def test_measure_matmul_peak_is_a_positive_rate_and_bounded_by_its_own_timing(dtype):
    # 64 x 64 products for 0.05 s: at least one product of 2 * 64^3 FLOPs, so the rate is positive and finite,
    # and at most what the counted products could do if the clock had run the whole requested time.
    import time

    start = time.perf_counter()
    rate = measure_matmul_peak(dtype, size=64, seconds=0.05)
    elapsed = time.perf_counter() - start
    assert rate > 0 and rate != float("inf")
    assert elapsed >= 0.05  # it timed at least the requested seconds
    assert rate >= 2 * 64**3 / elapsed  # at least one product in the time it took


@pytest.mark.parametrize("kwargs", [dict(dtype="int64"), dict(dtype="no_such_dtype"), dict(dtype=torch.int32),
                                    dict(size=0), dict(size=2.5), dict(seconds=0), dict(seconds=-1.0)])  # fmt: skip
def test_measure_matmul_peak_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        measure_matmul_peak(**{"dtype": "float32", "size": 8, "seconds": 0.01, **kwargs})
