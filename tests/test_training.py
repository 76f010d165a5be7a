"""Training: the paper's schedule and optimizer, recipes, the real script end to end, faults (more in test_faults.py)."""

import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.checkpoints import find_last_complete_checkpoint
from vaswani_transformer.hub import export_repository
from vaswani_transformer.train import (
    VaswaniTrainingArguments,
    idle_cpu_cores_warning,
    load_recipe,
    run_from_args,
    parse_arguments,
    parse_config_overrides,
    prepare_kernels,
)
from vaswani_transformer.trainer import (
    NonFiniteLossError,
    VaswaniSeq2SeqTrainer,
    build_optimizer,
    forward_as_saved,
    gradient_accumulation_for,
    label_smoothed_cross_entropy,
)

import helpers

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train.py"
TINY_MODEL = "d_model=32,d_ff=64,num_heads=2,encoder_layers=1,decoder_layers=1,dropout=0.1"


def write_fixture(folder: Path, n_train: int = 400, n_valid: int = 12, seed: int = 0) -> Path:
    """Side-by-side text files folder/{train,valid}.{src,tgt}: toy words -> the same words reversed, upper-cased."""
    rng = random.Random(seed)
    words = [c + v for c in "bdgkmnpst" for v in "aeiou"]
    seen, pairs = set(), []
    while len(pairs) < n_train + n_valid:
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))
        if sentence not in seen:
            seen.add(sentence)
            pairs.append((sentence, " ".join(reversed(sentence.upper().split()))))
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", pairs[:n_train]), ("valid", pairs[n_train:])):
        (folder / f"{name}.src").write_text("".join(s + "\n" for s, _ in part), encoding="utf-8")
        (folder / f"{name}.tgt").write_text("".join(t + "\n" for _, t in part), encoding="utf-8")
    return folder


def tiny_args(data: Path, out: Path, *extra: str) -> list[str]:
    given_tokenizer = "--tokenizer_name" in extra or "--model_name_or_path" in extra
    return [
        "--train_file", str(data / "train"), "--validation_file", str(data / "valid"),
        "--source_lang", "src", "--target_lang", "tgt", "--output_dir", str(out),
        "--do_train", "--config_overrides", TINY_MODEL, *([] if given_tokenizer else ["--tokenizer_vocab_size", "300"]),
        "--max_tokens_per_batch", "160", "--warmup_steps", "10", "--lr_factor", "3",
        "--logging_steps", "1", "--use_cpu", "--report_to", "none", "--seed", "3", "--disable_tqdm", "true",
        *extra,
    ]  # fmt: skip


def run_script(args: list[str], timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, **kwargs
    )


def losses(state_file: Path) -> dict[int, float]:
    history = json.loads(state_file.read_text())["log_history"]
    return {h["step"]: h["loss"] for h in history if "loss" in h}


def logged_rates(state_file: Path) -> dict[int, float]:
    """The learning rate logged for each update (log_history, as TensorBoard and the plots read it)."""
    history = json.loads(state_file.read_text())["log_history"]
    return {h["step"]: h["learning_rate"] for h in history if "learning_rate" in h}


def tiny_model() -> VaswaniTransformerForConditionalGeneration:
    """A 1+1-layer model with the paper's dropout, in training mode."""
    return helpers.tiny_model(num_heads=2, encoder_layers=1, decoder_layers=1, dropout=0.1).train()


# ------------------------------------------------------------------------------ schedule and optimizer


def test_paper_optimizer_and_schedule_against_the_formula(tmp_path):
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), warmup_steps=10, lr_factor=2.0, use_cpu=True,
                                    report_to="none")  # fmt: skip
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert args.weight_decay == 0 and args.label_smoothing_factor == 0.1 and args.max_grad_norm == 0
    assert VaswaniTrainingArguments(output_dir=str(tmp_path), report_to="none").warmup_steps == 4000
    trainer = VaswaniSeq2SeqTrainer(model=tiny_model(), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    opt = trainer.optimizer
    assert type(opt) is torch.optim.Adam
    for group in opt.param_groups:
        assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
        assert group["fused"] is True  # the one-pass kernel on CPU
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(trainer.model.parameters()))
    # the fused kernel makes the same Adam update as PyTorch's reference one-tensor-at-a-time loop
    fused_params = [torch.nn.Parameter(torch.randn(5, 3, generator=torch.Generator().manual_seed(i))) for i in range(2)]
    plain_params = [torch.nn.Parameter(p.detach().clone()) for p in fused_params]
    fused_opt = build_optimizer(torch.nn.ParameterList(fused_params), args)
    plain_opt = torch.optim.Adam(plain_params, lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    for step in range(3):
        for a, b in zip(fused_params, plain_params):
            a.grad = torch.full_like(a, 0.1 * (step + 1)) + a.detach()
            b.grad = a.grad.clone()
        fused_opt.step()
        plain_opt.step()
    for a, b in zip(fused_params, plain_params):
        torch.testing.assert_close(a, b)

    def formula(n):  # paper eq. (3) with step_num = n, times the factor
        return 2.0 * 32 ** -0.5 * min(n ** -0.5, n * 10 ** -1.5)

    seen = {}
    for n in range(1, 61):  # the rate the n-th update uses, then step as the Trainer does
        seen[n] = opt.param_groups[0]["lr"]
        opt.step()
        trainer.lr_scheduler.step()
    for n in (1, 2, 5, 9, 10, 11, 30, 60):
        assert seen[n] == pytest.approx(formula(n), rel=1e-12), n
    assert max(seen, key=seen.get) == 10  # peak at the end of warmup


def test_another_optim_is_transformers_optimizer_on_the_schedule_and_the_card_names_it(tmp_path):
    """--optim other than transformers' default (adafactor, sgd, ...) trains with transformers' optimizer, no longer
    dropped without a word for the paper's Adam; the paper schedule still sets its rate; the card names it."""
    from transformers.optimization import Adafactor

    args = VaswaniTrainingArguments(output_dir=str(tmp_path), warmup_steps=10, lr_factor=2.0, use_cpu=True,
                                    report_to="none", optim="adafactor")  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=tiny_model(), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    assert type(trainer.optimizer) is Adafactor
    seen = {}
    for n in range(1, 13):
        seen[n] = [group["lr"] for group in trainer.optimizer.param_groups]
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    for n, rates in seen.items():  # paper eq. (3) with step_num = n, times the factor
        assert rates == pytest.approx([2.0 * 32**-0.5 * min(n**-0.5, n * 10**-1.5)] * len(rates), rel=1e-12), n
    for optim in ("adamw_torch", "adamw_torch_fused"):  # transformers' default and its plain sibling: the paper's
        paper = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", optim=optim)
        trainer = VaswaniSeq2SeqTrainer(model=tiny_model(), args=paper)
        assert type(trainer.create_optimizer()) is torch.optim.Adam
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "sgd"
    run_from_args(tiny_args(data, out, "--max_steps", "2", "--optim", "sgd"))
    card = (out / "README.md").read_text()
    assert "| optimizer | transformers' --optim sgd |" in card and "Adam beta2" not in card


def test_label_smoothed_loss_equals_transformers_label_smoother_and_the_formula(tmp_path):
    """The trainer's fused loss == transformers' LabelSmoother == (1-eps)*NLL + eps*mean_v(-log p), per real token."""
    from transformers.trainer_pt_utils import LabelSmoother

    model = tiny_model().eval()
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 50, (3, 7), generator=generator)
    labels = torch.randint(4, 50, (3, 6), generator=generator)
    labels[0, 4:] = -100
    labels[2, 2:] = -100
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    with torch.no_grad():
        loss, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)
        logits = model(input_ids=input_ids, labels=labels).logits
        reference = LabelSmoother(epsilon=0.1)({"logits": logits}, labels)
        log_p = torch.log_softmax(logits.double(), -1)
        real = labels != -100
        nll = -log_p.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)[real]
        formula = (0.9 * nll + 0.1 * -log_p.mean(-1)[real]).mean()
        summed = trainer.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(int(real.sum()) * 2))
    torch.testing.assert_close(outputs.logits, logits)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert loss.item() == pytest.approx(formula.item(), rel=1e-5)
    assert summed.item() == pytest.approx(formula.item() / 2, rel=1e-5)  # normalised by the update's token count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_blocked_label_smoothed_cross_entropy_equals_the_float64_formula_with_its_gradient(dtype, epsilon):
    """The CPU loss in row blocks (vocabulary 9000: 29 rows per block, 70 tokens: three blocks, the last partial)
    equals (1-eps)*-log p(y) + eps*mean_v(-log p(v)) summed over real tokens, and its gradient equals autograd's of
    that formula, both in float64 (to float32 for float32 logits, to bf16 rounding for bf16 logits)."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(70, 9000, generator=generator, dtype=torch.float64) * 4).to(dtype).requires_grad_()
    labels = torch.randint(0, 9000, (70,), generator=generator)
    labels[[0, 28, 29, 69]] = -100  # ignored, also at block edges
    labels[1] = 8999
    before = logits.detach().clone()
    loss = label_smoothed_cross_entropy(logits, labels, epsilon)
    (loss * 0.5).backward()  # an upstream gradient other than 1
    assert torch.equal(logits.detach(), before)  # the logits are not overwritten
    exact = logits.detach().double().requires_grad_()
    log_p, real = torch.log_softmax(exact, -1), labels != -100
    nll = -log_p.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    formula = ((1 - epsilon) * nll - epsilon * log_p.mean(-1))[real].sum()
    (formula * 0.5).backward()
    assert logits.grad.dtype == dtype
    assert loss.item() == pytest.approx(formula.item(), rel=1e-6)
    tolerance = dict(atol=1e-6, rtol=0) if dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)
    torch.testing.assert_close(logits.grad.double(), exact.grad, **tolerance)
    assert torch.all(logits.grad[[0, 28, 29, 69]] == 0)
    # a scale (as the trainer's 1 / target tokens) folded into the gradient before rounding, upstream gradient 1
    logits.grad = None
    scaled = label_smoothed_cross_entropy(logits, labels, epsilon, scale=1 / 66)
    scaled.backward()
    assert scaled.item() == pytest.approx(formula.item() / 66, rel=1e-6)
    torch.testing.assert_close(logits.grad.double(), exact.grad / 33, **tolerance)
    # no gradient wanted (evaluation): the same loss
    assert label_smoothed_cross_entropy(logits.detach(), labels, epsilon).item() == pytest.approx(loss.item(), rel=1e-6)


def test_labels_are_shifted_by_the_model_alone_with_the_same_loss_and_gradients(tmp_path):
    """The collator pads only; the trainer's loss gets the decoder inputs from the model. Loss and gradients equal
    those with the decoder inputs the collator used to add, written here by hand (<s>, the labels shifted right,
    padding as <pad>)."""
    model = tiny_model().eval()
    trainer = VaswaniSeq2SeqTrainer(model=model, args=VaswaniTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none"))  # fmt: skip
    input_ids = torch.tensor([[5, 6, 2], [8, 2, 0]])
    labels = torch.tensor([[7, 2, -100, -100], [9, 10, 11, 2]])
    batch = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}
    by_hand = torch.tensor([[1, 7, 2, 0], [1, 9, 10, 11]])
    results = []
    for inputs in (batch, {**batch, "decoder_input_ids": by_hand}):
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(inputs))
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, grads), (expected_loss, expected_grads) = results
    assert loss.item() == expected_loss.item()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name


def test_bf16_training_step_gives_the_loss_bf16_logits_with_the_same_loss_and_gradients(tmp_path):
    """Under bf16 mixed precision accelerate returns a prepared model's outputs in float32. In a training step the
    trainer's loss takes the bf16 logits instead (no float32 copy of the tokens x vocabulary logits): the same loss
    and, bitwise, the same gradients as the loss on accelerate's float32 logits (the conversion is exact, and its
    backward rounds the same float32 gradient to bf16). Evaluation outputs stay float32; the model's forward is
    accelerate's again after the step."""
    model = tiny_model()
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True, report_to="none",
                                    label_smoothing_factor=0.1)  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args)
    trainer.accelerator.prepare_model(model)  # as Trainer.train: bf16 autocast, outputs converted to float32
    wrapped = model.__dict__["forward"]
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output.logits.dtype))
    input_ids = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    labels = torch.tensor([[7, 9, 2, -100], [9, 10, 11, 2]])
    inputs = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}
    results = []
    for fast in (True, False):
        model.zero_grad()
        torch.manual_seed(0)  # the same dropout masks
        if fast:
            loss = trainer.compute_loss(model, dict(inputs))
        else:  # the loss on the float32 logits accelerate's wrapper returns
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"},
                           decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels)).logits  # fmt: skip
            loss = label_smoothed_cross_entropy(logits.flatten(0, 1), labels.flatten(), 0.1,
                                                1 / (labels != -100).sum())  # as the trainer scales it
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert seen == [torch.bfloat16, torch.float32]
    assert model.__dict__["forward"] is wrapped
    (loss, grads), (expected_loss, expected_grads) = results
    assert loss.item() == expected_loss.item()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    model.eval()
    with torch.no_grad():
        _, outputs = trainer.compute_loss(model, dict(inputs), return_outputs=True)
    assert outputs.logits.dtype == torch.float32 and seen[-1] == torch.float32


