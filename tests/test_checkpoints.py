"""Checkpoints: one completeness rule for resuming and averaging; averaging gives the float64 mean of the newest
complete checkpoints, loadable and tied."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from vaswani_transformer import VaswaniTransformerForConditionalGeneration
from vaswani_transformer.checkpoints import (
    AVERAGING_RECORD_NAME,
    average_checkpoints,
    checkpoint_problem,
    find_checkpoints,
    find_last_complete_checkpoint,
    resolve_resume_checkpoint,
)

import helpers


REPO = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on a mat die katze sitzt auf der matte .".split()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_model(d_model=16, seed=0) -> VaswaniTransformerForConditionalGeneration:
    """A 1+1-layer model over the words of `tiny_tokenizer`."""
    return helpers.tiny_model(
        seed, vocab_size=4 + len(WORDS), d_model=d_model, encoder_layers=1, decoder_layers=1, num_heads=2, d_ff=32
    )


def write_checkpoint(model, path: Path, tokenizer=None, trainer_state=True):
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if trainer_state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": int(path.name.split("-")[1])}))


def make_run(run_dir: Path, steps, seed=0) -> Path:
    """A run directory with checkpoints of one model whose weights change (randomly) at every step."""
    model, tokenizer = tiny_model(seed=seed), tiny_tokenizer()
    model.generation_config.num_beams = 4  # something to recognise in the output's generation config
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        write_checkpoint(model, run_dir / f"checkpoint-{step}", tokenizer)
    return run_dir


def expected_mean(checkpoints) -> dict:
    """Independent reference: stack every stored tensor in float64 and take the mean."""
    states = [load_file(Path(c) / "model.safetensors") for c in checkpoints]
    return {k: torch.stack([s[k].double() for s in states]).mean(0).float() for k in states[0]}


def assert_weights(model, expected: dict):
    params = model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(params[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_average_equals_mean_of_newest_and_loads_tied(tmp_path):
    run = make_run(tmp_path / "run", [100, 20, 300, 40])  # step order, not name order, decides "last"
    result = average_checkpoints(run, num_last=3, output_dir=tmp_path / "avg")

    newest3 = [run / "checkpoint-40", run / "checkpoint-100", run / "checkpoint-300"]
    assert result.checkpoints == newest3 and result.skipped == {}
    averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    assert isinstance(averaged, VaswaniTransformerForConditionalGeneration)
    assert_weights(averaged, expected_mean(newest3))
    # Tied embeddings are still one tensor after loading the averaged folder.
    assert averaged.get_input_embeddings().weight.data_ptr() == averaged.get_output_embeddings().weight.data_ptr()
    assert averaged.get_input_embeddings().weight is averaged.get_output_embeddings().weight
    # Config, generation config and tokenizer come along.
    saved_config = json.loads((tmp_path / "avg" / "config.json").read_text())
    assert saved_config == json.loads((newest3[-1] / "config.json").read_text())
    assert averaged.generation_config.num_beams == 4
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "avg")
    assert tokenizer("the cat").input_ids == tiny_tokenizer()("the cat").input_ids
    record = json.loads((tmp_path / "avg" / AVERAGING_RECORD_NAME).read_text())
    assert record["checkpoints"] == [str(p) for p in newest3] and record["num_checkpoints"] == 3


def test_accumulates_in_float64(tmp_path):
    # 1e8 + 1 - 1e8 is 0 in float32 but 1 in float64: only float64 accumulation gives the mean 1/3.
    model, names = tiny_model(), []
    name = "model.encoder.layers.0.self_attn_residual.layer_norm.weight"
    for step, value in zip((1, 2, 3), (1e8, 1.0, -1e8)):
        with torch.no_grad():
            model.state_dict()[name][0] = value
        write_checkpoint(model, tmp_path / "run" / f"checkpoint-{step}")
        names.append(step)
    with pytest.warns(UserWarning, match="No tokenizer files"):
        average_checkpoints(tmp_path / "run", num_last=3, output_dir=tmp_path / "avg")
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    assert averaged[name].dtype == torch.float32
    assert averaged[name][0].item() == pytest.approx(1 / 3, rel=1e-6)


def test_bfloat16_checkpoints_are_cast_back(tmp_path):
    model = tiny_model().to(torch.bfloat16)
    for step in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        write_checkpoint(model, tmp_path / "run" / f"checkpoint-{step}", tiny_tokenizer())
    average_checkpoints(tmp_path / "run", num_last=2, output_dir=tmp_path / "avg")
    averaged, ckpts = load_file(tmp_path / "avg" / "model.safetensors"), sorted((tmp_path / "run").iterdir())
    states = [load_file(c / "model.safetensors") for c in ckpts]
    for name, tensor in averaged.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, torch.stack([s[name].double() for s in states]).mean(0).to(torch.bfloat16))


def test_incomplete_checkpoints_are_skipped_with_a_warning(tmp_path):
    run = make_run(tmp_path / "run", [10, 20, 30, 40, 50, 60])
    (run / "checkpoint-60" / "trainer_state.json").unlink()  # still being written
    weights = run / "checkpoint-50" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    (run / "checkpoint-40" / "model.safetensors").unlink()
    (run / "checkpoint-70").mkdir()  # created, nothing written yet
    (run / "not-a-checkpoint").mkdir()

    with pytest.warns(UserWarning) as caught:
        result = average_checkpoints(run, num_last=2, output_dir=tmp_path / "avg")
    messages = "\n".join(str(w.message) for w in caught)
    expected_reasons = [
        ("checkpoint-70", "missing model.safetensors"),
        ("checkpoint-60", "trainer_state.json"),
        ("checkpoint-50", "unreadable model.safetensors"),
        ("checkpoint-40", "missing model.safetensors"),
    ]
    for name, reason in expected_reasons:
        assert any(name in line and reason in line for line in messages.splitlines()), (name, messages)
    assert result.checkpoints == [run / "checkpoint-20", run / "checkpoint-30"]
    assert set(result.skipped) == {str(run / f"checkpoint-{s}") for s in (40, 50, 60, 70)}
    assert_weights(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg"), expected_mean(result.checkpoints))


def test_too_few_valid_checkpoints_is_a_clear_error(tmp_path):
    run = make_run(tmp_path / "run", [1, 2, 3])
    (run / "checkpoint-3" / "trainer_state.json").unlink()
    with pytest.warns(UserWarning, match="checkpoint-3"):
        with pytest.raises(ValueError, match=r"last 5 checkpoints.*found only 2 valid \(checkpoint-1, checkpoint-2\)"
                           r".*checkpoint-3: missing trainer_state.json"):  # fmt: skip
            average_checkpoints(run, num_last=5, output_dir=tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def resumable_checkpoint(path: Path) -> Path:
    """A checkpoint as the Trainer writes it: weights, trainer state, optimizer and scheduler states (torch.save zips),
    rng state and training arguments."""
    model = tiny_model()
    write_checkpoint(model, path, tiny_tokenizer())
    optimizer = torch.optim.Adam(model.parameters())
    model(input_ids=torch.tensor([[5, 6, 2]]), labels=torch.tensor([[7, 2]])).loss.backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    torch.save({"last_epoch": 1}, path / "scheduler.pt")
    torch.save({"python": [1, 2, 3], "cpu": torch.get_rng_state()}, path / "rng_state.pth")
    return path


@pytest.mark.parametrize("damage", ["weights", "optimizer", "scheduler", "rng", "state", "config", "shard"])
def test_a_checkpoint_is_complete_only_when_every_file_loads(tmp_path, damage):
    """One rule for averaging and resuming: a file cut short (or JSON that does not parse) makes the checkpoint
    incomplete, naming the file; a whole checkpoint passes both checks."""
    run = tmp_path / "run"
    older, newest = resumable_checkpoint(run / "checkpoint-1"), resumable_checkpoint(run / "checkpoint-2")
    assert checkpoint_problem(newest) is None and checkpoint_problem(newest, for_resume=True) is None
    name = {"weights": "model.safetensors", "optimizer": "optimizer.pt", "scheduler": "scheduler.pt",
            "rng": "rng_state.pth", "state": "trainer_state.json", "config": "config.json"}.get(damage)  # fmt: skip
    if damage == "shard":  # sharded weights whose index names a shard that is not there
        (newest / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))  # fmt: skip
        name = "model-00002-of-00002.safetensors"
        assert name in checkpoint_problem(newest, for_resume=True)
    else:
        data = (newest / name).read_bytes()
        (newest / name).write_bytes(data[: len(data) - 40])  # the end of the file never reached the disk
        for_averaging, for_resume = checkpoint_problem(newest), checkpoint_problem(newest, for_resume=True)
        assert name in for_averaging and for_averaging == for_resume
    assert find_last_complete_checkpoint(run) == str(older)  # what --resume_from_checkpoint latest picks
    assert (run / "incomplete-checkpoint-2").is_dir()


def test_a_checkpoint_without_its_random_state_is_not_resumed_from(tmp_path):
    """transformers writes the random state after the optimizer's and before the trainer state; without it a resumed
    run's dropout would not continue as the run's (transformers resumes with an info line): incomplete for resuming,
    whole for averaging (before, complete for both)."""
    run = tmp_path / "run"
    older, newest = resumable_checkpoint(run / "checkpoint-1"), resumable_checkpoint(run / "checkpoint-2")
    (newest / "rng_state.pth").unlink()
    assert checkpoint_problem(newest, for_resume=True) == "missing rng_state.pth (the random state, written after " \
        "the optimizer's)"
    assert checkpoint_problem(newest) is None
    assert find_last_complete_checkpoint(run) == str(older)


def test_an_older_checkpoint_half_deleted_by_the_rotation_is_moved_aside_too(tmp_path):
    """A run killed while transformers' rotation deleted an old checkpoint leaves it half there, its folder the newest
    by modification time (the order the rotation deletes in): resuming moves it aside, so that the rotation deletes
    no newer checkpoint in its place and averaging does not take its old weights (before, only incomplete checkpoints
    newer than the resumed one were moved aside)."""
    run = tmp_path / "run"
    for step in (4, 16, 20):
        resumable_checkpoint(run / f"checkpoint-{step}")
    (run / "checkpoint-4" / "optimizer.pt").unlink()  # the rotation's rmtree stopped part-way
    assert find_last_complete_checkpoint(run) == str(run / "checkpoint-20")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-16", "checkpoint-20", "incomplete-checkpoint-4"]
    assert find_last_complete_checkpoint(run, quarantine=False) == str(run / "checkpoint-20")


def test_a_save_only_model_checkpoint_is_kept_and_resuming_from_it_is_an_error_saying_what_to_do(tmp_path):
    """The Trainer writes a checkpoint's weights, then its optimizer, scheduler and rng states, then trainer_state.json
    last; save_only_model skips the states. A whole checkpoint with trainer_state.json and none of the states is a
    model-only one: averaged, never moved aside as half-written, and resuming from it (latest or named) is an error
    naming save_only_model and --model_name_or_path. One state without the other is still incomplete."""
    run = tmp_path / "run"
    full = resumable_checkpoint(run / "checkpoint-1")
    for step in (2, 3):
        write_checkpoint(tiny_model(seed=step), run / f"checkpoint-{step}", tiny_tokenizer())
    assert checkpoint_problem(run / "checkpoint-3") is None  # averages
    said = (r"checkpoint-3 was saved with save_only_model .*cannot resume from it.*--model_name_or_path "
            r"\S*checkpoint-3 and a new --output_dir")
    for value in ("latest", str(run / "checkpoint-3")):
        with pytest.raises(ValueError, match=said):
            resolve_resume_checkpoint(value, run)
    assert find_checkpoints(run) == [run / f"checkpoint-{s}" for s in (1, 2, 3)]  # none moved aside
    assert find_last_complete_checkpoint(run) == str(full)
    # a half-written newer one (no trainer_state.json) is moved aside; the model-only ones still stop "latest"
    (run / "checkpoint-4").mkdir()
    (run / "checkpoint-4" / "model.safetensors").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=said):
        resolve_resume_checkpoint("latest", run)
    assert (run / "incomplete-checkpoint-4").is_dir()
    # optimizer state without the scheduler's (a checkpoint tampered with): incomplete, moved aside
    for step in (2, 3):
        torch.save({}, run / f"checkpoint-{step}" / "optimizer.pt")
    assert checkpoint_problem(run / "checkpoint-3", for_resume=True) == "missing optimizer or scheduler state"
    assert resolve_resume_checkpoint("latest", run) == str(full)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-1", "incomplete-checkpoint-2",
                                                     "incomplete-checkpoint-3", "incomplete-checkpoint-4"]


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        average_checkpoints(tmp_path / "missing", output_dir=tmp_path / "avg")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="contains no checkpoint-<step> folders"):
        average_checkpoints(tmp_path / "empty", output_dir=tmp_path / "avg")
    run = make_run(tmp_path / "run", [1, 2])
    with pytest.raises(ValueError, match="num_last must be a positive integer"):
        average_checkpoints(run, num_last=0, output_dir=tmp_path / "avg")
    with pytest.raises(ValueError, match="is one of the checkpoints being averaged"):
        average_checkpoints(run, num_last=2, output_dir=run / "checkpoint-2")
    # Nor the run directory itself, given as the run or through its checkpoints: the run's final model is there.
    tiny_model(seed=7).save_pretrained(run)
    final = (run / "model.safetensors").read_bytes()
    for source in (run, [run / "checkpoint-1", run / "checkpoint-2"]):
        with pytest.raises(ValueError, match=rf"output_dir {re.escape(str(run))} is the run directory holding the "
                           rf"checkpoints being averaged .* such as {re.escape(str(run / 'averaged'))}"):  # fmt: skip
            average_checkpoints(source, num_last=2, output_dir=run)
    assert (run / "model.safetensors").read_bytes() == final and not (run / AVERAGING_RECORD_NAME).exists()
    # Checkpoints of different models cannot be averaged: other shapes, or the same shapes and another config (4
    # heads instead of 2, which averaged into the newest one's config without a word)
    write_checkpoint(tiny_model(d_model=32), tmp_path / "other" / "checkpoint-3")
    with pytest.raises(ValueError, match=r"checkpoint-1 and .*checkpoint-3 are checkpoints of different models "
                                         r"\(d_model: 16 against 32"):  # fmt: skip
        average_checkpoints([run / "checkpoint-1", tmp_path / "other" / "checkpoint-3"], num_last=2,
                            output_dir=tmp_path / "avg")  # fmt: skip
    four_heads = tiny_model()
    four_heads.config.num_heads = 4
    write_checkpoint(four_heads, tmp_path / "heads" / "checkpoint-3")
    with pytest.raises(ValueError, match=r"different models \(num_heads: 2 against 4\); averaging them would give"):
        average_checkpoints([run / "checkpoint-1", tmp_path / "heads" / "checkpoint-3"], num_last=2,
                            output_dir=tmp_path / "avg")  # fmt: skip
    for name in ("model.safetensors", "config.json"):
        (tmp_path / "other" / "checkpoint-3" / name).write_bytes((run / "checkpoint-1" / name).read_bytes())
    (tmp_path / "other" / "checkpoint-3" / "config.json").write_text(json.dumps(
        {**json.loads((run / "checkpoint-1" / "config.json").read_text()), "transformers_version": "0.0"}))
    assert average_checkpoints([run / "checkpoint-1", tmp_path / "other" / "checkpoint-3"], num_last=2,
                               output_dir=tmp_path / "avg").checkpoints  # bookkeeping fields may differ


def test_averaging_again_into_a_folder_leaves_nothing_of_the_earlier_average(tmp_path):
    """An earlier average's folder (a resumed run's averaged/) holds its scores, card and translations: averaging
    again replaces the folder whole (before, the earlier test scores stayed beside the new weights and went on their
    card)."""
    run = make_run(tmp_path / "run", [1, 2, 3])
    average_checkpoints(run, num_last=2, output_dir=run / "averaged")
    (run / "averaged" / "test_results.json").write_text('{"test_bleu": 30.0}')
    (run / "averaged" / "test_translations.txt").write_text("old\n")
    average_checkpoints(run, num_last=3, output_dir=run / "averaged")
    assert not (run / "averaged" / "test_results.json").exists()
    assert not (run / "averaged" / "test_translations.txt").exists()
    assert json.loads((run / "averaged" / AVERAGING_RECORD_NAME).read_text())["checkpoints"][0].endswith("checkpoint-1")


def test_explicit_list_and_all(tmp_path):
    run = make_run(tmp_path / "run", [1, 2, 3, 4])
    chosen = [run / "checkpoint-3", run / "checkpoint-1"]
    result = average_checkpoints(chosen, num_last=None, output_dir=tmp_path / "avg")
    assert result.checkpoints == [run / "checkpoint-1", run / "checkpoint-3"]
    assert_weights(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg"), expected_mean(chosen))
    assert find_checkpoints(run) == [run / f"checkpoint-{s}" for s in (1, 2, 3, 4)]


@pytest.mark.slow
def test_cli_averages_trainer_checkpoints(tmp_path):
    """Real `Seq2SeqTrainer` checkpoints, averaged by the script in a subprocess."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    tokenizer, model = tiny_tokenizer(), tiny_model()
    pairs = [("the cat sat", "die katze sitzt"), ("on a mat", "auf der matte")] * 4
    data = Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}).map(
        lambda b: tokenizer(b["src"], text_target=b["tgt"]), batched=True, remove_columns=["src", "tgt"]
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=3, save_steps=1, per_device_train_batch_size=4,
        learning_rate=1e-2, report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    Seq2SeqTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                   data_collator=DataCollatorForSeq2Seq(tokenizer, model=model)).train()  # fmt: skip

    run = tmp_path / "run"
    (run / "checkpoint-3" / "trainer_state.json").unlink()  # pretend the last one is half-written
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(REPO / "scripts" / "average_checkpoints.py"), str(run), "--num_last", "2",
               "--output_dir", str(tmp_path / "avg")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Skipping checkpoint" in done.stderr and "checkpoint-3" in done.stderr
    averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    assert_weights(averaged, expected_mean([run / "checkpoint-1", run / "checkpoint-2"]))
    assert averaged.get_input_embeddings().weight.data_ptr() == averaged.get_output_embeddings().weight.data_ptr()
    assert AutoTokenizer.from_pretrained(tmp_path / "avg").pad_token_id == 0

    command[command.index("2")] = "5"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "found only 2 valid" in done.stderr


def test_cli_averages_the_listed_checkpoints(tmp_path):
    """The help's second example: checkpoint folders named one by one are averaged, all of them (the default 5 of a
    run directory does not apply), and one of them incomplete is an error, not a smaller average."""
    run = make_run(tmp_path / "run", [1, 2, 3])
    listed = [run / "checkpoint-1", run / "checkpoint-3"]
    command = [sys.executable, str(REPO / "scripts" / "average_checkpoints.py"), *map(str, listed),
               "--output_dir", str(tmp_path / "avg")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_weights(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg"), expected_mean(listed))
    assert json.loads((tmp_path / "avg" / AVERAGING_RECORD_NAME).read_text())["checkpoints"] == [str(p) for p in listed]

    (run / "checkpoint-3" / "trainer_state.json").unlink()
    command[-1] = str(tmp_path / "avg2")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "found only 1 valid" in done.stderr and "checkpoint-3" in done.stderr
    assert not (tmp_path / "avg2").exists()
