"""Table 3 at small scale (scripts/ablations.py): the scaling rule against the paper's Table 3, dev perplexity
against a float64 sentence-by-sentence reference, the table layout, bad rows, and two tiny rows trained end to end
by the real training job, then read back (not retrained) on a second run."""

import csv
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file
from transformers import GenerationConfig

from vaswani_transformer import VaswaniTransformerConfig
from vaswani_transformer.ablations import (
    RESULT_NAME,
    check_rows,
    dev_perplexity,
    format_table,
    paper_values,
    row_recipe,
    run_ablations,
    scaled_row,
    train_row,
)
from vaswani_transformer.data import tokenize_parallel_dataset
from vaswani_transformer.tokenization import train_tokenizer
from vaswani_transformer.train import parse_arguments, parse_config_overrides

import helpers
from test_training import write_fixture

REPO = Path(__file__).resolve().parents[1]

# The paper's Table 3, written from the paper: N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positional encoding.
BASE = dict(N=6, d_model=512, d_ff=2048, h=8, d_k=64, d_v=64, P_drop=0.1, eps_ls=0.1, positional="sinusoid")
TABLE3 = {
    "base": {},
    "A-h1": dict(h=1, d_k=512, d_v=512), "A-h4": dict(h=4, d_k=128, d_v=128),
    "A-h16": dict(h=16, d_k=32, d_v=32), "A-h32": dict(h=32, d_k=16, d_v=16),
    "B-dk16": dict(d_k=16), "B-dk32": dict(d_k=32),
    "C-N2": dict(N=2), "C-N4": dict(N=4), "C-N8": dict(N=8),
    "C-d256": dict(d_model=256, d_k=32, d_v=32), "C-d1024": dict(d_model=1024, d_k=128, d_v=128),
    "C-dff1024": dict(d_ff=1024), "C-dff4096": dict(d_ff=4096),
    "D-drop0.0": dict(P_drop=0.0), "D-drop0.2": dict(P_drop=0.2),
    "D-ls0.0": dict(eps_ls=0.0), "D-ls0.2": dict(eps_ls=0.2),
    "E-learned": dict(positional="learned"),
    "big": dict(d_model=1024, d_ff=4096, h=16, P_drop=0.3),
}  # fmt: skip