class _KeepGradients(TrainerCallback):
    """The loss logged for update 1 and every parameter's gradient just before its optimizer step."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _pad_batch(features):
    """A plain collator: sources padded with 0 (masked), labels with -100."""
    width_s = max(len(f["input_ids"]) for f in features)
    width_t = max(len(f["labels"]) for f in features)
    ids = torch.tensor([f["input_ids"] + [0] * (width_s - len(f["input_ids"])) for f in features])
    labels = torch.tensor([f["labels"] + [-100] * (width_t - len(f["labels"])) for f in features])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_update_loss_and_gradient_are_the_mean_over_the_updates_target_tokens(tmp_path, epsilon):
    """Gradient accumulation over two micro-batches of very different token counts: the loss and the gradient of the
    update are those of the per-token mean over all its target tokens (float64 reference, one pair at a time), for
    every label smoothing including 0 (which used to fall back to the model's per-micro-batch mean)."""
    import copy

    torch.manual_seed(0)
    model = VaswaniTransformerForConditionalGeneration(VaswaniTransformerConfig(
        vocab_size=50, d_model=16, d_ff=32, num_heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0))  # fmt: skip
    rng = random.Random(1)
    lengths = [(3, 2), (4, 3), (9, 12), (7, 14)]  # one update = 4 pairs; the micro-batches differ in tokens
    pairs = [{"input_ids": [rng.randrange(4, 50) for _ in range(s - 1)] + [2],
              "labels": [rng.randrange(4, 50) for _ in range(t - 1)] + [2]} for s, t in lengths]  # fmt: skip
    reference_model = copy.deepcopy(model).double()
    total_tokens = sum(len(p["labels"]) for p in pairs)
    reference = 0.0
    for pair in pairs:  # sum over every target token of the update, then divide by their number
        labels = torch.tensor([pair["labels"]])
        logits = reference_model(input_ids=torch.tensor([pair["input_ids"]]), labels=labels).logits[0]
        log_p = torch.log_softmax(logits, -1)
        nll = -log_p.gather(-1, labels[0].unsqueeze(-1)).squeeze(-1)
        reference = reference + ((1 - epsilon) * nll + epsilon * -log_p.mean(-1)).sum()
    reference = reference / total_tokens
    reference.backward()

    record = _KeepGradients()
    args = VaswaniTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", label_smoothing_factor=epsilon, max_steps=1,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=1, save_strategy="no",
        warmup_steps=10, remove_unused_columns=False, disable_tqdm=True,
    )  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args, train_dataset=pairs, data_collator=_pad_batch,
                                    callbacks=[record])  # fmt: skip
    trainer.train()
    logged = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    assert logged == pytest.approx(reference.item(), rel=1e-4)
    expected = dict(reference_model.named_parameters())
    for name, grad in record.grads.items():
        torch.testing.assert_close(grad.double(), expected[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_gradient_accumulation_from_tokens_per_update():
    assert gradient_accumulation_for(25000, 25000, 1) == 1
    assert gradient_accumulation_for(25000, 3125, 8) == 1  # the paper: 8 GPUs
    assert gradient_accumulation_for(25000, 3125, 1) == 8
    assert gradient_accumulation_for(25000, 4096, 2) == 3
    assert gradient_accumulation_for(1000, 4096, 2) == 1
    with pytest.raises(ValueError, match="must be positive"):
        gradient_accumulation_for(0, 4096, 1)


# ------------------------------------------------------------------------------------------ recipes


def test_recipe_files_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\nmax_steps: 7\nconfig_overrides: {d_model: 64, dropout: 0.3}\nsource_lang: en\n")
    model_args, data_args, training_args = parse_arguments([str(recipe), "--max_steps", "9"])
    assert training_args.max_steps == 9  # the command line wins
    assert training_args.output_dir == "out" and data_args.source_lang == "en"
    assert parse_config_overrides(model_args.config_overrides) == {"d_model": 64, "dropout": 0.3}
    # a --config_overrides flag changes the fields it names (it replaced them all: the model became the preset's)
    for flag, fields in (("dropout=0.2", {"d_model": 64, "dropout": 0.2}),
                         ("hidden_size=128,d_ff=96", {"d_model": 128, "dropout": 0.3, "d_ff": 96})):  # fmt: skip
        model_args = parse_arguments([str(recipe), "--config_overrides", flag])[0]
        assert parse_config_overrides(model_args.config_overrides) == fields, flag
    # a single value for a list (it failed after training), and prediction_loss_only with generated translations
    # (a TypeError after training), are errors before any work
    (tmp_path / "grid.yaml").write_text("output_dir: out\nlength_penalty_grid: 1.0\n")
    with pytest.raises(ValueError, match="length_penalty_grid: 1.0 is one value, but length_penalty_grid takes a list"):
        parse_arguments([str(tmp_path / "grid.yaml")])
    with pytest.raises(ValueError, match="prediction_loss_only skips the translations"):
        parse_arguments(["--output_dir", "out", "--prediction_loss_only", "true"])
    assert parse_arguments(["--output_dir", "out", "--prediction_loss_only", "true", "--predict_with_generate",
                            "false"])[2].prediction_loss_only  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"output_dir": "o2", "tokens_per_update": 25000}))
    assert parse_arguments([str(tmp_path / "r.json")])[1].tokens_per_update == 25000


def test_preset_sets_its_training_values_and_explicit_values_win(tmp_path):
    """Paper, Table 3 and 5.4: base 100k updates, big 300k, label smoothing 0.1 except rows D-ls (0.0 / 0.2)."""

    def parsed(*argv):
        model_args, _, training_args = parse_arguments(["--output_dir", str(tmp_path), *argv])
        args = training_args
        return model_args.preset, args.label_smoothing_factor, args.max_steps, args.warmup_steps

    assert parsed() == ("base", 0.1, 100_000, 4000)
    assert parsed("--preset", "big") == ("big", 0.1, 300_000, 4000)
    assert parsed("--preset", "D-ls0.0") == ("D-ls0.0", 0.0, 100_000, 4000)
    assert parsed("--preset", "D-ls0.2") == ("D-ls0.2", 0.2, 100_000, 4000)
    # an explicit flag wins, also when it repeats the dataclass default
    assert parsed("--preset", "D-ls0.0", "--label_smoothing_factor", "0.1") == ("D-ls0.0", 0.1, 100_000, 4000)
    assert parsed("--preset", "big", "--max_steps", "7", "--warmup_steps", "3") == ("big", 0.1, 7, 3)
    # epochs given: the preset's update count would override them in the Trainer, so it is left out
    assert parsed("--preset", "big", "--num_train_epochs", "2")[2] == -1
    # a recipe key wins over the preset (its own or the command line's), a flag over the recipe
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\npreset: D-ls0.2\nmax_steps: 50\n")
    _, _, training_args = parse_arguments([str(recipe)])
    assert (training_args.label_smoothing_factor, training_args.max_steps) == (0.2, 50)
    _, _, training_args = parse_arguments([str(recipe), "--preset", "big", "--label_smoothing_factor", "0.3"])
    assert (training_args.label_smoothing_factor, training_args.max_steps) == (0.3, 50)
    recipe.write_text("output_dir: out\npreset: big\nlabel_smoothing_factor: 0.0\n")
    _, _, training_args = parse_arguments([str(recipe)])
    assert (training_args.label_smoothing_factor, training_args.max_steps) == (0.0, 300_000)


