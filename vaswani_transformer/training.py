"""Training with the paper's recipe: `Seq2SeqTrainer` under `accelerate launch`, token batches, Adam + warmup.

The recipe (section 5.3 and 5.4 of the paper) is the default of :class:`VaswaniTrainingArguments`:

* Adam with beta1=0.9, beta2=0.98, eps=1e-9 and no weight decay (:meth:`VaswaniSeq2SeqTrainer.create_optimizer`);
* ``lr = lr_factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)`` with ``warmup_steps=4000``
  (:func:`paper_learning_rate`); update number ``n`` (1-based, as in the paper) uses ``step = n``;
* label smoothing 0.1; no gradient clipping (``max_grad_norm=0``) unless asked;
* ``--preset`` sets everything its Table 3 row changes: the model and the training values
  (``preset_training_arguments``: label smoothing, ``max_steps`` 100k base / 300k big, warmup); an explicit flag or
  recipe key wins (:func:`given_arguments` tells which the user gave);
* batches of about ``max_tokens_per_batch`` source and target tokens per device from
  :class:`vaswani_transformer.data.TokenBatchSampler`; ``tokens_per_update`` (25000 in the paper: 8 GPUs x ~3k)
  sets ``gradient_accumulation_steps = round(tokens_per_update / (max_tokens_per_batch * num_processes))``.

Loss normalisation: the label-smoothed cross-entropy (any eps, 0 included) is summed over the target tokens of the
whole update (all accumulation steps and all processes: transformers' ``num_items_in_batch``) and divided by their
number, so every target token weighs the same, as in the paper's token batches
(:meth:`VaswaniSeq2SeqTrainer.compute_loss`).

Data: the length and ratio filters apply to the training split only; validation and test sets are scored whole (a
source longer than a learned-position model takes is truncated with a warning naming it, as translate does).

Distributed: each rank builds the sampler with its own ``rank`` (batch ``j`` of an epoch goes to rank
``j % num_processes``); the DataLoader is prepared by accelerate for device placement, and the
``BatchSamplerShard`` wrapper accelerate adds is made a pass-through so the batches are not split twice (the same
thing transformers does for its own rank-aware ``BatchRebalanceSampler``). DDP all-reduces gradients, so weights
stay identical across ranks.

Checkpoints: ``save_steps`` and/or ``save_every_minutes`` (the paper: every 10 minutes; the decision is made on
rank 0 and broadcast), and always the last update (:class:`SaveAtEndCallback`), so the final weights are averaged;
``resume_from_checkpoint="latest"`` resumes from the newest *complete* checkpoint, every file of which loads
(:func:`find_last_complete_checkpoint`, ``averaging.checkpoint_problem``: the rule averaging uses too); others (a
run killed while saving) are moved aside to ``incomplete-checkpoint-N`` with a warning, never resumed from. Tokens
and wall time trained so far travel in the checkpoints' trainer state, so the summary's totals survive resumes.

Faults: a NaN or infinite loss raises :class:`NonFiniteLossError` naming the update and the last complete
checkpoint (or saying none was written) before the optimizer steps, so the weights and that checkpoint stay good.

:func:`run_training` is the whole job (data, tokenizer, model, training, checkpoint averaging, test BLEU, example
translations, summary); ``scripts/train.py`` only parses arguments for it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_callback import ExportableState

from .averaging import average_checkpoints, checkpoint_problem, find_checkpoints
from .configuration_vaswani_transformer import preset_training_arguments

logger = logging.getLogger(__name__)

SUMMARY_NAME = "training_summary.json"
_BASE_TRAINING = preset_training_arguments("base")  # the paper's base recipe: the arguments' defaults
LR_SCHEDULES = ("paper", "hf")


# ------------------------------------------------------------------------------------------------- schedule


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's equation (3): ``factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``, step >= 1."""
    if step < 1:
        raise ValueError(f"step counts updates from 1, got {step}.")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}.")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def paper_lr_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int, factor: float = 1.0, last_epoch: int = -1
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` giving the ``n``-th optimizer update (n = 1, 2, ...) :func:`paper_learning_rate` of ``n``.

    The optimizer's base learning rate is ignored: the schedule sets absolute rates (the lambda returns the rate
    divided by the base rate of each parameter group).
    """
    if warmup_steps < 1:
        raise ValueError(f"The paper schedule needs warmup_steps >= 1, got {warmup_steps}.")
    lambdas = []
    for group in optimizer.param_groups:
        base = group.get("initial_lr", group["lr"])
        if base <= 0:
            raise ValueError(f"The optimizer's learning rate must be positive, got {base}.")
        lambdas.append(lambda s, base=base: paper_learning_rate(s + 1, d_model, int(warmup_steps), factor) / base)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas, last_epoch=last_epoch)


def build_optimizer(model: torch.nn.Module, args: VaswaniTrainingArguments) -> torch.optim.Optimizer:
    """Adam with the arguments' betas and eps (paper: 0.9, 0.98, 1e-9). ``weight_decay > 0`` gives AdamW
    (decoupled decay) on all weights except biases and LayerNorms; the paper uses none.

    The fused kernel (one pass over all parameters) is used on CPU and CUDA: the same update, 2.6x faster than
    PyTorch's CPU default of one tensor at a time (2% of a small model's training step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") for p in params) or None
    common = dict(lr=1.0, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon, fused=fused)
    if not args.weight_decay:
        return torch.optim.Adam(params, weight_decay=0.0, **common)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() or name.endswith("bias") else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], **common
    )


def gradient_accumulation_for(tokens_per_update: int, max_tokens_per_batch: int, num_processes: int) -> int:
    """Micro-batches per update so that one update sees about ``tokens_per_update`` tokens (at least 1)."""
    if tokens_per_update < 1 or max_tokens_per_batch < 1 or num_processes < 1:
        raise ValueError(
            f"tokens_per_update ({tokens_per_update}), max_tokens_per_batch ({max_tokens_per_batch}) and the "
            f"number of processes ({num_processes}) must be positive."
        )
    return max(1, round(tokens_per_update / (max_tokens_per_batch * num_processes)))


# ------------------------------------------------------------------------------------------------ CPU memory

# glibc's mallopt parameters (malloc.h) and the value set for both: 1 GiB.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _KEEP_BYTES = -1, -3, 1 << 30


def keep_freed_cpu_memory() -> bool:
    """Make glibc's malloc keep freed blocks of up to 1 GiB in the process instead of returning them to the OS.

    Every training step allocates and frees the same large tensors (a batch's logits are 32 MB at 1k tokens x 8k
    vocabulary). By default glibc serves blocks over 32 MB with mmap and unmaps them when freed, and returns the top
    of the heap past 128 kB, so every step faults fresh zeroed pages back in: 10-18% of the Multi30k CPU recipe's
    training step on a 2-core AMD EPYC, with token batches of varying shapes. The cost is memory the process keeps
    between steps (about one step's peak). Returns False where the C library has no ``mallopt`` (not glibc).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, TypeError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


# ------------------------------------------------------------------------------------------------ arguments


@dataclass
class ModelArguments:
    """Which model and tokenizer to train (names as in transformers' ``run_translation.py`` where they exist)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Start from these weights (a folder or Hub id) instead of a new model."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder/id for a new model."})
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder/id. Default: the model's, or a new shared BPE trained on the train split."},
    )
    preset: str = field(
        default="base",
        metadata={"help": "Paper preset (base, big, Table 3 rows): the model of a new model and the training values "
                  "of its row (label_smoothing_factor, max_steps, warmup_steps); a flag or recipe key overrides them."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config fields for a new model, 'd_model=256,d_ff=1024' (a mapping in a recipe file)."},
    )
    tokenizer_vocab_size: int = field(default=37000, metadata={"help": "Size of a newly trained shared vocabulary."})
    tokenizer_model: str = field(default="bpe", metadata={"help": "bpe (paper EN-DE) or wordpiece (paper EN-FR)."})
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel for training: sdpa (default), eager, flash_attention_2 or flex_attention. With "
            "--bf16 on a CPU try eager: on an AVX-512 BF16 CPU, PyTorch's SDPA backward was several times slower in "
            "bf16 than in fp32 (benchmarks/training_step_speed.py compares them). The saved model keeps the default."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "datasets/transformers cache folder."})


@dataclass
class DataTrainingArguments:
    """Which data, how it is filtered and batched, and what happens after training."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset or save_to_disk folder."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. de-en."})
    train_file: str | None = field(default=None, metadata={"help": "prefix of .src/.tgt text files, .tsv or .jsonl"})
    validation_file: str | None = field(default=None, metadata={"help": "like train_file"})
    test_file: str | None = field(default=None, metadata={"help": "like train_file; BLEU at the end"})
    synthetic_task: str | None = field(
        default=None, metadata={"help": "Generate an offline task instead of reading data: numbers, reverse, copy."}
    )
    synthetic_train_size: int = field(default=20000, metadata={"help": "Training pairs of the synthetic task."})
    synthetic_eval_size: int = field(default=200, metadata={"help": "Validation and test pairs of the synthetic task."})
    source_lang: str | None = field(default=None, metadata={"help": "Source language code (e.g. en)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code (e.g. de)."})
    max_source_length: int | None = field(
        default=None,
        metadata={"help": "Drop (and count) training pairs whose source has more tokens (</s> included); evaluation "
                  "sets are scored whole. Default: max_tokens_per_batch."},
    )
    max_target_length: int | None = field(default=None, metadata={"help": "Same for the target side."})
    max_length_ratio: float | None = field(
        default=None, metadata={"help": "Drop training pairs with longer/shorter side > this."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Re-tokenise instead of using the cache."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N test pairs."})
    max_tokens_per_batch: int = field(
        default=4096, metadata={"help": "Per-device batch size in tokens (each side, padding included)."}
    )
    tokens_per_update: int | None = field(
        default=None,
        metadata={"help": "Target tokens per update (paper: 25000); sets gradient_accumulation_steps."},
    )
    average_last_checkpoints: int = field(
        default=0, metadata={"help": "After training, average the last N checkpoints (paper: 5 base, 20 big)."}
    )
    num_translation_examples: int = field(default=5, metadata={"help": "Test translations printed at the end."})


@dataclass
class VaswaniTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's recipe as defaults, plus the schedule and time-based saving."""

    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (paper: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (paper: 1e-9)."})
    label_smoothing_factor: float = field(
        default=_BASE_TRAINING["label_smoothing_factor"],
        metadata={"help": "Label smoothing (paper: 0.1). Default: the preset's (0.0 / 0.2 for D-ls0.0 / D-ls0.2)."},
    )
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping norm; 0 = none (paper)."})
    warmup_steps: float = field(
        default=_BASE_TRAINING["warmup_steps"], metadata={"help": "Warmup updates (paper: 4000; the preset's)."}
    )
    lr_schedule: str = field(
        default="paper",
        metadata={"help": "paper: d_model^-0.5 * min(step^-0.5, step*warmup^-1.5) * lr_factor (giving "
                  "--learning_rate too is an error); hf: transformers' lr_scheduler_type with learning_rate."},
    )
    lr_factor: float = field(default=1.0, metadata={"help": "Multiplies the paper schedule (peak rate)."})
    save_every_minutes: float | None = field(
        default=None, metadata={"help": "Also save a checkpoint every N minutes of training (paper: 10)."}
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={"help": "Wall-clock budget: stop (and save) after this many minutes of training; max_steps still applies."},
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU with generate()."})
    report_to: None | str | list[str] = field(default="tensorboard", metadata={"help": "Loggers (tensorboard)."})
    logging_first_step: bool = field(default=True, metadata={"help": "Log the first update."})
    keep_freed_cpu_memory: bool = field(
        default=True,
        metadata={"help": "Training on CPU: keep freed memory in the process (glibc malloc) instead of returning it "
                  "to the OS every step; 10 to 18 percent faster steps for small models (see keep_freed_cpu_memory)."},
    )

    def __post_init__(self):
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"Unknown lr_schedule {self.lr_schedule!r}. Valid: {', '.join(LR_SCHEDULES)}.")
        if self.lr_schedule == "paper" and (self.warmup_steps < 1 or self.warmup_steps != int(self.warmup_steps)):
            raise ValueError(f"The paper schedule needs an integer warmup_steps >= 1, got {self.warmup_steps}.")
        if self.max_train_minutes is not None and self.max_train_minutes <= 0:
            raise ValueError(f"max_train_minutes must be positive, got {self.max_train_minutes}.")
        if self.save_every_minutes is not None and self.save_every_minutes <= 0:
            raise ValueError(f"save_every_minutes must be positive, got {self.save_every_minutes}.")
        super().__post_init__()


ARGUMENT_CLASSES = (ModelArguments, DataTrainingArguments, VaswaniTrainingArguments)


def valid_argument_names() -> list[str]:
    return sorted(f.name for cls in ARGUMENT_CLASSES for f in dataclasses.fields(cls) if f.init)


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or JSON recipe (a mapping of argument names to values); unknown keys are an error listing the
    valid ones. ``config_overrides`` may be a mapping; it becomes ``"k=v,..."``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Recipe file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        recipe = json.loads(text)
    elif path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        recipe = yaml.safe_load(text)
    else:
        raise ValueError(f"{path}: a recipe must be a .yaml, .yml or .json file.")
    if recipe is None:
        recipe = {}
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe must be a mapping of argument names to values, got {type(recipe).__name__}.")
    valid = set(valid_argument_names())
    unknown = sorted(k for k in recipe if k not in valid)
    if unknown:
        hints = "; ".join(
            f"{k!r}: did you mean {', '.join(repr(m) for m in difflib.get_close_matches(k, valid, n=3))}?"
            for k in unknown
            if difflib.get_close_matches(k, valid, n=3)
        )
        raise ValueError(
            f"{path}: unknown recipe key(s) {unknown}. {hints + ' ' if hints else ''}"
            f"Valid keys: {', '.join(sorted(valid))}."
        )
    if isinstance(recipe.get("config_overrides"), dict):
        recipe["config_overrides"] = ",".join(f"{k}={v}" for k, v in recipe["config_overrides"].items())
    return recipe


def parse_arguments(argv: list[str] | None = None):
    """``(model_args, data_args, training_args)`` from the command line.

    The first argument may be a ``.yaml``/``.yml``/``.json`` recipe; further ``--flags`` override its values.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(ARGUMENT_CLASSES)
    recipe: dict[str, Any] = {}
    if argv and not argv[0].startswith("-") and Path(argv[0]).suffix.lower() in (".yaml", ".yml", ".json"):
        recipe = load_recipe(argv.pop(0))
        for action in parser._actions:
            if action.dest in recipe:
                action.required = False
    given = {**recipe, **given_arguments(argv)}  # what the user set: recipe keys, then flags
    parser.set_defaults(**preset_training_defaults(given.get("preset", "base"), given), **recipe)
    model_args, data_args, training_args, rest = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True
    )
    if rest:
        raise ValueError(f"Unknown arguments {rest}. Valid arguments: {', '.join('--' + n for n in valid_argument_names())}.")
    if "learning_rate" in given and training_args.lr_schedule == "paper":
        raise ValueError(
            f"learning_rate={given['learning_rate']} has no effect with lr_schedule=paper, whose rates are "
            "lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5): scale them with lr_factor, or use "
            "lr_schedule=hf for transformers' schedules with learning_rate."
        )
    return model_args, data_args, training_args


def given_arguments(argv: list[str]) -> dict[str, Any]:
    """The arguments written on the command line ``argv`` (name -> parsed value), without any default.

    Parsed by a copy of the real parser whose defaults are all ``argparse.SUPPRESS``, so an argument appears only when
    the user gave it (HfArgumentParser's defaults cannot tell "given the default value" from "not given")."""
    import argparse

    parser = HfArgumentParser(ARGUMENT_CLASSES, add_help=False)  # --help is the real parser's
    for action in parser._actions:
        action.default, action.required = argparse.SUPPRESS, False
    given, _ = parser.parse_known_args(argv)
    return vars(given)


def preset_training_defaults(preset: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The training values of ``preset`` (its Table 3 row: label smoothing, updates, warmup) that ``given`` (the
    arguments the user set) leaves open. An explicit ``num_train_epochs`` also leaves ``max_steps`` to the user (the
    Trainer lets ``max_steps`` override epochs)."""
    given = given or {}
    values = {k: v for k, v in preset_training_arguments(preset).items() if k not in given}
    if "num_train_epochs" in given:
        values.pop("max_steps", None)
    return values


def parse_config_overrides(text: str | None) -> dict[str, Any]:
    """``"d_model=256,dropout=0.1,share_embeddings=true"`` -> typed dict (ints, floats, booleans, None, strings)."""
    out: dict[str, Any] = {}
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"config_overrides: expected key=value, got {item!r}.")
        key, value = (s.strip() for s in item.split("=", 1))
        low = value.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
        elif low in ("none", "null"):
            out[key] = None
        else:
            for cast in (int, float):
                try:
                    out[key] = cast(value)
                    break
                except ValueError:
                    continue
            else:
                out[key] = value
    from .configuration_vaswani_transformer import VaswaniTransformerConfig

    valid = {f.name for f in dataclasses.fields(VaswaniTransformerConfig)}
    unknown = sorted(set(out) - valid)
    if unknown:
        raise ValueError(f"config_overrides: unknown config field(s) {unknown}. Valid fields: {', '.join(sorted(valid))}.")
    return out


# ---------------------------------------------------------------------------------------------- checkpoints


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """A checkpoint the run can resume from: weights, optimizer, scheduler and ``trainer_state.json`` (written last by
    the Trainer), every file whole; see :func:`vaswani_transformer.averaging.checkpoint_problem`."""
    return checkpoint_problem(path, for_resume=True) is None


def find_last_complete_checkpoint(output_dir: str | os.PathLike, quarantine: bool = True) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (by N), or None.

    Incomplete ones newer than it (left by a killed run) are renamed ``incomplete-checkpoint-N`` (or
    ``incomplete-checkpoint-N.K``) with a warning when ``quarantine`` is true, so the Trainer's own checkpoint
    rotation and later saves never mistake them for real checkpoints.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    for p in reversed(find_checkpoints(output_dir)):
        if is_complete_checkpoint(p):
            return str(p)
        if quarantine:
            target = output_dir / f"incomplete-{p.name}"
            k = 0
            while target.exists():
                k += 1
                target = output_dir / f"incomplete-{p.name}.{k}"
            logger.warning("Checkpoint %s is incomplete (a run stopped while saving it); moved to %s.", p, target)
            p.rename(target)
    return None


# ------------------------------------------------------------------------------------------------- trainer


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite loss (the message names the update); checkpoints stay as they were."""


def _rank0_decides(flag: bool) -> bool:
    """Rank 0's value of ``flag`` on every process (clocks differ between processes; decisions must not)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int64)
        if torch.distributed.get_backend() == "nccl":
            tensor = tensor.cuda()
        torch.distributed.broadcast(tensor, src=0)
        return bool(tensor.item())
    return flag


class SaveEveryMinutesCallback(TrainerCallback):
    """Ask for a checkpoint when ``minutes`` of wall time passed since the last one (decided on rank 0)."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.last = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank0_decides(time.monotonic() - self.last >= self.seconds):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


class TimeBudgetCallback(TrainerCallback):
    """Stop training (saving a final checkpoint) once ``minutes`` of wall time have passed (decided on rank 0)."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank0_decides(time.monotonic() - self.start >= self.seconds):
            logger.info("max_train_minutes=%s reached at update %d: stopping.", self.seconds / 60, state.global_step)
            control.should_training_stop = True
            control.should_save = True
        return control


class TrainingTotalsCallback(TrainerCallback, ExportableState):
    """Source and target tokens trained on and training wall time since update 1, summed over processes: kept in
    every checkpoint's ``trainer_state.json`` (``stateful_callbacks``) and read back on resume, so that totals stay
    totals across resumes (like ``global_step``). ``at_start`` holds the totals when this run began: None when the
    resumed checkpoint did not record them (then only this run's figures are known)."""

    def __init__(self):
        self.source, self.target = 0, 0
        self.at_start: dict[str, Any] | None = {"source": 0, "target": 0, "seconds": 0.0}
        self.start_step = 0
        self.run_start: float | None = None

    def run_seconds(self) -> float:
        """Wall time of this run, from its first update."""
        return time.time() - self.run_start if self.run_start is not None else 0.0

    def state(self) -> dict:
        seconds = (self.at_start or {}).get("seconds", 0.0) + self.run_seconds()
        return {"args": {}, "attributes": {"source": self.source, "target": self.target, "seconds": round(seconds, 3)}}

    def on_train_begin(self, args, state, control, **kwargs):
        self.run_start, self.start_step = None, state.global_step
        if state.global_step == 0:
            self.source = self.target = 0
            self.at_start = {"source": 0, "target": 0, "seconds": 0.0}
            return
        # resumed: the state is the checkpoint's
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        saved = saved[0] if isinstance(saved, list) and saved else saved
        attributes = saved.get("attributes", {}) if isinstance(saved, dict) else {}
        if {"source", "target", "seconds"} <= attributes.keys():
            self.source, self.target = int(attributes["source"]), int(attributes["target"])
            self.at_start = {"source": self.source, "target": self.target, "seconds": float(attributes["seconds"])}
        else:
            logger.warning("The resumed checkpoint does not record the tokens and time trained before it: the "
                           "training summary gives this run's figures only.")
            self.source = self.target = 0
            self.at_start = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.run_start is None:
            self.run_start = time.time()


class SaveAtEndCallback(TrainerCallback):
    """Save a checkpoint at the last update (once: nothing more when that update is saved anyway), so that the end of
    training is a checkpoint like the others, also with time-based saves or ``save_strategy="no"``, and is averaged."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_training_stop or state.global_step >= state.max_steps:
            control.should_save = True
        return control


class VaswaniSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's optimizer and schedule, token batches and a NaN/inf guard.

    Args (besides the Trainer's): ``max_tokens_per_batch`` for the :class:`~vaswani_transformer.data.TokenBatchSampler`
    (``None``: the Trainer's usual sentence batches).
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.train_sampler = None
        self.add_callback(TrainingTotalsCallback())
        if getattr(self.args, "save_every_minutes", None):
            self.add_callback(SaveEveryMinutesCallback(self.args.save_every_minutes))
        if getattr(self.args, "max_train_minutes", None):
            self.add_callback(TimeBudgetCallback(self.args.max_train_minutes))
        self.add_callback(SaveAtEndCallback())  # after the callbacks that stop training

    # -- optimisation
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = build_optimizer(self.model if model is None else model, self.args)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if getattr(self.args, "lr_schedule", "hf") != "paper":
            if self.optimizer is not None and self.lr_scheduler is None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.args.learning_rate
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            d_model = self.accelerator.unwrap_model(self.model).config.d_model
            self.lr_scheduler = paper_lr_scheduler(
                optimizer or self.optimizer, d_model, int(self.args.warmup_steps), self.args.lr_factor
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    # -- data
    def get_train_dataloader(self):
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader

        from .data import TokenBatchSampler

        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        self.train_sampler = TokenBatchSampler.from_dataset(
            self.train_dataset,
            self.max_tokens_per_batch,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.seed,
        )
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=self.train_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        loader = self.accelerator.prepare(loader)
        # The sampler already gives each rank its own batches: make accelerate's BatchSamplerShard a pass-through.
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is self.train_sampler:
            shard.num_processes, shard.process_index = 1, 0
        return loader

    # -- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Label-smoothed cross-entropy in one fused ``F.cross_entropy(label_smoothing=...)`` call, for every eps.

        The same value as transformers' ``LabelSmoother`` ((1 - eps) * NLL + eps * mean over the vocabulary of -log p,
        per non-padding target token; summed and divided by ``num_items_in_batch`` when the Trainer gives it), without
        materialising the log-probabilities several times: about 5% of a small model's training step on CPU.
        eps = 0 (no ``label_smoother``) takes the same path: the model's own loss is a per-micro-batch mean, which the
        Trainer would take as already normalised by ``num_items_in_batch`` (wrong under accumulation or several
        processes).
        """
        if self.compute_loss_func is not None or "labels" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        epsilon = self.label_smoother.epsilon if self.label_smoother is not None else 0.0
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = self.accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels(
                labels
            )
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        summed = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), labels.to(logits.device).flatten(), ignore_index=-100,
            label_smoothing=epsilon, reduction="sum",
        )  # fmt: skip
        if num_items_in_batch is None:
            loss = summed / (labels != -100).sum().clamp(min=1)
        else:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(summed.device)
            loss = summed / num_items_in_batch
            if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs:
                loss = loss * self.accelerator.num_processes  # as Trainer.compute_loss: DDP averages gradients
        return (loss, outputs) if return_outputs else loss

    # -- guard and counters
    @property
    def totals(self) -> TrainingTotalsCallback:
        """The training totals (the callback object itself: the Trainer may replace it when restoring callbacks)."""
        return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, TrainingTotalsCallback))

    def training_step(self, model, inputs, num_items_in_batch=None):
        target = int((inputs["labels"] != -100).sum()) if "labels" in inputs else 0
        source = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else 0
        loss = super().training_step(model, inputs, num_items_in_batch)
        # One reduction gives every process the finite flag and the token counts of all processes.
        local = torch.tensor([int(torch.isfinite(loss.detach()).all()), source, target], dtype=torch.int64)
        total = local if self.args.world_size == 1 else self.accelerator.reduce(local.to(loss.device), "sum").cpu()
        totals = self.totals
        totals.source += int(total[1])
        totals.target += int(total[2])
        if int(total[0]) != self.args.world_size:
            last = find_last_complete_checkpoint(self.args.output_dir, quarantine=False)
            saved = (f"The last checkpoint, {last}, is from before this update." if last is not None
                     else f"No checkpoint was written in {self.args.output_dir}.")  # fmt: skip
            raise NonFiniteLossError(
                f"Non-finite loss ({loss.item()}) at update {self.state.global_step + 1}: training stopped before "
                f"the optimizer step. {saved} Lower the peak learning rate (lr_factor) or disable fp16."
            )
        return loss

    def _issue_warnings_after_load(self, load_result) -> None:
        """Resuming loads ``model.safetensors`` with ``load_state_dict(strict=False)``: the tied copies of the shared
        embedding (stored once by ``save_pretrained``) come back as "missing" though loading the shared matrix
        filled them. Only keys that are really absent are reported."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        missing = set(load_result.missing_keys)
        really_missing = [k for k in load_result.missing_keys if not (k in tied and tied[k] not in missing)]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=really_missing))

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Loss on the batch plus ``generate`` from the source only (the model's generation config: the paper's
        beam search). Unlike `Seq2SeqTrainer`, ``labels`` are not passed to ``generate``."""
        if not self.args.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        inputs = self._prepare_inputs(inputs)
        if not gen_kwargs and hasattr(self, "_gen_kwargs"):
            gen_kwargs = self._gen_kwargs.copy()
        gen_kwargs = {k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)}
        generation_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask") if k in inputs}
        unwrapped = self.accelerator.unwrap_model(model)
        with torch.no_grad():
            generated = unwrapped.generate(**generation_inputs, **gen_kwargs)
            loss = None
            labels = inputs.get("labels")
            if labels is not None:
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(model, dict(inputs)).detach()
        return loss, generated, labels

    def create_model_card(self, *args, **kwargs):
        """The project's card, pipeline code and generation config in ``output_dir`` (``hub.write_model_card``)."""
        from .hub import write_model_card

        if args:
            raise TypeError("create_model_card takes keyword arguments only.")
        return write_model_card(self.args.output_dir, trainer=self, **kwargs)

    def training_summary(self) -> dict[str, Any]:
        """What training did, summed over processes. ``updates``, ``*_tokens_seen``, ``wall_time_seconds`` and
        ``target_tokens_per_second`` cover all training since update 1 (carried across resumes in the checkpoints;
        None when a resumed checkpoint did not record them); the ``*_this_run`` figures cover this run only."""
        totals, start = self.totals, self.totals.at_start
        run_seconds = totals.run_seconds()
        updates = int(self.state.global_step)
        run = {
            "updates": updates - totals.start_step,
            "source_tokens": totals.source - (start or {}).get("source", 0),
            "target_tokens": totals.target - (start or {}).get("target", 0),
            "wall_time_seconds": round(run_seconds, 2),
        }
        seconds = start["seconds"] + run_seconds if start is not None else None
        return {
            "updates": updates,
            "source_tokens_seen": totals.source if start is not None else None,
            "target_tokens_seen": totals.target if start is not None else None,
            "wall_time_seconds": round(seconds, 2) if seconds is not None else None,
            "target_tokens_per_second": round(totals.target / seconds, 1) if seconds else None,
            **{f"{k}_this_run": v for k, v in run.items()},
            "num_processes": int(self.args.world_size),
        }


def format_summary(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in summary.items())


# --------------------------------------------------------------------------------------------- whole job


def _resolve_resume(training_args: VaswaniTrainingArguments) -> str | None:
    value = training_args.resume_from_checkpoint
    if value in (None, "", "false", "False"):
        return None
    if value in ("latest", "true", "True", True):
        found = find_last_complete_checkpoint(training_args.output_dir, quarantine=training_args.process_index == 0)
        if found is None:
            logger.warning("resume_from_checkpoint=%s: no complete checkpoint in %s; starting from scratch.",
                           value, training_args.output_dir)
        return found
    problem = checkpoint_problem(value, for_resume=True)
    if problem is not None:
        raise ValueError(f"resume_from_checkpoint={value!r} is not a complete checkpoint: {problem}.")
    return value


def _prepare_data(model_args, data_args, training_args):
    from .data import load_parallel_dataset

    if data_args.synthetic_task is not None:
        from .synthetic import TASK_LANGUAGES, write_synthetic_task

        paths = write_synthetic_task(
            os.path.join(training_args.output_dir, "synthetic_data"),
            data_args.synthetic_task,
            train_size=data_args.synthetic_train_size,
            validation_size=data_args.synthetic_eval_size,
            test_size=data_args.synthetic_eval_size,
            seed=0,
        )
        data_args.train_file = data_args.train_file or paths["train"]
        data_args.validation_file = data_args.validation_file or paths["validation"]
        data_args.test_file = data_args.test_file or paths["test"]
        src, tgt = TASK_LANGUAGES[data_args.synthetic_task]
        data_args.source_lang = data_args.source_lang or src
        data_args.target_lang = data_args.target_lang or tgt
    if not data_args.source_lang or not data_args.target_lang:
        raise ValueError("Need --source_lang and --target_lang (e.g. en and de).")
    raw = load_parallel_dataset(
        dataset_name=data_args.dataset_name,
        dataset_config_name=data_args.dataset_config_name,
        train_file=data_args.train_file,
        validation_file=data_args.validation_file,
        test_file=data_args.test_file,
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        cache_dir=model_args.cache_dir,
    )
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples),
                         ("test", data_args.max_predict_samples)):  # fmt: skip
        if limit is not None and split in raw:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw


def _load_tokenizer(model_args, data_args, training_args, raw):
    from transformers import AutoTokenizer

    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is not None:
        return AutoTokenizer.from_pretrained(name, cache_dir=model_args.cache_dir)
    from .data import iter_parallel_texts
    from .tokenization import train_tokenizer

    folder = os.path.join(training_args.output_dir, "tokenizer")
    # Every process enters (and leaves) main_process_first exactly once: rank 0 trains, the others then load.
    with training_args.main_process_first(desc="training the tokenizer"):
        if os.path.isfile(os.path.join(folder, "tokenizer.json")):
            logger.info("Using the tokenizer trained earlier in %s", folder)
            return AutoTokenizer.from_pretrained(folder)
        if "train" not in raw:
            raise ValueError("No tokenizer given and no train split to train one on: pass --tokenizer_name.")
        logger.info("Training a shared %s vocabulary of %d on the train split", model_args.tokenizer_model,
                    model_args.tokenizer_vocab_size)
        return train_tokenizer(
            iter_parallel_texts(raw, data_args.source_lang, data_args.target_lang, split="train"),
            vocab_size=model_args.tokenizer_vocab_size,
            model=model_args.tokenizer_model,
            length=2 * len(raw["train"]),
            show_progress=training_args.process_index == 0 and not training_args.disable_tqdm,
            output_dir=folder,
        )


def _load_model(model_args, tokenizer):
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from .configuration_vaswani_transformer import VaswaniTransformerConfig
    from .tokenization import config_kwargs_from_tokenizer

    overrides = parse_config_overrides(model_args.config_overrides)
    kernel = {} if model_args.attn_implementation is None else {"attn_implementation": model_args.attn_implementation}
    if model_args.model_name_or_path is not None:
        if overrides:
            raise ValueError("config_overrides only applies to a new model, not to --model_name_or_path.")
        return AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, cache_dir=model_args.cache_dir, **kernel
        )
    if model_args.config_name is not None:
        config = AutoConfig.from_pretrained(model_args.config_name, cache_dir=model_args.cache_dir, **overrides)
    else:
        config = VaswaniTransformerConfig.from_preset(
            model_args.preset, **{**config_kwargs_from_tokenizer(tokenizer), **overrides}
        )
    return AutoModelForSeq2SeqLM.from_config(config, **kernel)


def truncate_long_sources(dataset, limit: int | None, eos_token_id: int | None, where: str, warn: bool = True):
    """An evaluation split whose sources longer than ``limit`` tokens (what the model can take) are cut as translate
    cuts them (``pipeline.truncate_source``, keeping ``</s>``), with a warning naming each pair (``where:N``, N the
    pair's line in a text file)."""
    from .data import SOURCE_LENGTH_COLUMN
    from .pipeline import truncate_source

    if limit is None:
        return dataset
    lengths = dataset[SOURCE_LENGTH_COLUMN]
    long = {i for i, n in enumerate(lengths) if n > limit}
    for i in sorted(long) if warn else ():
        logger.warning("%s:%d: the source has %d tokens, more than the model's limit of %d; scoring its first %d "
                       "tokens.", where, i + 1, lengths[i], limit, limit)
    if not long:
        return dataset

    def cut(example: dict, index: int) -> dict:
        if index in long:
            example["input_ids"] = truncate_source(example["input_ids"], limit, eos_token_id)
            example[SOURCE_LENGTH_COLUMN] = len(example["input_ids"])
        return example

    return dataset.map(cut, with_indices=True, desc="Truncating long sources")


def _average_checkpoints(output_dir: str, n: int) -> str:
    """Average the last ``n`` complete checkpoints of the run into ``output_dir/averaged``."""
    available = [p for p in find_checkpoints(output_dir) if checkpoint_problem(p) is None]
    if not available:
        raise ValueError(f"average_last_checkpoints={n} but {output_dir} has no complete checkpoint.")
    if len(available) < n:
        logger.warning("average_last_checkpoints=%d but only %d checkpoint(s) exist (%s): averaging those.",
                       n, len(available), ", ".join(Path(p).name for p in available))
        n = len(available)
    target = os.path.join(output_dir, "averaged")
    done = average_checkpoints(output_dir, n, target)
    logger.info("Averaged %s into %s", ", ".join(p.name for p in done.checkpoints), target)
    return target


def run_training(model_args: ModelArguments, data_args: DataTrainingArguments,
                 training_args: VaswaniTrainingArguments, callbacks: list | None = None) -> dict[str, Any]:
    """The whole job: data -> tokenizer -> model -> train -> (average) -> test BLEU -> examples -> summary.

    Returns a dict with ``summary``, ``eval`` and ``test`` metrics and ``examples``; also written to
    ``output_dir/training_summary.json`` by the main process.
    """
    from transformers import set_seed

    from .data import TranslationDataCollator, tokenize_parallel_dataset
    from .pipeline import source_length_limit
    from .tokenization import check_tokenizer_matches_config

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO
                        if training_args.process_index == 0 else logging.WARNING)
    set_seed(training_args.seed)
    if data_args.tokens_per_update is not None:
        training_args.gradient_accumulation_steps = gradient_accumulation_for(
            data_args.tokens_per_update, data_args.max_tokens_per_batch, training_args.world_size
        )
        logger.info("tokens_per_update=%d with %d tokens x %d process(es): gradient_accumulation_steps=%d",
                    data_args.tokens_per_update, data_args.max_tokens_per_batch, training_args.world_size,
                    training_args.gradient_accumulation_steps)
    resume = _resolve_resume(training_args) if training_args.do_train else None
    if training_args.keep_freed_cpu_memory and training_args.device.type == "cpu" and keep_freed_cpu_memory():
        logger.info("Training on CPU: freed memory stays in the process (glibc mallopt, keep_freed_cpu_memory).")

    with training_args.main_process_first(desc="preparing the data"):
        raw = _prepare_data(model_args, data_args, training_args)
    tokenizer = _load_tokenizer(model_args, data_args, training_args, raw)
    model = _load_model(model_args, tokenizer)
    check_tokenizer_matches_config(tokenizer, model.config)  # before any training

    max_tokens = data_args.max_tokens_per_batch
    position_limit = source_length_limit(model.config)  # learned positions: the most tokens a side can have
    with training_args.main_process_first(desc="tokenizing"):
        # The filters apply to the training split only: validation and test sets are scored whole.
        tokenized, report = tokenize_parallel_dataset(
            raw, tokenizer, data_args.source_lang, data_args.target_lang,
            max_source_tokens=min(data_args.max_source_length or max_tokens, position_limit or max_tokens),
            max_target_tokens=min(data_args.max_target_length or max_tokens, position_limit or max_tokens),
            max_length_ratio=data_args.max_length_ratio,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            filter_splits=("train",),
        )
        for split in ("validation", "test"):
            if split in tokenized:
                where = getattr(data_args, f"{split}_file") or f"{data_args.dataset_name or 'data'}[{split}]"
                tokenized[split] = truncate_long_sources(tokenized[split], position_limit, tokenizer.eos_token_id,
                                                         where, warn=training_args.process_index == 0)  # fmt: skip
    collator = TranslationDataCollator(tokenizer, decoder_start_token_id=model.config.decoder_start_token_id)
    compute_metrics = None
    if training_args.predict_with_generate:
        from .evaluation import make_compute_metrics

        compute_metrics = make_compute_metrics(tokenizer, data_args.target_lang)
    trainer = VaswaniSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation"),
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        callbacks=callbacks,
        max_tokens_per_batch=max_tokens,
    )
    result: dict[str, Any] = {"filtered": report.to_dict()}  # what length filtering dropped, per split and rule
    if training_args.do_train:
        if "train" not in tokenized:
            raise ValueError("do_train needs a train split (--train_file, --dataset_name or --synthetic_task).")
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_model()
        trainer.save_state()
        result["summary"] = trainer.training_summary()
        if trainer.is_world_process_zero():
            print("Training summary:\n" + format_summary(result["summary"]), flush=True)
    if data_args.average_last_checkpoints > 0 and trainer.is_world_process_zero():
        averaged = _average_checkpoints(training_args.output_dir, data_args.average_last_checkpoints)
        if averaged is not None:
            result["averaged_model"] = averaged
    training_args_sync(trainer)
    if result.get("averaged_model") or (data_args.average_last_checkpoints > 0 and trainer.args.world_size > 1):
        averaged_dir = os.path.join(training_args.output_dir, "averaged")
        if os.path.isdir(averaged_dir):
            from transformers import AutoModelForSeq2SeqLM

            averaged_model = AutoModelForSeq2SeqLM.from_pretrained(averaged_dir)
            trainer.model = trainer.model_wrapped = averaged_model.to(trainer.args.device)
    if training_args.do_eval and "validation" in tokenized:
        result["eval"] = trainer.evaluate(metric_key_prefix="eval")
    if training_args.do_predict and "test" in tokenized:
        output = trainer.predict(tokenized["test"], metric_key_prefix="test")
        result["test"] = output.metrics
        trainer.log_metrics("test", output.metrics)
        trainer.save_metrics("test", output.metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            import numpy as np

            preds = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
            hyps = tokenizer.batch_decode(preds, skip_special_tokens=True)
            n = min(data_args.num_translation_examples, len(hyps))
            pairs = raw["test"].select(range(n))["translation"]
            result["examples"] = [
                {"source": p[data_args.source_lang], "reference": p[data_args.target_lang], "hypothesis": h}
                for p, h in zip(pairs, hyps[:n])
            ]
            Path(training_args.output_dir, "test_translations.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
            print(f"Test BLEU {output.metrics.get('test_bleu', float('nan')):.2f}; examples:", flush=True)
            for ex in result["examples"]:
                print(f"  src: {ex['source']}\n  ref: {ex['reference']}\n  hyp: {ex['hypothesis']}\n", flush=True)
    if trainer.is_world_process_zero():
        os.makedirs(training_args.output_dir, exist_ok=True)
        if training_args.do_train:
            trainer.create_model_card(language=[data_args.source_lang, data_args.target_lang])
        Path(training_args.output_dir, SUMMARY_NAME).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def training_args_sync(trainer: VaswaniSeq2SeqTrainer) -> None:
    """Wait for every process (e.g. while rank 0 averages checkpoints)."""
    trainer.accelerator.wait_for_everyone()


def main(argv: list[str] | None = None, callbacks: list | None = None) -> dict[str, Any]:
    """Entry point of ``scripts/train.py``."""
    model_args, data_args, training_args = parse_arguments(argv)
    return run_training(model_args, data_args, training_args, callbacks=callbacks)


__all__ = [
    "DataTrainingArguments",
    "ModelArguments",
    "NonFiniteLossError",
    "SaveAtEndCallback",
    "SaveEveryMinutesCallback",
    "TimeBudgetCallback",
    "TrainingTotalsCallback",
    "VaswaniSeq2SeqTrainer",
    "VaswaniTrainingArguments",
    "build_optimizer",
    "find_last_complete_checkpoint",
    "given_arguments",
    "gradient_accumulation_for",
    "is_complete_checkpoint",
    "load_recipe",
    "main",
    "paper_learning_rate",
    "paper_lr_scheduler",
    "parse_arguments",
    "parse_config_overrides",
    "preset_training_defaults",
    "run_training",
    "truncate_long_sources",
]