@pytest.mark.parametrize("factor", [1, 4])
def test_scaling_rule_against_the_papers_table3(factor, tmp_path):
    """Sizes (d_model, d_ff, d_k, d_v) divided by the factor; N, h, P_drop, eps_ls, positions as the paper's row.
    The row's recipe builds exactly that model, whatever the base recipe's config_overrides said."""
    recipe = {"config_overrides": "num_heads=4,encoder_layers=3,dropout=0.05,share_embeddings=false",
              "label_smoothing_factor": 0.3, "seed": 5}  # fmt: skip
    for row, changes in TABLE3.items():
        paper = {**BASE, **changes}
        expected = {k: (v // factor if k in ("d_model", "d_ff", "d_k", "d_v") else v) for k, v in paper.items()}
        assert paper_values(scaled_row(row, factor)) == expected, row
        made = row_recipe(recipe, row, scale_factor=factor, row_dir=tmp_path / row, tokenizer_dir=tmp_path / "tok",
                          seed=1, max_steps=7)  # fmt: skip
        config = VaswaniTransformerConfig.from_preset(row, **parse_config_overrides(made["config_overrides"]))
        built = (config.encoder_layers, config.decoder_layers, config.d_model, config.d_ff, config.num_heads,
                 config.head_dim_k, config.head_dim_v, config.dropout, config.position_encoding)  # fmt: skip
        positional = "sinusoidal" if expected["positional"] == "sinusoid" else expected["positional"]
        assert built == (expected["N"], expected["N"], expected["d_model"], expected["d_ff"], expected["h"],
                         expected["d_k"], expected["d_v"], expected["P_drop"], positional), row  # fmt: skip
        assert config.share_embeddings is False  # a recipe override Table 3 does not name stays
        assert (made["label_smoothing_factor"], made["max_steps"], made["seed"]) == (expected["eps_ls"], 7, 1)
        assert made["preset"] == row and made["average_last_checkpoints"] == 0 and made["do_predict"] is False


def test_a_row_decodes_as_the_paper_whatever_the_recipe_tunes(tmp_path):
    """A recipe's alpha grid (tuned on the validation set the table reports), evaluation at the start and generation
    config are not the row's: its training job makes no validation decode and saves the paper's beam 4, alpha 0.6."""
    data = write_fixture(tmp_path / "data", n_train=100, n_valid=4)
    tokenizer_dir = tmp_path / "tokenizer"
    train_tokenizer(files=[data / "train.src", data / "train.tgt"], vocab_size=300, show_progress=False,
                    output_dir=tokenizer_dir)  # fmt: skip
    GenerationConfig(num_beams=2, length_penalty=1.4).save_pretrained(tmp_path / "other_decoding")
    recipe = {
        "train_file": str(data / "train"), "validation_file": str(data / "valid"), "source_lang": "src",
        "target_lang": "tgt", "max_tokens_per_batch": 160, "warmup_steps": 10, "use_cpu": True, "report_to": "none",
        "disable_tqdm": True, "save_strategy": "no", "length_penalty_grid": [1.4, 2.0], "eval_on_start": True,
        "generation_config": str(tmp_path / "other_decoding"),
    }  # fmt: skip
    made = row_recipe(recipe, "base", scale_factor=32, row_dir=tmp_path / "base", tokenizer_dir=tokenizer_dir,
                      seed=1, max_steps=1)  # fmt: skip
    assert (made["length_penalty_grid"], made["eval_on_start"], made["generation_config"]) == (None, False, None)
    summary = train_row(tmp_path / "base", made)
    assert "length_penalty" not in summary  # no alpha chosen on the dev set
    history = json.loads((tmp_path / "base" / "trainer_state.json").read_text())["log_history"]
    assert not any("eval_loss" in entry for entry in history)  # no validation run
    saved = json.loads((tmp_path / "base" / "generation_config.json").read_text())
    assert (saved["num_beams"], saved["length_penalty"]) == (4, 0.6)  # the paper's


def test_a_factor_that_does_not_divide_a_size_is_an_error():
    with pytest.raises(ValueError, match=r"scale_factor 32 does not divide d_k=16 of row 'B-dk16'"):
        scaled_row("B-dk16", 32)
    with pytest.raises(ValueError, match=r"scale_factor 3 does not divide d_model=512 of row 'base'"):
        scaled_row("base", 3)
    assert paper_values(scaled_row("B-dk16", 16))["d_k"] == 1


def test_unknown_row_is_an_error_listing_the_valid_ones(tmp_path):
    valid = r"\. Valid rows: base, big, A-h1, A-h4, "
    with pytest.raises(ValueError, match=r"Unknown Table 3 row 'A-h3' \(did you mean .*'A-h1'.*\?\)" + valid):
        check_rows(["base", "A-h3"])
    with pytest.raises(ValueError, match="more than once: base"):
        check_rows(["base", "C-N2", "base"])
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "ablations.py"), "recipe.yaml", "--rows", "base", "C-n2",
         "--max_steps", "1", "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, **helpers.SINGLE_THREAD_ENV, "HF_HUB_OFFLINE": "1",
             "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Unknown Table 3 row 'C-n2' (did you mean 'C-N2'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made
    # a beam size that scoring would refuse, refused before a row trains (before: after the first row, which then
    # recorded it in the settings, so that a corrected rerun was refused too)
    (tmp_path / "recipe.yaml").write_text("synthetic_task: reverse\n")
    with pytest.raises(ValueError, match=r"num_beams must be a positive integer \(1 for greedy decoding\), got 0"):
        run_ablations(tmp_path / "recipe.yaml", ["base"], tmp_path / "out", max_steps=1, num_beams=0)
    assert not (tmp_path / "out").exists()


def float64_nll(reference, data, limit=None) -> tuple[float, int]:
    """(summed negative log-likelihood, tokens) of each example's first `limit` labels, one sentence at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for example in data:
            labels = list(example["labels"])[:limit]
            decoder_input = [reference.config.decoder_start_token_id] + labels[:-1]
            logits = reference(input_ids=torch.tensor([example["input_ids"]]),
                               decoder_input_ids=torch.tensor([decoder_input])).logits[0]  # fmt: skip
            log_probs = torch.log_softmax(logits, dim=-1)
            total -= sum(float(log_probs[i, label]) for i, label in enumerate(labels))
            count += len(labels)
    return total, count


def test_dev_perplexity_equals_a_float64_sentence_by_sentence_reference():
    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, dropout=0.3).train()  # scored in eval mode all the same
    pairs = [{"en": s, "de": t} for s, t in zip(helpers.SOURCES, reversed(helpers.SOURCES))]
    data, _ = tokenize_parallel_dataset(DatasetDict(validation=Dataset.from_dict({"translation": pairs})), tokenizer,
                                        "en", "de", filter_splits=())  # fmt: skip
    data = data["validation"]
    got = dev_perplexity(model, data, tokenizer, batch_size=4)  # two batches, padded
    assert model.training
    reference = helpers.tiny_translation_model(tokenizer, dropout=0.3).double().eval()
    total, count = float64_nll(reference, data)
    assert data[-1]["labels"][-1] == tokenizer.eos_token_id and got["tokens"] == count
    assert got["nll_per_token"] == pytest.approx(total / count, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def test_dev_perplexity_counts_the_first_tokens_of_a_reference_longer_than_the_learned_positions():
    """Learned positions (16) and a reference of more tokens: the perplexity counts its first 16 tokens, as the
    Trainer's validation loss and `truncate_long_sources`' warning say, against a float64 sentence-by-sentence sum."""
    tokenizer = helpers.tiny_tokenizer()
    fields = dict(position_encoding="learned", max_position_embeddings=16)
    model = helpers.tiny_translation_model(tokenizer, **fields)
    long_de = " ".join(["Ein Mann fährt mit dem Fahrrad die Straße entlang."] * 3)
    pairs = [{"en": "Two dogs play.", "de": "Zwei Hunde."}, {"en": "A man rides.", "de": long_de}]
    data, _ = tokenize_parallel_dataset(DatasetDict(validation=Dataset.from_dict({"translation": pairs})), tokenizer,
                                        "en", "de", filter_splits=())  # fmt: skip
    data = data["validation"]
    lengths = [len(labels) for labels in data["labels"]]
    assert lengths[0] <= 16 < lengths[1] and all(len(ids) <= 16 for ids in data["input_ids"])
    got = dev_perplexity(model, data, tokenizer, batch_size=2)  # one padded batch
    reference = helpers.tiny_translation_model(tokenizer, **fields).double().eval()
    total, count = float64_nll(reference, data, limit=16)
    assert got["tokens"] == count == lengths[0] + 16
    assert math.isfinite(got["perplexity"])
    assert got["nll_per_token"] == pytest.approx(total / count, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def _result(row, values, ppl, bleu):
    return {"row": row, "values": {**BASE, **values}, "train_steps": 100, "dev_perplexity": ppl, "dev_bleu": bleu,
            "dev_sacrebleu": bleu + 1, "parameters": 63_000_000, "decoding": {"num_beams": 4}}  # fmt: skip


def test_table_is_in_the_papers_layout():
    table = format_table([_result("base", {}, 4.92, 25.8), _result("A-h1", dict(h=1, d_k=512, d_v=512), 5.29, 24.9),
                          _result("D-ls0.0", dict(eps_ls=0.0), 4.67, 25.3)]).splitlines()  # fmt: skip
    assert table[0] == ("| row | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls | positional | train steps | "
                        "PPL (dev) | BLEU (dev) | sacreBLEU (dev) | params ×10^6 |")  # fmt: skip
    assert table[2] == ("| base | 6 | 512 | 2048 | 8 | 64 | 64 | 0.1 | 0.1 | sinusoid | 100 | 4.92 | 25.8 | 26.8 | "
                        "63.00 |")
    assert table[3] == "| A-h1 |  |  |  | 1 | 512 | 512 |  |  |  | 100 | 5.29 | 24.9 | 25.9 | 63.00 |"
    assert table[4] == "| D-ls0.0 |  |  |  |  |  |  |  | 0.0 |  | 100 | 4.67 | 25.3 | 26.3 | 63.00 |"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_two_tiny_rows_end_to_end_then_read_back_not_retrained(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=200)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "train_file": str(data / "train"), "validation_file": str(data / "valid"), "source_lang": "src",
        "target_lang": "tgt", "tokenizer_vocab_size": 300, "max_tokens_per_batch": 160, "warmup_steps": 10,
        "lr_factor": 3, "logging_steps": 1, "use_cpu": True, "report_to": "none", "disable_tqdm": True,
        "save_strategy": "no", "config_overrides": {"encoder_layers": 1, "num_heads": 2},
    }))  # fmt: skip
    out = tmp_path / "out"
    settings = dict(scale_factor=32, max_steps=3, seed=3, num_beams=1)
    messages = []
    results = run_ablations(recipe, ["C-N2", "D-ls0.0"], out, log=messages.append, **settings)
    assert [r["row"] for r in results] == ["C-N2", "D-ls0.0"]
    for result in results:
        row_dir = out / result["row"]
        config = json.loads((row_dir / "config.json").read_text())
        assert result["train_steps"] == 3 == json.loads((row_dir / "trainer_state.json").read_text())["global_step"]
        assert (config["d_model"], config["d_ff"], config["num_heads"], config["d_k"]) == (16, 64, 8, 2)
        assert config["encoder_layers"] == config["decoder_layers"] == result["values"]["N"]
        assert 1 < result["dev_perplexity"] < 1e4 and 0 <= result["dev_bleu"] <= 100
        saved = load_file(row_dir / "model.safetensors")  # the shared embedding matrix is stored once
        assert result["parameters"] == sum(t.numel() for t in saved.values())
        assert len((row_dir / "dev_translations.txt").read_text(encoding="utf-8").splitlines()) == 12
    assert results[0]["values"]["N"] == 2 and results[1]["values"]["N"] == 6
    # The training job read the row's recipe: its label smoothing, budget and shared vocabulary.
    _, _, training_args = parse_arguments([str(out / "D-ls0.0" / "recipe.yaml")])
    assert (training_args.label_smoothing_factor, training_args.max_steps) == (0.0, 3)
    shared = json.loads((out / "tokenizer" / "tokenizer.json").read_text())
    assert all(json.loads((out / row / "tokenizer.json").read_text()) == shared for row in ("C-N2", "D-ls0.0"))

    with open(out / "table3.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["row"], r["N"], r["eps_ls"], r["train_steps"]) for r in rows] == [("C-N2", "2", "0.1", "3"),
                                                                                 ("D-ls0.0", "6", "0.0", "3")]
    assert float(rows[0]["dev_perplexity"]) == pytest.approx(results[0]["dev_perplexity"])
    width, height = _png_size(out / "table3.png")
    assert width >= 600 and height == 420
    assert "| D-ls0.0 |" in (out / "table3.md").read_text(encoding="utf-8")

    # Second run: the rows are read from their results, nothing is trained or written in their folders again.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*") if p.is_file()}
    messages.clear()
    again = run_ablations(recipe, ["C-N2", "D-ls0.0"], out, log=messages.append, **settings)
    assert again == results
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*") if p.is_file()} == stamps
    assert sum("done earlier" in m for m in messages) == 2 and not any("training" in m for m in messages)
    with pytest.raises(ValueError, match=r"ablation_settings.json was made with other settings \(seed: 3 now 4\)"):
        run_ablations(recipe, ["C-N2"], out, log=messages.append, **{**settings, "seed": 4})
    changed = tmp_path / "changed.yaml"
    changed.write_text(recipe.read_text().replace("lr_factor: 3", "lr_factor: 2"))
    with pytest.raises(ValueError, match=r"other settings \(recipe lr_factor: 3 now 2\)"):
        run_ablations(changed, ["C-N2"], out, log=messages.append, **settings)
    assert (out / "C-N2" / RESULT_NAME).is_file()

    # A row trained but not scored (killed in between) is scored again, not retrained.
    (out / "C-N2" / RESULT_NAME).unlink()
    messages.clear()
    assert run_ablations(recipe, ["C-N2"], out, log=messages.append, **settings) == results[:1]
    assert "trained earlier; scoring" in messages[0] and not any("training (log" in m for m in messages)
    assert (out / "C-N2" / "train.log").stat().st_mtime_ns == stamps[out / "C-N2" / "train.log"]