def test_learning_rate_with_the_paper_schedule_is_an_error_naming_lr_factor(tmp_path):
    with pytest.raises(ValueError, match=r"learning_rate=0.001 has no effect with lr_schedule=paper.*lr_factor"):
        parse_arguments(["--output_dir", str(tmp_path), "--learning_rate", "1e-3"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\nlearning_rate: 0.5\n")
    with pytest.raises(ValueError, match="lr_factor"):
        parse_arguments([str(recipe)])
    hf = parse_arguments(["--output_dir", str(tmp_path), "--learning_rate", "1e-3", "--lr_schedule", "hf"])[2]
    assert hf.learning_rate == 1e-3
    assert parse_arguments(["--output_dir", str(tmp_path), "--lr_factor", "2"])[2].lr_factor == 2


@pytest.mark.parametrize("flags, message", [
    (["--lr_scheduler_type", "cosine"], r"lr_scheduler_type=cosine has no effect with lr_schedule=paper.*lr_factor"),
    (["--lr_scheduler_kwargs", '{"num_decay_steps": 5}'], r"lr_scheduler_kwargs=.* has no effect with lr_schedule=paper"),
    (["--per_device_train_batch_size", "64"], r"per_device_train_batch_size=64 has no effect: .*token batches.*now 4096"),
    (["--auto_find_batch_size", "true"], r"auto_find_batch_size has no effect: .*token batches.*max_tokens_per_batch"),
    (["--auto_find_batch_size"], r"auto_find_batch_size has no effect"),
    (["--lr_schedule", "hf", "--lr_factor", "0.45"],
     r"lr_factor=0.45 has no effect with lr_schedule=hf.*learning_rate \(now 5e-05\): set learning_rate"),
    (["--gradient_accumulation_steps", "4", "--tokens_per_update", "25000"], r"both set the accumulation"),
    (["--dataloader_drop_last", "true"], r"dataloader_drop_last has no effect on training: .*token batches.*would "
                                         r"only drop the last batch of the validation and test sets"),
])  # fmt: skip
def test_training_arguments_that_would_be_ignored_are_errors_naming_what_to_set(tmp_path, flags, message):
    """Flags of transformers' Trainer that this training overrides (its schedule, its batch size and the search for one
    that fits, which token batches replace, the accumulation tokens_per_update sets, dropping a last partial batch,
    which token batches never have and which would only drop evaluation sentences), and lr_factor beside
    transformers' schedules, are errors, not silently dropped; in their own setting they are taken."""
    with pytest.raises(ValueError, match=message):
        parse_arguments(["--output_dir", str(tmp_path), *flags])
    hf = parse_arguments(["--output_dir", str(tmp_path), "--lr_schedule", "hf", "--lr_scheduler_type", "cosine"])[2]
    assert hf.lr_scheduler_type == "cosine"
    accumulation = parse_arguments(["--output_dir", str(tmp_path), "--gradient_accumulation_steps", "4"])[2]
    assert accumulation.gradient_accumulation_steps == 4
    assert parse_arguments(["--output_dir", str(tmp_path), "--auto_find_batch_size", "false"])[2].auto_find_batch_size \
        is False
    assert parse_arguments(["--output_dir", str(tmp_path), "--dataloader_drop_last", "false"])[2] \
        .dataloader_drop_last is False
    # lr_factor is refused with hf only when given: its default, and the hf recipes that leave it out, are fine
    recipe = tmp_path / "hf.yaml"
    recipe.write_text("output_dir: out\nlr_schedule: hf\nlearning_rate: 0.001\n")
    assert parse_arguments([str(recipe)])[2].lr_factor == 1.0
    recipe.write_text("output_dir: out\nlr_schedule: hf\nlr_factor: 2\n")
    with pytest.raises(ValueError, match="lr_factor=2 has no effect with lr_schedule=hf"):
        parse_arguments([str(recipe)])


def test_a_synthetic_task_beside_a_dataset_is_an_error(tmp_path):
    """--synthetic_task with --dataset_name: the dataset would be trained on and the task only written (before, so
    without a word)."""
    with pytest.raises(ValueError, match=r"Both --synthetic_task \(reverse\) and --dataset_name \(some/data\) given"):
        run_from_args(["--output_dir", str(tmp_path / "out"), "--do_train", "--synthetic_task", "reverse",
                       "--dataset_name", "some/data", "--use_cpu", "--report_to", "none"])  # fmt: skip


def test_a_preset_beside_a_config_name_and_tokenizer_options_beside_a_tokenizer_name_are_errors(tmp_path):
    """--preset with --config_name (the config sets the model; the preset's would be dropped while its training
    values applied) and --tokenizer_vocab_size / --tokenizer_model with --tokenizer_name or --model_name_or_path
    (whose tokenizer is used as it is) are errors
    naming what to do. A recipe's preset and tokenizer options give way to a config or tokenizer given (the shipped
    recipes set them; the ablations' rows add a shared tokenizer), and --preset with --model_name_or_path gives the
    preset's training values, as documented."""

    def parsed(*argv):
        return parse_arguments(["--output_dir", str(tmp_path), *argv])

    with pytest.raises(ValueError, match=r"preset=big has no effect on the model with config_name=cfg, whose config "
                       r"sets it .*training values .*would still apply: leave preset out"):
        parsed("--config_name", "cfg", "--preset", "big")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: out\nconfig_name: cfg\n")
    with pytest.raises(ValueError, match="preset=base has no effect on the model with config_name=cfg"):
        parse_arguments([str(recipe), "--preset", "base"])
    for flags, said in ((["--tokenizer_vocab_size", "8000"], "tokenizer_vocab_size=8000"),
                        (["--tokenizer_model", "wordpiece"], "tokenizer_model=wordpiece")):
        for key, value in (("tokenizer_name", "tok"), ("model_name_or_path", "model")):  # (the model's tokenizer)
            with pytest.raises(ValueError, match=rf"{said} has no effect with {key}={value}, whose tokenizer is used "
                               rf"as it is.*leave it out, or leave {key} out"):
                parsed(f"--{key}", value, *flags)
    # what stays: the preset's training values with a given model; a recipe's preset and tokenizer options replaced
    model_args, _, args = parsed("--model_name_or_path", "model", "--preset", "big")
    assert (model_args.preset, args.max_steps) == ("big", 300_000)
    recipe.write_text("output_dir: out\npreset: big\ntokenizer_vocab_size: 8000\ntokenizer_model: wordpiece\n")
    model_args, _, args = parse_arguments([str(recipe), "--config_name", "cfg", "--tokenizer_name", "tok"])
    assert (model_args.config_name, model_args.tokenizer_name, args.max_steps) == ("cfg", "tok", 300_000)
    assert parsed("--tokenizer_vocab_size", "8000")[0].tokenizer_vocab_size == 8000  # training one: taken


def test_label_smoothing_outside_0_1_and_a_learning_rate_factor_not_above_0_are_errors(tmp_path):
    """label_smoothing_factor outside [0, 1] (F.cross_entropy's range: the GPU loss refuses it, the CPU loss would
    train with it) and lr_factor <= 0 (a negative one climbs the loss, 0 trains nothing), nan or inf are errors
    naming the flag, the value and the range; the ends of the smoothing range are taken."""
    logits, labels = torch.randn(3, 7, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 2, 3])
    torch.nn.functional.cross_entropy(logits, labels, label_smoothing=1.0)  # torch's range includes 1
    with pytest.raises(RuntimeError, match="between 0.0 and 1.0"):
        torch.nn.functional.cross_entropy(logits, labels, label_smoothing=1.5)

    def parsed(*argv):
        return parse_arguments(["--output_dir", str(tmp_path), *argv])[2]

    for value in ("1.5", "-0.1", "nan"):
        with pytest.raises(ValueError, match=rf"label_smoothing_factor must be in \[0, 1\] .*got {value}\."):
            parsed("--label_smoothing_factor", value)
    for value in ("-0.45", "0.0", "inf", "nan"):
        with pytest.raises(ValueError, match=rf"lr_factor must be positive and finite .*got {value}\."):
            parsed("--lr_factor", value)
    assert [parsed("--label_smoothing_factor", v).label_smoothing_factor for v in ("0", "1")] == [0.0, 1.0]
    assert parsed("--lr_factor", "1e-6").lr_factor == 1e-6


def test_unknown_recipe_key_lists_valid_ones(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("output_dir: o\nmax_tokens_per_bach: 10\n")
    with pytest.raises(ValueError) as err:
        load_recipe(recipe)
    message = str(err.value)
    assert "bad.yaml" in message and "max_tokens_per_bach" in message and "'max_tokens_per_batch'" in message
    assert "Valid keys:" in message and "warmup_steps" in message and "preset" in message


def test_a_recipe_key_given_twice_and_a_sample_count_below_1_are_errors(tmp_path):
    """A key given twice in a YAML or JSON recipe (nested config_overrides too) is an error naming it and where (YAML
    and json kept the last one without a word); --max_*_samples 0 is an error (it left a split without pairs, which
    failed later with datasets' 'Column name [...] not in the dataset')."""
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("max_steps: 800\nwarmup_steps: 4\nmax_steps: 5\n")
    with pytest.raises(ValueError, match=r"twice\.yaml: 'max_steps' is given twice \(lines 1 and 3\); keep one"):
        load_recipe(recipe)
    recipe.write_text("config_overrides:\n  d_model: 32\n  d_model: 64\n")
    with pytest.raises(ValueError, match=r"'d_model' is given twice \(lines 2 and 3\)"):
        load_recipe(recipe)
    recipe = tmp_path / "twice.json"
    recipe.write_text('{"max_steps": 800, "warmup_steps": 4, "max_steps": 5}')
    with pytest.raises(ValueError, match=r"twice\.json: 'max_steps' given twice; keep one"):
        load_recipe(recipe)
    for flag in ("--max_train_samples", "--max_eval_samples", "--max_predict_samples"):
        with pytest.raises(ValueError, match=rf"{flag[2:]} must be at least 1, got 0"):
            parse_arguments(["--output_dir", str(tmp_path), flag, "0"])


def test_unknown_preset_and_config_field(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=20)
    with pytest.raises(ValueError, match="Unknown preset 'huge'.*Valid presets: base, big"):
        run_from_args(tiny_args(data, tmp_path / "out", "--preset", "huge"))
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['d_modle'\].*Valid fields:.*d_model"):
        parse_config_overrides("d_modle=3")


def test_tokenizer_config_mismatch_fails_before_training(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="Tokenizer and model config disagree.*vocab_size=100"):
        run_from_args(tiny_args(data, out, "--config_overrides", TINY_MODEL + ",vocab_size=100", "--max_steps", "2"))
    assert not list(out.glob("checkpoint-*")) and not (out / "trainer_state.json").exists()


def test_a_generation_config_folder_given_on_the_command_line_is_saved_with_the_arguments(tmp_path):
    """`--generation_config DIR` (Seq2SeqTrainer loads it into the model) came out of the parser as a Path, which
    the Trainer's `save_state` (the arguments as JSON) could not write: the run failed after training."""
    training_args = parse_arguments(["--output_dir", str(tmp_path), "--generation_config", str(tmp_path)])[2]
    assert json.loads(training_args.to_json_string())["generation_config"] == str(tmp_path)


def test_max_source_or_target_length_below_1_is_an_error(tmp_path):
    """A limit below 1 keeps no pair (every side ends with </s>): 0 was silently the default (max_tokens_per_batch), a
    negative value dropped every training pair. Both are refused when the arguments are parsed; 1 is taken."""
    for name in ("max_source_length", "max_target_length"):
        for value in ("0", "-1"):
            with pytest.raises(ValueError, match=rf"{name} must be at least 1 \(the </s> token\), got {value};"):
                parse_arguments(["--output_dir", str(tmp_path), f"--{name}", value])
        assert getattr(parse_arguments(["--output_dir", str(tmp_path), f"--{name}", "1"])[1], name) == 1
    for value in ("0.5", "nan"):  # below 1 dropped every pair; NaN kept every pair (no comparison holds)
        with pytest.raises(ValueError, match=rf"max_length_ratio \(longer side / shorter side\) must be at least 1, "
                                             rf"got {value}\."):
            parse_arguments(["--output_dir", str(tmp_path), "--max_length_ratio", value])
    assert parse_arguments(["--output_dir", str(tmp_path), "--max_length_ratio", "1"])[1].max_length_ratio == 1


def test_training_whose_filters_drop_every_pair_is_an_error_naming_the_counts_and_limits(tmp_path):
    """A run whose length or ratio filters leave no training pair stops before the trainer is built, naming each rule's
    count and the flag or model limit behind it, instead of making 0 updates and saving an untrained model as trained
    (its card, training_summary.json, evaluation). Only the tokenizer the filters needed is in output_dir."""
    data = write_fixture(tmp_path / "data", n_train=20)  # every pair: 2 to 6 words, so at least 3 tokens a side
    out = tmp_path / "out"
    cases = [
        (["--max_source_length", "3", "--max_target_length", "2"],  # every pair breaks both: the first rule counts
         "source_too_long 20 (more than 3 source tokens, </s> included, set by --max_source_length 3)."),
        (["--max_tokens_per_batch", "2"],
         "source_too_long 20 (more than 2 source tokens, </s> included, set by --max_tokens_per_batch 2, the default "
         "of --max_source_length)."),
        (["--config_overrides", TINY_MODEL + ",position_encoding=learned,max_position_embeddings=2"],
         "source_too_long 20 (more than 2 source tokens, </s> included, set by max_position_embeddings=2 of the "
         "model's learned positions)."),
        (["--max_source_length", "50", "--max_tokens_per_batch", "2"],  # a longer pair would fit no batch
         "source_too_long 20 (more than 2 source tokens, </s> included, set by --max_tokens_per_batch 2, a batch's "
         "most tokens, below --max_source_length 50)."),
    ]
    for flags, named in cases:
        with pytest.raises(ValueError) as error:
            run_from_args(tiny_args(data, out, "--max_steps", "2", "--do_eval", *flags))
        assert str(error.value) == (f"The filters dropped all 20 training pairs, so training would make no update: "
                                    f"{named} Raise the limits named, or check the training data.")  # fmt: skip
        assert sorted(p.name for p in out.iterdir()) == ["tokenizer"]
    # no training pair asked for, before anything is written (a data file without pairs is the loader's error)
    with pytest.raises(ValueError) as error:
        run_from_args(tiny_args(data, tmp_path / "out2", "--max_steps", "2", "--max_train_samples", "0"))
    assert str(error.value) == ("max_train_samples must be at least 1, got 0; leave it out to keep every pair (or "
                                "leave out the --do_* flag of that split).")
    assert not (tmp_path / "out2").exists()


def test_a_tokenizer_trained_earlier_in_the_output_dir_is_reused_only_with_the_same_options(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "1"))
    trained = (out / "tokenizer" / "tokenizer.json").read_bytes()
    shutil.rmtree(out / "checkpoint-1")  # a new run refuses the earlier run's checkpoints, not its tokenizer
    for flags, said in ((["--tokenizer_vocab_size", "400"], "--tokenizer_vocab_size 400 (it has 300)"),
                        (["--tokenizer_model", "wordpiece"], "--tokenizer_model 'wordpiece' (it has 'bpe')")):
        with pytest.raises(ValueError, match=f"holds a tokenizer an earlier run trained with .*{re.escape(said)}"):
            run_from_args(tiny_args(data, out, "--max_steps", "1", *flags))
    # other data: a tokenizer left by a run on another corpus does not fit this one's (it was reused before)
    other = write_fixture(tmp_path / "other", n_train=40, seed=1)
    said = f"--train_file {str(other / 'train')!r} (it has {str(data / 'train')!r})"
    with pytest.raises(ValueError, match=f"holds a tokenizer an earlier run trained with .*{re.escape(said)}"):
        run_from_args(tiny_args(other, out, "--max_steps", "1"))
    run_from_args(tiny_args(data, out, "--max_steps", "1"))  # the same options: reused as it is
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == trained


# ---------------------------------------------------------------------------------------- end to end


def test_train_script_loss_falls_and_evaluates(tmp_path):
    data = write_fixture(tmp_path / "data")
    out = tmp_path / "out"
    result = run_script(tiny_args(data, out, "--max_steps", "40", "--save_steps", "20", "--save_total_limit", "2",
                                  "--do_predict", "--test_file", str(data / "valid"), "--generation_num_beams", "2",
                                  "--average_last_checkpoints", "2", "--num_translation_examples", "2"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    curve = losses(out / "trainer_state.json")
    assert sorted(curve) == list(range(1, 41))
    first, last = sum(curve[s] for s in range(1, 6)) / 5, sum(curve[s] for s in range(36, 41)) / 5
    assert last < first - 1.0, curve
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["summary"]["updates"] == 40 and summary["summary"]["target_tokens_seen"] > 40 * 20
    assert "test_bleu" in summary["test"] and len(summary["examples"]) == 2
    assert summary["filtered"]["splits"]["train"]["total"] == 400  # the length filter's report, per split
    assert (out / "averaged" / "model.safetensors").is_file()
    assert "Training summary" in result.stdout and "Test BLEU" in result.stdout
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-40"]


def test_push_to_hub_uploads_the_tested_averaged_model_with_its_scores_once_the_run_is_over(tmp_path, monkeypatch):
    """--push_to_hub with averaging: the last upload is the averaged model that was tested, with its card's test
    score, and no training state (before: transformers pushed the final weights right after training, before
    averaging and scoring, with a card without scores; nothing after). The Hub is a recorder (no network): what
    transformers' checkpoint pushes and ours upload, and in which order."""
    from concurrent.futures import Future

    from huggingface_hub import HfApi

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id if "/" in repo_id else f"me/{repo_id}"})()

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, ignore_patterns=None, run_as_future=False,
                      **kwargs):  # fmt: skip
        root = Path(folder_path)
        files = sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file())
        files = [f for f in files if not any(Path(f).match(p) or Path(f.split("/")[0]).match(p)
                                             for p in ignore_patterns or [])]  # fmt: skip
        card = root / "README.md"
        uploads.append({"message": commit_message, "repo_id": repo_id, "files": files,
                        "weights": (root / "model.safetensors").read_bytes(),
                        "card": card.read_text() if card.is_file() else ""})  # fmt: skip
        done = Future()
        done.set_result(type("CommitInfo", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})())
        return done if run_as_future else done.result()

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    data = write_fixture(tmp_path / "data", n_train=60)
    out = tmp_path / "out"
    result = run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "2", "--average_last_checkpoints",
                                     "2", "--do_predict", "--test_file", str(data / "valid"), "--push_to_hub",
                                     "--hub_model_id", "me/tiny"))  # fmt: skip
    assert [u["message"] for u in uploads] == ["Training in progress, step 2", "Training in progress, step 4",
                                               "End of training"]  # fmt: skip
    last = uploads[-1]
    assert last["repo_id"] == "me/tiny" and result["pushed"] == "https://hub.example/me/tiny/commit/1"
    assert last["weights"] == (out / "averaged" / "model.safetensors").read_bytes()
    assert last["weights"] != (out / "model.safetensors").read_bytes()  # (the final weights, not averaged)
    test_bleu = json.loads((out / "averaged" / "test_results.json").read_text())["test_bleu"]
    assert f"| {test_bleu:.2f} |" in last["card"] and "| checkpoints averaged | 2 |" in last["card"]
    assert {"config.json", "generation_config.json", "pipeline.py", "modeling_vaswani_transformer.py",
            "tokenizer.json"} <= set(last["files"])  # fmt: skip
    assert not [f for f in last["files"] if f.startswith(("checkpoint-", "averaged")) or f.endswith((".pt", ".pth"))]


def test_evaluation_sets_are_scored_whole_and_long_sources_truncated_with_a_warning(tmp_path, caplog):
    """The length and ratio filters drop training pairs only: every test pair is translated and scored; a source
    longer than the model can take (12 learned positions) is cut to its first 12 tokens with a warning naming it. A
    longer reference is scored whole (chrF of the written translations against the test file's references, by
    sacreBLEU itself), its loss over the first 12 tokens, with a warning naming it (before, the decoder stopped the job
    after training). The line named is the file's own: in a TSV validation file after its header line too."""
    import sacrebleu

    data = write_fixture(tmp_path / "data", n_train=200)
    valid = [f"{t}\t{s}\n" for s, t in zip(*((data / f"valid.{x}").read_text().splitlines() for x in ("src", "tgt")))]
    valid.insert(2, "Y\t" + " ".join(["ba", "ke", "mi", "po", "su"] * 8) + "\n")  # too long, on line 4 after the header
    (data / "valid.tsv").write_text("tgt\tsrc\n" + "".join(valid), encoding="utf-8")
    test = [("ba", "BA"), ("da ge ki mo", "X"), ("nu pa", "PA NU")] * 2  # ratio and length: dropped if filtered
    test.insert(3, (" ".join(["ba", "ke", "mi", "po", "su"] * 8), "Y"))  # 40 words: longer than 12 positions
    test.append(("nu pa", " ".join(["PA", "NU", "KE", "MI"] * 6)))  # a reference longer than 12 positions
    (data / "test.src").write_text("".join(s + "\n" for s, _ in test), encoding="utf-8")
    (data / "test.tgt").write_text("".join(t + "\n" for _, t in test), encoding="utf-8")
    out = tmp_path / "out"
    result = run_from_args(tiny_args(
        data, out, "--config_overrides", TINY_MODEL + ",position_encoding=learned,max_position_embeddings=12",
        "--max_steps", "2", "--max_length_ratio", "1.5", "--max_source_length", "6", "--do_predict",
        "--test_file", str(data / "test"), "--generation_num_beams", "1", "--per_device_eval_batch_size", "8",
        "--validation_file", str(data / "valid.tsv"),
    ))  # fmt: skip
    splits = result["filtered"]["splits"]
    assert splits["train"]["kept"] < splits["train"]["total"]  # the training filters did drop pairs
    assert splits["test"]["total"] == splits["test"]["kept"] == 8  # nothing dropped, for any rule
    assert not any(count for rule, count in splits["test"].items() if rule not in ("total", "kept"))
    assert splits["validation"]["kept"] == splits["validation"]["total"] == 13
    hypotheses = (out / "test_translations.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hypotheses) == len(test)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "the source has" in r.getMessage()]
    assert len(warned) == 2 and warned[0].startswith(f"{data / 'valid.tsv'}:4: the source has ")
    assert warned[1].startswith(f"{data / 'test'}:4: the source has ")
    assert all("scoring its first 12 tokens" in w for w in warned)
    references = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{data / 'test'}:")
                  and "the reference has" in r.getMessage()]  # fmt: skip
    assert len(references) == 1 and references[0].startswith(f"{data / 'test'}:8: the reference has ")
    assert "BLEU scores it whole, the loss counts its first 12 tokens" in references[0]
    assert result["test"]["test_chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [[t for _, t in test]]).score)
    assert math.isfinite(result["test"]["test_loss"])


class _RecordModel(TrainerCallback):
    """Keeps what the Trainer trains: its attention kernel and whether its steps run under bf16 autocast."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.kernel = model.config._attn_implementation

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.bf16 = args.bf16


def test_attn_implementation_picks_the_training_kernel_and_is_not_saved(tmp_path):
    """--attn_implementation eager (the fast kernel for bf16 on CPU) trains; the saved model loads with the default."""
    from transformers import AutoModelForSeq2SeqLM

    data = write_fixture(tmp_path / "data", n_train=40)
    out, record = tmp_path / "out", _RecordModel()
    run_from_args(tiny_args(data, out, "--max_steps", "3", "--bf16", "true", "--attn_implementation", "eager"), callbacks=[record])
    assert (record.kernel, record.bf16) == ("eager", True)
    assert all(torch.isfinite(torch.tensor(v)) for v in losses(out / "trainer_state.json").values())
    assert "_attn_implementation" not in json.loads((out / "config.json").read_text())
    assert AutoModelForSeq2SeqLM.from_pretrained(out).config._attn_implementation == "sdpa"


def test_bf16_where_native_follows_the_cpu_and_bf16_on_cpu_trains_with_eager_attention(tmp_path, caplog):
    """--bf16_where_native trains in bf16 exactly where the CPU lists avx512_bf16 or amx_bf16, and then (no kernel
    given) with eager attention, the faster one for bf16 on a CPU; plain --bf16 does too, with a warning where the
    CPU emulates bf16 (several times slower than fp32); the model saves sdpa."""
    if not helpers.cpu_flags():
        pytest.skip("needs Linux /proc/cpuinfo to know the CPU's features independently")
    native = helpers.multiplies_by_flags(torch.bfloat16)
    data = write_fixture(tmp_path / "data", n_train=40)
    for flags, bf16 in ((("--bf16_where_native", "true"), native), (("--bf16", "true"), True)):
        out, record = tmp_path / flags[0].strip("-"), _RecordModel()
        caplog.clear()
        run_from_args(tiny_args(data, out, "--max_steps", "2", *flags), callbacks=[record])
        assert (record.bf16, record.kernel) == (bf16, "eager" if bf16 else "sdpa"), flags
        assert json.loads((out / "config.json").read_text()).get("_attn_implementation") is None
        warned = [r.getMessage() for r in caplog.records if "in software" in r.getMessage()]
        assert len(warned) == (flags[0] == "--bf16" and not native), (flags, warned)


def test_fp16_training_on_a_cpu_that_emulates_it_is_warned_about(tmp_path, caplog):
    """--fp16 on a CPU without AVX-512 FP16 or AMX-FP16 (most CPUs) is kept, with a warning that names the flag."""
    if not helpers.cpu_flags():
        pytest.skip("needs Linux /proc/cpuinfo to know the CPU's features independently")
    caplog.set_level(logging.WARNING)
    VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, fp16=True)
    warned = [r.getMessage() for r in caplog.records if "in software" in r.getMessage()]
    if helpers.multiplies_by_flags(torch.float16):
        assert warned == []
    else:
        assert len(warned) == 1 and "--fp16" in warned[0] and "float16" in warned[0], warned


_MALLOC_PROBE = helpers.MALLINFO_PRELUDE + """
from vaswani_transformer.hardware import keep_freed_cpu_memory

def mapped_while_holding_64_mb():
    before = libc.mallinfo2().hblkhd
    block = torch.empty(16 << 20)  # 64 MB of float32
    return libc.mallinfo2().hblkhd - before

default = mapped_while_holding_64_mb()
kept = keep_freed_cpu_memory()
print(json.dumps({"default": default, "kept": kept, "after": mapped_while_holding_64_mb()}))
"""


def test_keep_freed_cpu_memory_serves_large_blocks_from_the_heap():
    """glibc maps a 64 MB block on its own (returned to the OS when freed); after the call it comes from the heap."""
    probe = subprocess.run([sys.executable, "-c", _MALLOC_PROBE], capture_output=True, text=True, check=True)
    result = json.loads(probe.stdout)
    if result is None:
        pytest.skip("not glibc (no mallinfo2): keep_freed_cpu_memory is a no-op there")
    assert result["default"] >= 64 << 20 and result["kept"] is True and result["after"] == 0


_ONEDNN_PROBE = """
import sys, torch
from vaswani_transformer.trainer import keep_onednn_primitives

if sys.argv[1] == "kept":
    keep_onednn_primitives()  # before the first product, as the training job does
weight = torch.ones(32, 32, dtype=torch.bfloat16)
for _ in range(2):  # 1,100 shapes, twice: more than oneDNN's default 1,024 kernels
    for rows in range(1, 1101):
        torch.mm(torch.ones(rows, 32, dtype=torch.bfloat16), weight)
"""


@pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="bf16 products do not go through oneDNN on this CPU",
)
def test_keep_onednn_primitives_keeps_the_kernels_of_more_shapes_than_the_default():
    """oneDNN compiles a kernel per product shape (its verbose log says `create:cache_miss`) and by default keeps the
    latest 1,024: the second pass over 1,100 shapes compiles them all again; after the call, none."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    env.update(helpers.SINGLE_THREAD_ENV, ONEDNN_VERBOSE="all")
    compiled = {}
    for mode in ("default", "kept"):
        run = subprocess.run([sys.executable, "-c", _ONEDNN_PROBE, mode], capture_output=True, text=True, env=env,
                             check=True)  # fmt: skip
        compiled[mode] = run.stdout.count("create:cache_miss")
    assert 1000 <= compiled["kept"] <= 1150 and compiled["default"] >= 2 * compiled["kept"] - 20, compiled


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_prepare_kernels_keeps_attention_off_cudnn_on_a_gpu_only(device, monkeypatch):
    """cuDNN's attention plans every new shape (measured on an H100: bf16 updates on changing token batches 6-8x
    slower); a training job on a GPU turns it off for its process, one on a CPU leaves the switch as it was."""
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        prepare_kernels(torch.device(device), keep_freed_memory=False)
        assert torch.backends.cuda.cudnn_sdp_enabled() == (device == "cpu")
        assert ("ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ) == (device == "cpu")
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


@pytest.mark.slow
def test_a_cpu_run_that_accelerate_left_at_one_thread_warns(tmp_path, monkeypatch):
    """`accelerate launch script.py` on a CPU sets OMP_NUM_THREADS=1 (its default without --num_cpu_threads_per_process):
    the training job warns that cores stay idle and says how to use them. With `--cpu --num_processes 1` accelerate
    gives the process the physical cores, and nothing is said; `python script.py` is not warned either. (The job runs
    under the default launcher; the quiet launcher runs the warning's own check in the environment it gives.)"""
    if min(psutil.cpu_count(logical=False) or 1, len(os.sched_getaffinity(0))) < 2:
        pytest.skip("needs 2 physical cores for an idle one")
    data = write_fixture(tmp_path / "data", n_train=40)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(SCRIPT.parents[1]))
    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    run = subprocess.run([*accelerate, str(SCRIPT), *tiny_args(data, tmp_path / "default", "--max_steps", "1")],
                         capture_output=True, text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "accelerate launch set OMP_NUM_THREADS=1. Pass it --cpu --num_processes 1" in run.stderr, run.stderr[-3000:]
    probe = tmp_path / "probe.py"
    probe.write_text("import torch\nfrom vaswani_transformer.train import idle_cpu_cores_warning\n"
                     "print(repr(idle_cpu_cores_warning(torch.device('cpu'))))\n", encoding="utf-8")  # fmt: skip
    quiet = subprocess.run([*accelerate, "--cpu", "--num_processes", "1", str(probe)], capture_output=True, text=True,
                           env=env, timeout=300, check=False)  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout.strip().splitlines()[-1] == "None", quiet.stdout[-3000:]
    # `python script.py`, even with OMP_NUM_THREADS=1 set by hand: this process, which no launcher started
    assert not any(k.startswith("ACCELERATE_") for k in os.environ)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert idle_cpu_cores_warning(torch.device("cpu")) is None


class _PoisonWeights(TrainerCallback):
    """Fault injection: make the weights NaN just before update `at + 1` (after checkpoint `at` was saved)."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))


def test_nan_loss_stops_naming_the_update_and_keeps_last_checkpoint(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=100)
    out = tmp_path / "out"
    with pytest.raises(NonFiniteLossError, match="at update 5") as stopped:
        run_from_args(tiny_args(data, out, "--max_steps", "10", "--save_steps", "2"), callbacks=[_PoisonWeights(4)])
    assert f"The last checkpoint, {out / 'checkpoint-4'}, is from before this update" in str(stopped.value)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert find_last_complete_checkpoint(out) == str(out / "checkpoint-4")
    weights = load_file(out / "checkpoint-4" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    # no checkpoint written yet: the message says so (and none is written for the NaN weights)
    with pytest.raises(NonFiniteLossError, match=f"at update 1: .*No checkpoint was written in {tmp_path / 'out2'}"):
        run_from_args(tiny_args(data, tmp_path / "out2", "--max_steps", "10", "--save_strategy", "no"),
             callbacks=[_PoisonWeights(0)])  # fmt: skip
    assert not list((tmp_path / "out2").glob("checkpoint-*"))


class _CountSaves(TrainerCallback):
    def __init__(self):
        self.saved_at = []

    def on_save(self, args, state, control, **kwargs):
        self.saved_at.append(state.global_step)


def test_end_of_training_is_a_checkpoint_and_is_averaged(tmp_path):
    """With time-based saves only (save_strategy no, every 60 minutes) the last update is still saved as a checkpoint
    and averaged; when the last update is saved anyway, it is saved once."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out, saves = tmp_path / "out", _CountSaves()
    result = run_from_args(tiny_args(data, out, "--max_steps", "3", "--save_strategy", "no", "--save_every_minutes", "60",
                            "--average_last_checkpoints", "5"), callbacks=[saves])  # fmt: skip
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"] and saves.saved_at == [3]
    record = json.loads((out / "averaged" / "averaged_checkpoints.json").read_text())
    assert record["checkpoints"] == [str(out / "checkpoint-3")] and result["averaged_model"] == str(out / "averaged")
    final = load_file(out / "model.safetensors")
    for name, tensor in load_file(out / "checkpoint-3" / "model.safetensors").items():
        assert torch.equal(tensor, final[name]), name  # the checkpoint holds the final weights
    out2, saves2 = tmp_path / "out2", _CountSaves()
    run_from_args(tiny_args(data, out2, "--max_steps", "4", "--save_steps", "2"), callbacks=[saves2])
    assert saves2.saved_at == [2, 4]
    assert sorted(p.name for p in out2.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    # save_strategy epoch: the epoch's end saves the last update, once (it was saved, then rewritten in place), also
    # when time-based saves and the time budget ask for it at that update
    out3, saves3 = tmp_path / "out3", _CountSaves()
    run_from_args(tiny_args(data, out3, "--max_steps", "3", "--save_strategy", "epoch", "--save_every_minutes",
                            "1e-9", "--max_train_minutes", "1e-9"), callbacks=[saves3])  # fmt: skip
    assert saves3.saved_at == [1] and sorted(p.name for p in out3.glob("checkpoint-*")) == ["checkpoint-1"]
    out4, saves4 = tmp_path / "out4", _CountSaves()
    run_from_args(tiny_args(data, out4, "--max_steps", "3", "--save_strategy", "epoch"), callbacks=[saves4])
    assert saves4.saved_at == [3]


def test_wall_clock_callbacks_save_and_stop_when_their_minutes_have_passed():
    """Time-based saving asks for a checkpoint once its interval has passed and counts again from that save; the time
    budget stops training and saves once its minutes have passed since training began."""
    from transformers import TrainerControl, TrainerState

    from vaswani_transformer.trainer import SaveEveryMinutesCallback, TimeBudgetCallback

    state, seconds = TrainerState(global_step=3), 0.05
    saver, budget = SaveEveryMinutesCallback(seconds / 60), TimeBudgetCallback(seconds / 60)
    for callback in (saver, budget):
        callback.on_train_begin(None, state, TrainerControl())
    control = TrainerControl()
    for callback in (saver, budget):
        callback.on_step_end(None, state, control)
    assert not (control.should_save or control.should_training_stop)  # too early
    time.sleep(seconds)
    saved = saver.on_step_end(None, state, TrainerControl())
    assert saved.should_save and not saved.should_training_stop
    saver.on_save(None, state, saved)  # the clock restarts at the save
    assert not saver.on_step_end(None, state, TrainerControl()).should_save
    stopped = budget.on_step_end(None, state, TrainerControl())
    assert stopped.should_training_stop and stopped.should_save


class _Records(logging.Handler):
    """Keeps the messages of a logger (transformers' loggers do not propagate to pytest's caplog)."""

    def __init__(self, name: str):
        super().__init__(logging.WARNING)
        self.messages, self.logger = [], logging.getLogger(name)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)


def _run_validated_every_2_updates(tmp_path, *flags: str) -> Path:
    """A tiny run validated (loss only) every 2 updates, averaging its last 2 checkpoints; its output folder."""
    data = write_fixture(tmp_path / "data", n_train=60)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--eval_strategy", "steps", "--eval_steps", "2", "--do_eval",
                            "--predict_with_generate", "false", "--metric_for_best_model", "loss",
                            "--average_last_checkpoints", "2", *flags))  # fmt: skip
    return out


def test_save_strategy_best_still_saves_and_averages_the_last_update(tmp_path):
    """save_strategy best saves where an evaluation finds a new best; the last update is saved too, and averaged
    (before, transformers' rule replaced the end-of-training save: the run ended with checkpoint-2 alone and averaged
    it). A loss that is 'better' when greater makes update 4 no new best."""
    out = _run_validated_every_2_updates(tmp_path, "--max_steps", "4", "--save_strategy", "best",
                                         "--greater_is_better", "true")  # fmt: skip
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    averaged = json.loads((out / "averaged" / "averaged_checkpoints.json").read_text())["checkpoints"]
    assert [Path(p).name for p in averaged] == ["checkpoint-2", "checkpoint-4"]


def test_with_load_best_model_at_end_the_run_folder_s_score_is_its_weights(tmp_path):
    """load_best_model_at_end leaves the best checkpoint's weights in the run folder: its validation score is theirs
    (before, the last update's logged score was written beside them). Here the validation loss rises again at the
    last update, so that checkpoint-4 is the best."""
    out = _run_validated_every_2_updates(tmp_path, "--max_steps", "6", "--save_steps", "2",
                                         "--load_best_model_at_end", "true")  # fmt: skip
    state = json.loads((out / "trainer_state.json").read_text())
    logged = {h["step"]: h["eval_loss"] for h in state["log_history"] if "eval_loss" in h and "step" in h}
    best = int(state["best_model_checkpoint"].rsplit("-", 1)[1])
    assert best != 6 and (out / "model.safetensors").read_bytes() == \
        (out / f"checkpoint-{best}" / "model.safetensors").read_bytes()
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] == pytest.approx(logged[best], rel=1e-6)


def test_a_resumed_run_uses_its_own_save_and_logging_intervals(tmp_path):
    """transformers restores the checkpoint's intervals with its trainer state; the resumed run's flags apply instead:
    saved every 4 updates and logged every 2 at first, then every 2 and every update from update 4 to 8."""
    data = write_fixture(tmp_path / "data", n_train=60)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "4", "--logging_steps", "2"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    run_from_args(tiny_args(data, out, "--max_steps", "8", "--save_steps", "2", "--logging_steps", "1",
                            "--resume_from_checkpoint", "latest"))  # fmt: skip
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]
    assert sorted(losses(out / "trainer_state.json")) == [1, 2, 4, 5, 6, 7, 8]  # (update 1 is always logged)


class _RecordRates(TrainerCallback):
    """The learning rate each optimizer update uses, by update number (1-based)."""

    def __init__(self):
        self.rates = {}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.rates[state.global_step + 1] = optimizer.param_groups[0]["lr"]


def test_a_run_resumed_with_another_schedule_uses_it_from_its_first_update(tmp_path):
    """Resumed with another lr_factor and warmup_steps, every update from the first resumed one uses the paper's
    formula with the new values (the optimizer's state brings back the rate of the checkpoint's schedule), and the
    log shows the rate used (the scheduler's saved last rate had the first resumed update logged at the old one)."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out, record = tmp_path / "out", _RecordRates()
    run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "4"))  # lr_factor 3, warmup 10
    args = tiny_args(data, out, "--max_steps", "7", "--save_steps", "4", "--resume_from_checkpoint", "latest")
    args[args.index("--lr_factor") + 1], args[args.index("--warmup_steps") + 1] = "6", "5"
    run_from_args(args, callbacks=[record])
    assert sorted(record.rates) == [5, 6, 7]
    for n, rate in record.rates.items():
        assert rate == pytest.approx(6 * 32**-0.5 * min(n**-0.5, n * 5**-1.5), rel=1e-12), n
    logged = logged_rates(out / "trainer_state.json")
    assert {n: logged[n] for n in record.rates} == pytest.approx(record.rates, rel=1e-12)


def test_a_run_resumed_with_another_learning_rate_under_a_transformers_schedule_uses_it(tmp_path):
    """lr_schedule=hf (transformers' linear schedule, warmup 2 of 8 updates): resumed with another learning_rate and
    warmup (6), every update from the first resumed one uses the new rate times the new schedule's factor (before,
    the checkpoint's scheduler state kept the old rate without a word), and the log shows the rate used."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out, first, resumed = tmp_path / "out", _RecordRates(), _RecordRates()

    def hf_args(rate: str, warmup: str, *extra: str, output_dir: Path = out) -> list[str]:
        args = tiny_args(data, output_dir, "--lr_schedule", "hf", "--learning_rate", rate, "--lr_scheduler_type", "linear",
                         "--max_steps", "8", "--save_steps", "4", *extra)  # fmt: skip
        i = args.index("--lr_factor")
        args[args.index("--warmup_steps") + 1] = warmup
        return args[:i] + args[i + 2:]  # (lr_factor has no effect with lr_schedule=hf)

    def linear(n: int, warmup: int) -> float:  # transformers' linear schedule over 8 updates, for update n (1-based)
        step = n - 1
        return step / warmup if step < warmup else max(0.0, (8 - step) / (8 - warmup))

    run_from_args(hf_args("1e-3", "2"), callbacks=[first])
    run_from_args(hf_args("4e-3", "6", "--resume_from_checkpoint", str(out / "checkpoint-4"),
                          output_dir=tmp_path / "resumed"), callbacks=[resumed])  # fmt: skip
    assert sorted(first.rates) == list(range(1, 9)) and sorted(resumed.rates) == [5, 6, 7, 8]
    assert first.rates == pytest.approx({n: 1e-3 * linear(n, 2) for n in first.rates}, rel=1e-12)
    assert resumed.rates == pytest.approx({n: 4e-3 * linear(n, 6) for n in resumed.rates}, rel=1e-12)
    for run, rates in ((out, first.rates), (tmp_path / "resumed", resumed.rates)):
        logged = logged_rates(run / "trainer_state.json")
        assert {n: logged[n] for n in rates} == pytest.approx(rates, rel=1e-12), run


@pytest.mark.parametrize("warmup_type, decay_type, min_lr_ratio, num_cycles", [
    ("linear", "cosine", 0.0, 0.5), ("cosine", "linear", 0.1, 0.5), ("1-sqrt", "1-sqrt", 0.0, 0.5),
    ("linear", "cosine", 0.2, 0.8),
])  # fmt: skip
def test_the_clock_placed_decay_is_transformers_warmup_stable_decay_with_the_placed_numbers(
    warmup_type, decay_type, min_lr_ratio, num_cycles
):
    """Before its decay is placed the peak is held after the warmup; placed at update 37 for 25 updates it gives, at
    every step, what transformers' get_wsd_schedule gives with 37 - warmup stable updates and 25 decay updates."""
    from transformers import get_wsd_schedule

    from vaswani_transformer.trainer import ClockedWarmupStableDecay

    shape = dict(warmup_type=warmup_type, decay_type=decay_type, min_lr_ratio=min_lr_ratio, num_cycles=num_cycles)
    decay = ClockedWarmupStableDecay(8, **shape)
    reference = get_wsd_schedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), num_warmup_steps=8,
                                 num_decay_steps=25, num_stable_steps=37 - 8, **shape).lr_lambdas[0]  # fmt: skip
    assert [decay(s) for s in range(8)] == pytest.approx([reference(s) for s in range(8)], abs=1e-15)
    assert [decay(s) for s in range(8, 500)] == [1.0] * 492
    decay.decay_start, decay.decay_steps = 37, 25
    assert [decay(s) for s in range(70)] == pytest.approx([reference(s) for s in range(70)], abs=1e-15)
    with pytest.raises(ValueError, match="decay_type 'exp' is not one of warmup_stable_decay's"):
        ClockedWarmupStableDecay(8, decay_type="exp")


class _ClockOfUpdates(TrainerCallback):
    """A clock at which each update takes one second: the trainer's clock reads the number of updates trained."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    time = monotonic

    def on_train_begin(self, args, state, control, **kwargs):
        self.now = float(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):  # (added first: runs before the trainer's callbacks)
        self.now = float(state.global_step)


def test_lr_decay_minutes_anneals_over_the_budget_s_last_minutes_and_a_resumed_run_ends_where_planned(
    tmp_path, monkeypatch
):
    """Budget 2 minutes, the decay over the last 0.5, at one update a second: the decay begins after update 90 (the
    budget's last 30 s) and gets the 30 updates the speed says fit, so training ends at update 120 at the budget, each
    update at transformers' warmup_stable_decay rate with 10 warmup, 80 stable and 30 decay updates. The placement is
    recorded for the plots, and a run resumed inside the decay (checkpoint 100) ends at the same update with the same
    rates, whatever its own clock says."""
    import vaswani_transformer.trainer as trainer_module
    from vaswani_transformer.plots import learning_rate_schedule

    data = write_fixture(tmp_path / "data", n_train=40)
    out, clock, record = tmp_path / "out", _ClockOfUpdates(), _RecordRates()
    monkeypatch.setattr(trainer_module, "time", clock)

    def clocked(output_dir: Path, *extra: str) -> list[str]:
        args = tiny_args(data, output_dir, "--lr_schedule", "hf", "--learning_rate", "1e-3", "--lr_scheduler_type",
                         "warmup_stable_decay", "--max_train_minutes", "2", "--lr_decay_minutes", "0.5",
                         "--max_steps", "1000", "--save_steps", "100", "--logging_steps", "1", *extra)  # fmt: skip
        i = args.index("--lr_factor")
        return args[:i] + args[i + 2:]

    def wsd(n: int) -> float:  # transformers' schedule, update n (1-based) at the rate after n - 1 scheduler steps
        from transformers import get_wsd_schedule

        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        return 1e-3 * get_wsd_schedule(optimizer, 10, 30, num_training_steps=120).lr_lambdas[0](n - 1)

    run_from_args(clocked(out), callbacks=[clock, record])
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 120 and state["max_steps"] == 120
    assert state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["placed"] == {"decay_start": 90,
                                                                                        "decay_steps": 30}
    assert record.rates == pytest.approx({n: wsd(n) for n in range(1, 121)}, rel=1e-12, abs=1e-18)
    assert record.rates[91] == 1e-3 and record.rates[120] < 0.01 * 1e-3  # held to update 91, annealed at the end
    assert logged_rates(out / "trainer_state.json") == pytest.approx(record.rates, rel=1e-12, abs=1e-18)
    schedule = learning_rate_schedule(out)  # the plots draw the rates the run used
    assert schedule.max_steps == 120 and schedule.rates(range(1, 121)) == pytest.approx(
        [record.rates[n] for n in range(1, 121)], rel=1e-12, abs=1e-18)
    recipe = tmp_path / "recipe.yaml"  # a recipe's: known only once a run has placed it
    recipe.write_text("output_dir: out\nlr_schedule: hf\nlr_scheduler_type: warmup_stable_decay\nlearning_rate: 0.001\n"
                      "warmup_steps: 10\nmax_steps: 1000\nmax_train_minutes: 2\nlr_decay_minutes: 0.5\n")
    with pytest.raises(ValueError, match="lr_decay_minutes=0.5 places the decay by the clock"):
        learning_rate_schedule(recipe)
    resumed = _RecordRates()
    run_from_args(clocked(tmp_path / "resumed", "--resume_from_checkpoint", str(out / "checkpoint-100")),
                  callbacks=[clock, resumed])  # fmt: skip
    assert sorted(resumed.rates) == list(range(101, 121))
    assert resumed.rates == pytest.approx({n: record.rates[n] for n in resumed.rates}, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("flags, message", [
    (["--lr_decay_minutes", "1"], r"it needs max_train_minutes above it \(now None\)"),
    (["--lr_decay_minutes", "2", "--max_train_minutes", "2"], r"it needs max_train_minutes above it \(now 2.0\)"),
    (["--lr_decay_minutes", "1", "--max_train_minutes", "2"], r"lr_schedule=hf and lr_scheduler_type=warmup_stable_"
                                                              r"decay \(now paper and linear\)"),
    (["--lr_decay_minutes", "1", "--max_train_minutes", "2", "--lr_schedule", "hf", "--lr_scheduler_type", "cosine"],
     r"\(now hf and cosine\)"),
    (["--lr_decay_minutes", "1", "--max_train_minutes", "2", "--lr_schedule", "hf", "--lr_scheduler_type",
      "warmup_stable_decay", "--lr_scheduler_kwargs", '{"num_decay_steps": 5}'],
     r"\['num_decay_steps'\] with lr_decay_minutes: the clock places the decay"),
    (["--lr_decay_minutes", "1", "--max_train_minutes", "2", "--lr_schedule", "hf", "--lr_scheduler_type",
      "warmup_stable_decay", "--lr_scheduler_kwargs", '{"decay": "linear"}'], r"\['decay'\] .* not arguments of"),
    (["--lr_decay_minutes", "1", "--max_train_minutes", "2", "--lr_schedule", "hf", "--lr_scheduler_type",
      "warmup_stable_decay", "--warmup_steps", "0.1"], r"needs warmup_steps in updates, got 0.1"),
    (["--lr_decay_minutes", "-1", "--max_train_minutes", "2"], r"lr_decay_minutes must be positive, got -1.0"),
])  # fmt: skip
def test_lr_decay_minutes_without_a_longer_budget_or_beside_another_schedule_is_an_error(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        parse_arguments(["--output_dir", str(tmp_path), *flags])
    given = parse_arguments(["--output_dir", str(tmp_path), "--lr_decay_minutes", "1", "--max_train_minutes", "2",
                             "--lr_schedule", "hf", "--lr_scheduler_type", "warmup_stable_decay",
                             "--lr_scheduler_kwargs", '{"decay_type": "linear", "min_lr_ratio": 0.1}'])[2]  # fmt: skip
    assert given.lr_decay_minutes == 1.0 and given.lr_scheduler_kwargs == {"decay_type": "linear", "min_lr_ratio": 0.1}


def test_running_a_finished_job_again_with_resume_latest_trains_nothing_more(tmp_path):
    """A finished run (max_steps 7, not a whole number of epochs) run again with --resume_from_checkpoint latest (a
    re-queued job): no update past max_steps, the same final weights, no new checkpoint. Before, transformers' loop
    trained update 8 (and 9 on the next rerun), saved it and averaged it in."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    args = tiny_args(data, out, "--max_steps", "7", "--save_steps", "4", "--resume_from_checkpoint", "latest")
    run_from_args(args)
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 7 and state["epoch"] != int(state["epoch"]), state["epoch"]  # inside an epoch
    weights = load_file(out / "model.safetensors")
    result = run_from_args(args)
    assert result["summary"]["updates"] == 7 and result["summary"]["updates_this_run"] == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-7"]
    again = load_file(out / "model.safetensors")
    assert all(torch.equal(weights[k], again[k]) for k in weights)


def test_resuming_an_older_checkpoint_beside_newer_ones_is_refused_before_anything_is_written(tmp_path):
    """Rolling back to checkpoint-2 of a run that went on to checkpoint-6 in the same --output_dir: the newer ones
    (another branch of training) would be averaged, rotated and resumed as this run's (before: averaged/ was the
    abandoned branch's checkpoints). Refused naming them; resuming the newest, or into a new folder, is fine."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "6", "--save_steps", "2"))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    rollback = tiny_args(data, out, "--max_steps", "4", "--save_steps", "2", "--lr_factor", "1",
                         "--resume_from_checkpoint", str(out / "checkpoint-2"))  # fmt: skip
    with pytest.raises(ValueError, match=rf"resume_from_checkpoint={re.escape(str(out / 'checkpoint-2'))} is older "
                       r"than checkpoint-4, checkpoint-6 in --output_dir .*would average, rotate and resume them as "
                       r"its own.*a new --output_dir"):
        run_from_args(rollback)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    elsewhere = tiny_args(data, tmp_path / "branch", "--max_steps", "4", "--save_steps", "2",
                          "--resume_from_checkpoint", str(out / "checkpoint-2"))  # fmt: skip
    assert run_from_args(elsewhere)["summary"]["updates_this_run"] == 2


def test_resuming_with_other_batching_warns_that_the_epoch_is_not_continued_exactly(tmp_path, caplog):
    """max_tokens_per_batch, the data seed or the training pairs changed on resume: transformers skips as many
    batches of the new order as the checkpoint trained, so part of the epoch is trained twice or not at all (before:
    without a word; the seed and the data were not checked until 2026-11-29). A warning names the change; resuming
    with the same settings does not warn."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "3", "--save_steps", "3"))
    more = write_fixture(tmp_path / "more", n_train=44)
    reuse = ("--tokenizer_name", str(out / "tokenizer"))  # (the run's tokenizer, with other training text)
    for change, warned in ((("--max_tokens_per_batch", "160"), None), (("--max_tokens_per_batch", "240"),
                           "max_tokens_per_batch 160 -> 240"), (("--seed", "12"), "data_seed 3 -> 12"),
                           (("--train_file", str(more / "train"), *reuse), "train_pairs 40 -> 44")):  # fmt: skip
        caplog.clear()
        args = tiny_args(data, out, "--max_steps", "4", "--save_steps", "4", "--resume_from_checkpoint", "latest",
                         *change[2:])  # fmt: skip
        args[args.index(change[0]) + 1] = change[1]
        with caplog.at_level(logging.WARNING, logger="vaswani_transformer.trainer"):
            run_from_args(args)
        messages = [r.getMessage() for r in caplog.records if "Resumed with other batching" in r.getMessage()]
        assert bool(messages) == bool(warned), (change, messages)
        if warned:
            assert f"({warned})" in messages[0], messages
        shutil.rmtree(out / "checkpoint-4")  # resume checkpoint-3 again


def test_a_new_run_into_a_folder_with_checkpoints_is_refused_before_anything_is_written(tmp_path, capsys):
    """A run that does not resume refuses an output_dir holding an earlier run's checkpoints (its averaging, rotation
    and a later --resume_from_checkpoint latest would take them for its own) before it trains or writes anything;
    the command line says so in one line, exit status 1."""
    from vaswani_transformer.train import main

    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "2"))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = tiny_args(data, out, "--max_steps", "2", "--seed", "11", "--average_last_checkpoints", "2")
    said = (rf"--output_dir {re.escape(str(out))} holds checkpoints of an earlier run \(checkpoint-2, checkpoint-4\).*"
            r"a new --output_dir.*--resume_from_checkpoint latest.*delete its checkpoint-\* folders")
    with pytest.raises(ValueError, match=said):
        run_from_args(again)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(again)
    assert stopped.value.code == 1
    assert re.fullmatch(rf"\S+: error: {said}\.\n", capsys.readouterr().err)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing trained, written or moved


def test_resuming_a_save_only_model_run_is_an_error_and_its_weights_start_a_new_run(tmp_path):
    """--resume_from_checkpoint latest after a --save_only_model run (checkpoints without optimizer and scheduler
    states) is an error naming save_only_model and what to do, before anything is moved or written; what it says to
    do, a new run from the checkpoint's weights, trains."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "2", "--save_only_model", "true"))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    latest = out / "checkpoint-4"
    with pytest.raises(ValueError, match=rf"{re.escape(str(latest))} was saved with save_only_model .*cannot resume "
                       rf"from it.*--model_name_or_path {re.escape(str(latest))} and a new --output_dir"):
        run_from_args(tiny_args(data, out, "--max_steps", "6", "--save_steps", "2", "--save_only_model", "true",
                                "--resume_from_checkpoint", "latest"))  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # no checkpoint moved aside as incomplete
    args = tiny_args(data, tmp_path / "new", "--max_steps", "1", "--model_name_or_path", str(latest))
    at = args.index("--config_overrides")
    del args[at : at + 2]  # (a new model's option)
    assert run_from_args(args)["summary"]["updates"] == 1


def test_resume_latest_skips_a_truncated_checkpoint_and_keeps_totals(tmp_path):
    """--resume_from_checkpoint latest passes over a checkpoint whose model.safetensors is cut short (moved aside);
    the resumed run ends with the same losses and totals as the uninterrupted one, and logs no false missing keys."""
    data = write_fixture(tmp_path / "data", n_train=60)
    out = tmp_path / "out"
    first = run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "2"))["summary"]
    expected = losses(out / "trainer_state.json")
    weights = out / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with _Records("transformers") as warned:
        resumed = run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint",
                                 "latest"))  # fmt: skip
    assert (out / "incomplete-checkpoint-4" / "model.safetensors").is_file()
    assert not [m for m in warned.messages if "missing keys" in m], warned.messages
    got = losses(out / "trainer_state.json")
    for step in (3, 4):
        assert got[step] == pytest.approx(expected[step], abs=1e-6)
    summary = resumed["summary"]
    assert (summary["updates"], summary["updates_this_run"]) == (4, 2)
    # totals cover updates 1-4 like the uninterrupted run; this run's figures cover updates 3-4
    assert summary["target_tokens_seen"] == first["target_tokens_seen"]
    assert summary["source_tokens_seen"] == first["source_tokens_seen"]
    saved = json.loads((out / "incomplete-checkpoint-4" / "trainer_state.json").read_text())
    at_2 = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["stateful_callbacks"]
    before = at_2["TrainingTotalsCallback"]["attributes"]["target"]
    assert 0 < before < first["target_tokens_seen"] and saved["global_step"] == 4
    assert summary["target_tokens_this_run"] == first["target_tokens_seen"] - before
    assert summary["wall_time_seconds"] >= summary["wall_time_seconds_this_run"] > 0


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_recipes_parse(recipe, monkeypatch):
    monkeypatch.chdir(REPO)
    model_args, data_args, training_args = parse_arguments([f"configs/{recipe}", "--use_cpu", "true"])  # bf16 recipes need a GPU or use_cpu
    assert data_args.source_lang or data_args.synthetic_task
    parse_config_overrides(model_args.config_overrides)
    VaswaniTransformerConfig.from_preset(model_args.preset, **parse_config_overrides(model_args.config_overrides))
    # The paper's schedule everywhere but the short Multi30k recipes, which anneal to 0 for a budget of updates.
    short = recipe in ("multi30k_cpu_short.yaml", "multi30k_cpu_12min.yaml")
    assert training_args.lr_schedule == ("hf" if short else "paper")
    # alpha chosen on validation in the Multi30k CPU recipes: minutes of training translate too short at the paper's 0.6
    assert (data_args.length_penalty_grid is not None) == recipe.startswith("multi30k_cpu")
    assert training_args.adam_beta2 == 0.98


def test_learning_curve_and_schedule_plots(tmp_path):
    from vaswani_transformer.plots import learning_curve, plot_learning_curve, plot_lr_schedule

    state = {"log_history": [{"step": 1, "loss": 5.0, "learning_rate": 1e-4}, {"step": 2, "loss": 4.0},
                             {"step": 2, "eval_loss": 4.5, "eval_bleu": 1.5}, {"step": 2, "train_runtime": 3.0}]}  # fmt: skip
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    curves = learning_curve(tmp_path)
    assert curves["loss"] == [(1, 5.0), (2, 4.0)] and curves["eval_bleu"] == [(2, 1.5)]
    assert curves["learning_rate"] == [(1, 1e-4)]
    png = plot_learning_curve(tmp_path / "trainer_state.json", tmp_path / "curve.png", extra={"BLEU": 1.5})
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(plot_lr_schedule(tmp_path / "lr.png", total_steps=10000)).stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="No trainer_state.json"):
        learning_curve(tmp_path / "missing")


def test_synthetic_tasks(tmp_path):
    from vaswani_transformer.data import load_parallel_dataset
    from vaswani_transformer.synthetic import generate_pairs, number_to_words, write_synthetic_task

    assert number_to_words(0) == "zero" and number_to_words(40) == "forty" and number_to_words(99) == "ninety-nine"
    assert number_to_words(1205) == "one thousand two hundred five"
    assert number_to_words(300_017) == "three hundred thousand seventeen"
    assert number_to_words(2_000_001) == "two million one"
    splits = generate_pairs("reverse", {"train": 300, "test": 50}, seed=1)
    assert not {s for s, _ in splits["train"]} & {s for s, _ in splits["test"]}
    for source, target in splits["test"]:
        assert len(source.split()) == len(target.split()) and target == target.upper()
    assert generate_pairs("copy", {"a": 5}, seed=2) == generate_pairs("copy", {"a": 5}, seed=2)
    paths = write_synthetic_task(tmp_path, "numbers", train_size=30, validation_size=5, test_size=5)
    data = load_parallel_dataset(train_file=paths["train"], test_file=paths["test"], source_lang="num", target_lang="en")
    assert len(data["train"]) == 30 and number_to_words(int(data["test"][0]["translation"]["num"])) == data["test"][0]["translation"]["en"]
    with pytest.raises(ValueError, match="Unknown synthetic task 'sort'. Valid tasks: numbers, reverse, copy"):
        generate_pairs("sort", {"train": 1})
    with pytest.raises(ValueError, match="only 10 distinct"):
        generate_pairs("numbers", {"train": 6}, max_number=9)


def test_length_penalty_chosen_on_validation_set(tmp_path):
    """`VaswaniSeq2SeqTrainer.choose_length_penalty` decodes the validation set with each alpha (`predict`) and keeps
    the best sacreBLEU in the model's generation config. The references are the model's own beam-4 translations with
    alpha 3, which alpha 0 changes for 2 of the 6 sentences: alpha 3 must win with 100, and each score must be what
    `evaluate_model` gives independently with that alpha."""
    from datasets import Dataset

    from vaswani_transformer.data import TranslationDataCollator
    from vaswani_transformer.evaluation import evaluate_model, make_compute_metrics

    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, seed=22, init_std=0.02, scale_embedding=True)
    model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 12
    references = helpers.generate_texts(model, tokenizer, helpers.SOURCES, length_penalty=3.0)
    changed = helpers.generate_texts(model, tokenizer, helpers.SOURCES, length_penalty=0.0)
    assert sum(a != b for a, b in zip(references, changed)) == 2  # the fixture: alpha changes some translations
    validation = Dataset.from_dict({
        "input_ids": [tokenizer(s).input_ids for s in helpers.SOURCES],
        "labels": [tokenizer(r).input_ids for r in references],
    })  # fmt: skip
    args = VaswaniTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none",
                                    per_device_eval_batch_size=4, disable_tqdm=True)  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args, data_collator=TranslationDataCollator(tokenizer),
                                    processing_class=tokenizer, compute_metrics=make_compute_metrics(tokenizer, "de"))
    record = trainer.choose_length_penalty(validation, [0.0, 3.0])
    assert record["chosen"] == 3.0 and record["default"] == 0.6
    assert model.generation_config.length_penalty == 3.0
    assert record["validation_bleu"][3.0] == pytest.approx(100.0)
    for alpha, score in record["validation_bleu"].items():
        independent = evaluate_model(model, helpers.SOURCES, references, tokenizer=tokenizer, target_lang="de",
                                     decoding={"length_penalty": alpha})["sacrebleu"]  # fmt: skip
        assert score == pytest.approx(independent), alpha
    assert 0.0 < record["validation_bleu"][0.0] < 100.0  # sacreBLEU 47.9: alpha made a measurable difference


def test_evaluation_and_test_sets_keep_their_order_whatever_the_sampling_strategy(tmp_path):
    """`predict` with train_sampling_strategy group_by_length (with token batches, what training does anyway): the
    predictions follow the dataset's rows, each the model's translation of that sentence alone (transformers would read
    the set through a shuffled LengthGroupedSampler)."""
    from datasets import Dataset

    from vaswani_transformer.data import TranslationDataCollator

    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, seed=12, init_std=0.02, scale_embedding=True)
    model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 10
    ids = [tokenizer(s).input_ids for s in helpers.SOURCES]
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
                                    per_device_eval_batch_size=2, train_sampling_strategy="group_by_length")
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args, data_collator=TranslationDataCollator(tokenizer),
                                    processing_class=tokenizer)  # fmt: skip
    output = trainer.predict(Dataset.from_dict({"input_ids": ids, "labels": ids}))
    predictions = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
    alone = helpers.generate_one_by_one(model, tokenizer, helpers.SOURCES)
    assert len(set(alone)) == len(alone)  # the fixture: every sentence has its own translation
    assert tokenizer.batch_decode(predictions, skip_special_tokens=True) == alone


def test_predictions_under_mixed_precision_are_the_saved_models_translations(tmp_path):
    """With bf16 mixed precision (`--bf16`, `--bf16_where_native`), `predict` (the test score, the length penalty's
    choice on validation, the evaluations during training) decodes as the saved model decodes wherever it is loaded:
    its float32 weights, no autocast; the loss keeps the training's precision. Before, accelerate's autocast wrapper
    decoded in bf16, so a run's test score was not its published model's (Multi30k's 12-minute model: 36.64 against
    the 36.77 that `vaswani-evaluate` gives, 61 of 1,000 translations different)."""
    import copy

    from datasets import Dataset

    from vaswani_transformer.data import TranslationDataCollator

    tokenizer = helpers.tiny_tokenizer()
    model = helpers.tiny_translation_model(tokenizer, seed=12, init_std=0.02, scale_embedding=True)
    model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 10
    saved = copy.deepcopy(model)  # what save_pretrained writes: the same float32 weights, no accelerate wrapper
    ids = [tokenizer(s).input_ids for s in helpers.SOURCES]
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=True, report_to="none",
                                    disable_tqdm=True, per_device_eval_batch_size=2)  # fmt: skip
    trainer = VaswaniSeq2SeqTrainer(model=model, args=args, data_collator=TranslationDataCollator(tokenizer),
                                    processing_class=tokenizer)  # fmt: skip
    trainer.accelerator.prepare_model(model)  # as after Trainer.train: its forward under bf16 autocast
    output = trainer.predict(Dataset.from_dict({"input_ids": ids, "labels": ids}))
    predictions = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
    assert tokenizer.batch_decode(predictions, skip_special_tokens=True) == helpers.generate_one_by_one(
        saved, tokenizer, helpers.SOURCES)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the fixture: bf16 changes translations
        in_bf16 = helpers.generate_one_by_one(saved, tokenizer, helpers.SOURCES)
    assert in_bf16 != helpers.generate_one_by_one(saved, tokenizer, helpers.SOURCES)
    # With --torch_compile the unwrapped model is torch's compiled wrapper, whose `generate` runs the module inside.
    wrapped = model.__dict__["forward"]
    with forward_as_saved(torch.compile(model)):
        assert model.__dict__["forward"] == model._original_forward
    assert model.__dict__["forward"] is wrapped


def test_token_batches_load_with_the_dataloader_flags_as_transformers_loader(tmp_path):
    """--dataloader_persistent_workers, _prefetch_factor, _multiprocessing_context, _in_order and the worker seeding
    reach the token-batch training DataLoader as they reach transformers' own (the same arguments, no token batches)."""
    from datasets import Dataset
    from transformers.trainer_utils import seed_worker

    from vaswani_transformer.data import TokenBatchSampler, TranslationDataCollator

    tokenizer = helpers.tiny_tokenizer()
    ids = [tokenizer(s).input_ids for s in helpers.SOURCES]
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", dataloader_num_workers=2,
                                    dataloader_persistent_workers=True, dataloader_prefetch_factor=7,
                                    dataloader_multiprocessing_context="spawn", dataloader_in_order=False)  # fmt: skip
    loaders = {}
    for tokens in (64, None):
        trainer = VaswaniSeq2SeqTrainer(model=helpers.tiny_translation_model(tokenizer), args=args,
                                        train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}),
                                        data_collator=TranslationDataCollator(tokenizer), processing_class=tokenizer,
                                        max_tokens_per_batch=tokens)  # fmt: skip
        loaders[tokens] = trainer.get_train_dataloader()  # inspected, not iterated: no worker is started
    ours, theirs = loaders[64], loaders[None]
    assert isinstance(ours.batch_sampler, TokenBatchSampler)  # token batches still
    assert (ours.num_workers, ours.persistent_workers, ours.prefetch_factor, ours.in_order) == (2, True, 7, False)
    assert ours.multiprocessing_context.get_start_method() == "spawn"
    for name in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "in_order"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.multiprocessing_context) is type(theirs.multiprocessing_context)
    for loader in (ours, theirs):  # each worker seeded by rank and worker number
        assert (loader.worker_init_fn.func, loader.worker_init_fn.keywords) == (seed_worker, {"num_workers": 2,
                                                                                            "rank": 0})  # fmt: skip


def test_choose_length_penalty_rule():
    """The best score wins; on a tie the first value listed (the paper's 0.6 first keeps it); each value is scored
    once; no values is an error."""
    from vaswani_transformer.evaluation import choose_length_penalty

    calls = []

    def score(alpha):
        calls.append(alpha)
        return {0.6: 30.0, 1.0: 31.5, 1.4: 31.5}[alpha]

    assert choose_length_penalty(score, [0.6, 1.4, 1.0, 0.6]) == {
        "chosen": 1.4, "validation_bleu": {0.6: 30.0, 1.4: 31.5, 1.0: 31.5}
    }  # fmt: skip
    assert calls == [0.6, 1.4, 1.0]
    assert choose_length_penalty(lambda alpha: 0.0, [0.6, 1.0])["chosen"] == 0.6
    with pytest.raises(ValueError, match="at least one length penalty"):
        choose_length_penalty(score, [])


def test_length_penalty_grid_in_a_training_run(tmp_path):
    """`--length_penalty_grid` after training and averaging: the chosen alpha goes into the averaged (tested) model's
    generation_config.json and the run's results; the tiny run's translations score 0 for every alpha, so the first
    listed wins. Without a validation set it is an error before any training."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    result = run_from_args(tiny_args(data, out, "--max_steps", "2", "--save_steps", "2", "--average_last_checkpoints",
                                     "1", "--length_penalty_grid", "1.5", "0.6"))  # fmt: skip
    record = result["length_penalty"]
    assert list(record["validation_bleu"]) == [1.5, 0.6] and record["chosen"] == 1.5
    assert json.loads((out / "averaged" / "generation_config.json").read_text())["length_penalty"] == 1.5
    assert json.loads((out / "training_summary.json").read_text())["length_penalty"]["chosen"] == 1.5
    no_validation = [a for a in tiny_args(data, tmp_path / "out2", "--length_penalty_grid", "1.0")
                     if a not in ("--validation_file", str(data / "valid"))]  # fmt: skip
    with pytest.raises(ValueError, match="length_penalty_grid=\\[1.0\\] chooses alpha by validation BLEU"):
        run_from_args(no_validation)
    assert not (tmp_path / "out2").exists() or not list((tmp_path / "out2").glob("checkpoint-*"))


def test_the_tested_model_is_scored_as_it_decodes_when_saved_whatever_generation_num_beams_says(tmp_path, caplog):
    """transformers' `--generation_num_beams` decodes the validation during training; the test score (and the
    grid's alpha) are the saved model's own decoding: its test_translations.txt is what `translate_lines` gives the
    saved folder. Before, the test was decoded greedily while the saved model and its card said beam 4."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from vaswani_transformer.translate import translate_lines

    data = write_fixture(tmp_path / "data", n_train=60, n_valid=16)
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="vaswani_transformer.train"):
        result = run_from_args(tiny_args(data, out, "--max_steps", "6", "--do_predict", "--test_file",
                                         str(data / "valid"), "--generation_num_beams", "1", "--eval_strategy",
                                         "steps", "--eval_steps", "3"))  # fmt: skip
    assert "generation_num_beams=1 decoded the validation during training" in caplog.text
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.generation_config.num_beams == 4
    sources = (data / "valid.src").read_text(encoding="utf-8").splitlines()
    saved = translate_lines(model, tokenizer, sources)
    greedy = translate_lines(model, tokenizer, sources, num_beams=1)
    assert saved != greedy  # (else this run could not tell the two apart)
    assert (out / "test_translations.txt").read_text(encoding="utf-8").splitlines() == saved
    assert result["test"]["test_length_penalty"] == model.generation_config.length_penalty


def test_do_eval_and_do_predict_without_their_set_are_errors_before_any_work(tmp_path):
    """--do_eval without a validation set (also when --eval_strategy sets it) and --do_predict without a test set are
    errors naming the missing file flag, before a tokenizer is trained or an update made (before, they were skipped
    silently)."""
    data = write_fixture(tmp_path / "data", n_train=40)
    out = tmp_path / "out"
    without_validation = [a for a in tiny_args(data, out, "--max_steps", "2")
                          if a not in ("--validation_file", str(data / "valid"))]  # fmt: skip
    for flags, message in (
        (["--do_eval"], "--do_eval scores the validation set, but there is none: give --validation_file"),
        (["--eval_strategy", "steps"], r"--do_eval \(set by --eval_strategy steps\) scores the validation set"),
    ):
        with pytest.raises(ValueError, match=message):
            run_from_args(without_validation + flags)
    with pytest.raises(ValueError, match="--do_predict scores the test set, but there is none: give --test_file"):
        run_from_args(tiny_args(data, out, "--max_steps", "2", "--do_predict"))
    assert not (out / "tokenizer").exists() and not list(out.glob("checkpoint-*"))


def test_evaluating_during_training_leaves_the_training_unchanged(tmp_path):
    """Evaluations every 4 updates (the loss and BLEU of beam-search decoding) leave a run's losses and final weights
    exactly as without them: the evaluation's DataLoader draws a seed from torch's generator, the one the dropout
    masks come from (before the fix the losses parted from the 5th update on)."""
    data = write_fixture(tmp_path / "data", n_train=80)
    common = ("--max_steps", "12", "--config_overrides", TINY_MODEL.replace("dropout=0.1", "dropout=0.3"),
              "--generation_num_beams", "2")
    run_from_args(tiny_args(data, tmp_path / "plain", *common))
    run_from_args(tiny_args(data, tmp_path / "evaluated", *common, "--eval_strategy", "steps", "--eval_steps", "4"))
    history = json.loads((tmp_path / "evaluated" / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "eval_bleu" in h] == [4, 8, 12]
    assert losses(tmp_path / "evaluated" / "trainer_state.json") == losses(tmp_path / "plain" / "trainer_state.json")
    plain, evaluated = (load_file(tmp_path / name / "model.safetensors") for name in ("plain", "evaluated"))
    assert all(torch.equal(plain[key], evaluated[key]) for key in plain)


def test_averaging_reports_the_validation_score_before_it(tmp_path, caplog, capsys):
    """With averaging and do_eval, the results hold the validation metrics of the model before averaging: the numbers
    a run without averaging (same seed and data) reports for its final model, whether the Trainer evaluated at the
    last update (reused; evaluations leave the training as it was) or not (evaluated then). Both scores are printed, and a warning says when averaging made the
    score worse: here the loss (no decoding), after 12 fast-changing updates averaged with the 4th and 8th."""
    data = write_fixture(tmp_path / "data", n_train=80)
    common = ("--max_steps", "12", "--save_steps", "4", "--do_eval", "--predict_with_generate", "false")
    plain = run_from_args(tiny_args(data, tmp_path / "plain", *common))
    evaluated = run_from_args(tiny_args(data, tmp_path / "evaluated", *common, "--average_last_checkpoints", "3"))
    reused = run_from_args(tiny_args(data, tmp_path / "reused", *common, "--average_last_checkpoints", "3",
                                     "--eval_strategy", "steps", "--eval_steps", "6"))  # fmt: skip
    final_loss = plain["eval"]["eval_loss"]
    assert "eval_before_averaging" not in plain
    for result in (evaluated, reused):
        assert result["eval_before_averaging"]["eval_loss"] == pytest.approx(final_loss, rel=1e-6)
        assert result["eval"]["eval_loss"] > final_loss  # the averaged model, worse here
    assert json.loads((tmp_path / "reused" / "training_summary.json").read_text())["eval_before_averaging"] == \
        reused["eval_before_averaging"]
    printed = capsys.readouterr().out
    assert printed.count(f"Validation loss: {evaluated['eval']['eval_loss']:.4g} averaged (last 3 checkpoints), "
                         f"{final_loss:.4g} before averaging") == 2
    warned = [r.getMessage() for r in caplog.records if "made the validation loss worse" in r.getMessage()]
    assert len(warned) == 2 and warned[0].startswith("Averaging the last 3 checkpoints made the validation loss worse")


def test_averaging_is_compared_at_one_decoding_and_each_folder_describes_its_own_model(tmp_path, capsys):
    """Averaging, a length penalty grid, do_eval and do_predict. The validation references are the starting model's own
    beam-4 translations with alpha 3, which alpha 0.6 changes for 2 of the 6 sentences; training barely moves the
    weights (lr_factor 1e-6), so alpha 3 scores 100. The scores before and after averaging are both decoded with the
    default alpha 0.6, below 100 (each records its alpha; before, the averaged one was the grid's 100); the grid's
    alpha applies after, to the tested score. The averaged/ folder (alpha 3) holds the test results, translations and
    a card with them; the run folder (final weights, alpha 0.6) holds the score before averaging and a card without a
    test score (before, it showed the averaged model's). Three checkpoints are asked for and two exist: the print and
    the card say 2 (before, 3). vaswani-push's export of either folder carries the same scores and recipe as the
    folder's own card (before: no scores, no tokens per batch, no averaging)."""
    model_dir, out = tmp_path / "model", tmp_path / "out"
    model, tokenizer = helpers.save_tiny_model(model_dir, seed=22, init_std=0.02, scale_embedding=True)
    references = helpers.generate_texts(model, tokenizer, helpers.SOURCES, length_penalty=3.0)
    assert sum(a != b for a, b in zip(references, helpers.generate_texts(model, tokenizer, helpers.SOURCES))) == 2
    data = write_fixture(tmp_path / "data", n_train=60)
    (data / "valid.src").write_text("".join(s + "\n" for s in helpers.SOURCES), encoding="utf-8")
    (data / "valid.tgt").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    args = tiny_args(data, out, "--model_name_or_path", str(model_dir), "--lr_factor", "1e-6", "--max_steps", "4",
                     "--save_steps", "2", "--average_last_checkpoints", "3", "--length_penalty_grid", "0.6", "3.0",
                     "--do_eval", "--do_predict", "--test_file", str(data / "valid"))  # fmt: skip
    result = run_from_args([a for a in args if a not in ("--config_overrides", TINY_MODEL)])
    before, after, tested = (result[k] for k in ("eval_before_averaging", "eval_averaged", "eval"))
    grid = result["length_penalty"]
    assert before["eval_length_penalty"] == after["eval_length_penalty"] == grid["default"] == 0.6
    assert tested["eval_length_penalty"] == grid["chosen"] == 3.0
    assert before["eval_bleu"] == pytest.approx(after["eval_bleu"]) == pytest.approx(grid["validation_bleu"][0.6])
    assert after["eval_bleu"] < 99 and tested["eval_bleu"] == pytest.approx(100.0)
    assert (f"Validation BLEU: {after['eval_bleu']:.4g} averaged (last 2 checkpoints), {before['eval_bleu']:.4g} "
            "before averaging, both decoded with length penalty 0.6") in capsys.readouterr().out
    # each folder: its weights' decoding, results and card
    averaged = out / "averaged"
    assert json.loads((out / "generation_config.json").read_text())["length_penalty"] == 0.6
    assert json.loads((averaged / "generation_config.json").read_text())["length_penalty"] == 3.0
    assert json.loads((averaged / "test_results.json").read_text()) == pytest.approx(result["test"])
    assert json.loads((averaged / "eval_results.json").read_text()) == pytest.approx(tested)
    assert json.loads((out / "eval_results.json").read_text()) == pytest.approx(before)
    assert not (out / "test_results.json").exists() and not (out / "test_translations.txt").exists()
    assert (averaged / "test_translations.txt").read_text(encoding="utf-8").split("\n")[:-1] == references
    cards = {folder: (folder / "README.md").read_text(encoding="utf-8") for folder in (out, averaged)}
    assert "| test split | sacreBLEU | 100.00 |" in cards[averaged]
    assert "| validation split | sacreBLEU | 100.00 |" in cards[averaged]
    assert "| checkpoints averaged | 2 |" in cards[averaged]
    assert "test split" not in cards[out]
    assert f"| validation split | sacreBLEU | {before['eval_bleu']:.2f} |" in cards[out]
    assert "| tokens per batch per process (each side) | 160 |" in cards[out]

    def score_and_recipe_rows(card: str) -> list[str]:
        return [line for line in card.split("\n") if line.startswith(("| test split", "| validation split"))] + \
            card.split("\n## Training\n")[1].split("\n## ")[0].split("\n")

    for folder in (out, averaged):
        exported = export_repository(folder, tmp_path / f"export-{folder.name}")
        assert score_and_recipe_rows((exported / "README.md").read_text(encoding="utf-8")) == \
            score_and_recipe_rows(cards[folder])


def test_averaging_with_a_kept_best_checkpoint_needs_room_for_the_last_n(tmp_path):
    """save_total_limit's rotation keeps the best checkpoint (load_best_model_at_end) besides the newest: averaging the
    last N with save_total_limit <= N is refused up front (the best could stand in for a deleted newer one); with
    save_total_limit N + 1 the last N averaged are the N newest updates' checkpoints while an earlier best is kept."""
    data = write_fixture(tmp_path / "data", n_train=60)
    best = ("--eval_strategy", "steps", "--eval_steps", "2", "--predict_with_generate", "false", "--do_eval",
            "--load_best_model_at_end", "true", "--metric_for_best_model", "loss", "--greater_is_better", "true")
    out = tmp_path / "out"
    common = (*best, "--max_steps", "12", "--save_steps", "2", "--average_last_checkpoints", "2")
    for limit in ("1", "2"):
        with pytest.raises(ValueError, match=rf"average_last_checkpoints=2 with save_total_limit={limit} and a best "
                           r"model tracked \(metric_for_best_model=loss\).*save_total_limit to at least 3"):
            parse_arguments(tiny_args(data, out, *common, "--save_total_limit", limit))
    assert parse_arguments(tiny_args(data, out, "--max_steps", "8", "--save_total_limit", "2",
                                     "--average_last_checkpoints", "2"))[1].average_last_checkpoints == 2  # no best
    # loss with greater_is_better: the highest validation loss is the best (at update 6 here), an early-peaking metric
    run_from_args(tiny_args(data, out, *common, "--save_total_limit", "3"))
    best_step = int(json.loads((out / "trainer_state.json").read_text())["best_model_checkpoint"].rsplit("-", 1)[1])
    assert best_step < 10  # (else this run would not test the rotation)
    kept = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert kept == sorted([best_step, 10, 12])
    averaged = json.loads((out / "averaged" / "averaged_checkpoints.json").read_text())["checkpoints"]
    assert averaged == [str(out / "checkpoint-10"), str(out / "checkpoint-12")]


def test_gradient_norm_logged_without_computing_it_every_update(tmp_path):
    """Without clipping, the gradient norm is computed only for the updates the log shows (first, every 2nd): the log
    has it at updates 1, 2 and 4 with the values that a run whose clipping computes it anyway (max_grad_norm 1e9,
    which scales the gradients by exactly 1) logs. The hook is transformers' `Trainer._get_grad_norm`: if it is
    renamed, this test says so."""
    from transformers import Trainer

    assert "_get_grad_norm" in vars(Trainer)  # the private hook VaswaniSeq2SeqTrainer overrides
    data = write_fixture(tmp_path / "data", n_train=60)
    logs = {}
    for name, extra in (("lazy", ()), ("clipped", ("--max_grad_norm", "1e9"))):
        out = tmp_path / name
        run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_strategy", "no", "--logging_steps", "2", *extra))
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        logs[name] = {h["step"]: h["grad_norm"] for h in history if "loss" in h}
    assert sorted(logs["lazy"]) == [1, 2, 4]
    assert logs["lazy"] == pytest.approx(logs["clipped"], rel=1e-6) and all(v > 0 for v in logs["lazy"].values())


def test_floating_point_ops_is_transformers_estimate():
    """`VaswaniSeq2SeqTrainer.floating_point_ops` (the parameter count kept) gives transformers' own estimate, and a
    new model (another size) is counted anew."""
    from transformers import Trainer

    args = VaswaniTrainingArguments(output_dir="unused", use_cpu=True, report_to="none")
    trainer = VaswaniSeq2SeqTrainer(model=tiny_model(), args=args)
    inputs = {"input_ids": torch.ones(3, 7, dtype=torch.long), "labels": torch.ones(3, 5, dtype=torch.long)}
    assert trainer.floating_point_ops(inputs) == Trainer.floating_point_ops(trainer, inputs) > 0
    trainer.model = helpers.tiny_model(d_ff=128)
    assert trainer.floating_point_ops(inputs) == Trainer.floating_point_ops(trainer, inputs)
    assert trainer.floating_point_ops({"labels": inputs["labels"]}) == 0


def test_the_validation_loss_keeps_the_training_precision_and_shows_a_non_finite_sentence(tmp_path):
    """Under bf16 mixed precision the validation loss is the autocast one with and without generated translations
    (before, generating computed it in float32: another number for the same model and set). A sentence whose loss is
    not finite makes the set's loss not finite, as in transformers' evaluation (before, it and its tokens were left
    out without a word: a healthy-looking loss)."""
    from datasets import Dataset

    from vaswani_transformer.data import TranslationDataCollator
    from vaswani_transformer.evaluation import make_compute_metrics

    tokenizer = helpers.tiny_tokenizer()
    ids = [tokenizer(text).input_ids for text in helpers.SOURCES]
    dataset = Dataset.from_dict({"input_ids": ids, "labels": ids})
    losses = {}
    for generate in (False, True):
        for bf16 in (False, True):
            model = helpers.tiny_translation_model(tokenizer, seed=12, init_std=0.5, scale_embedding=True)
            model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 4
            args = VaswaniTrainingArguments(
                output_dir=str(tmp_path / "out"), use_cpu=True, bf16=bf16, report_to="none", disable_tqdm=True,
                per_device_eval_batch_size=2, predict_with_generate=generate, label_smoothing_factor=0.1,
            )  # fmt: skip
            trainer = VaswaniSeq2SeqTrainer(model=model, args=args, data_collator=TranslationDataCollator(tokenizer),
                                            processing_class=tokenizer,
                                            compute_metrics=make_compute_metrics(tokenizer, "de") if generate else None)
            trainer.accelerator.prepare_model(model)
            losses[generate, bf16] = trainer.evaluate(dataset)["eval_loss"]
    assert losses[True, True] == losses[False, True] != losses[False, False] == losses[True, False], losses
    trainer._eval_loss_totals = torch.zeros(2, dtype=torch.float64)  # the evaluation loop's running (sum, tokens)
    trainer._eval_sentence_losses = torch.tensor([[20.0, 10], [math.inf, 10], [30.0, 10]], dtype=torch.float64)
    trainer._gather_sentence_losses()
    assert trainer._eval_loss_totals.tolist() == [math.inf, 30]


def test_the_validation_loss_is_the_mean_over_the_sets_target_tokens_whatever_the_batches(tmp_path):
    """The Trainer's eval_loss (and test_loss) is the label-smoothed loss per target token of the whole set, as a
    float64 forward pass of each sentence alone gives it: (1 - eps) * -log p(y) + eps * mean_v -log p(v), summed over
    every target token (`</s>` included) and divided by their number, for any evaluation batch size, with and without
    generating translations. transformers' loop averaged per-batch means weighted by sentences: batches of 2 and of 5
    gave other losses."""
    model_dir = tmp_path / "model"
    model, tokenizer = helpers.save_tiny_model(model_dir, seed=18, init_std=0.05)
    sources = helpers.SOURCES + helpers.CORPUS[:4]
    references = [" ".join(s.split()[: 1 + i % 6]) for i, s in enumerate(reversed(sources))]  # 1 to 6 words
    data = tmp_path / "data"
    data.mkdir()
    (data / "set.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (data / "set.tgt").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    eps = 0.1
    reference = model.double().eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for source, target in zip(sources, references):
            labels = tokenizer(text_target=target).input_ids
            decoder_input = [reference.config.decoder_start_token_id] + labels[:-1]
            logits = reference(input_ids=torch.tensor([tokenizer(source).input_ids]),
                               decoder_input_ids=torch.tensor([decoder_input])).logits[0]  # fmt: skip
            log_probs = torch.log_softmax(logits, dim=-1)
            for i, label in enumerate(labels):
                total += (1 - eps) * -float(log_probs[i, label]) + eps * -float(log_probs[i].mean())
            count += len(labels)
    assert len({len(tokenizer(text_target=r).input_ids) for r in references}) >= 4  # lengths differ
    for batch_size, generate in (("2", "false"), ("5", "false"), ("3", "true")):
        out = tmp_path / f"out-{batch_size}"
        run_from_args(["--model_name_or_path", str(model_dir), "--validation_file", str(data / "set"), "--test_file",
                       str(data / "set"), "--source_lang", "src", "--target_lang", "tgt", "--output_dir", str(out),
                       "--do_eval", "--do_predict", "--per_device_eval_batch_size", batch_size, "--use_cpu",
                       "--predict_with_generate", generate, "--label_smoothing_factor", str(eps), "--report_to",
                       "none", "--disable_tqdm", "true"])  # fmt: skip
        summary = json.loads((out / "training_summary.json").read_text())
        for split in ("eval", "test"):
            assert summary[split][f"{split}_loss"] == pytest.approx(total / count, rel=1e-6), (batch_size, split)
