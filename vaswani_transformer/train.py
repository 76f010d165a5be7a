"""The training job: arguments, recipes, presets, and :func:`run_training` (``scripts/train.py``, ``vaswani-train``).

The paper's recipe (Sections 5.3 and 5.4; :mod:`vaswani_transformer.trainer` implements it) is the default of
:class:`VaswaniTrainingArguments`. ``--preset`` sets everything its Table 3 row changes: the model and the training
values (``preset_training_arguments``: label smoothing, ``max_steps`` 100k base / 300k big, warmup); an explicit
flag or recipe key wins (:func:`given_arguments` tells which the user gave). The first argument may be a YAML/JSON
recipe (:func:`load_recipe`); flags after it override its values.

Data: the length and ratio filters apply to the training split only; validation and test sets are scored whole (a
source longer than a learned-position model takes is truncated with a warning naming it, as translate does; a
reference longer than that is scored whole by BLEU, its loss over the first tokens, with a warning naming it).
``--do_eval`` / ``--do_predict`` without a validation / test set are errors before any work.

Checkpoints: ``resume_from_checkpoint="latest"`` resumes from the newest *complete* checkpoint
(:mod:`vaswani_transformer.checkpoints`, the rule averaging uses too); ``average_last_checkpoints`` averages the
last ones at the end and evaluates the averaged model; with ``do_eval`` it prints the validation score before and
after averaging, both decoded alike (``eval_before_averaging`` and ``eval_averaged`` in the results, each with its
``eval_length_penalty``; ``length_penalty_grid`` changes alpha only after), and warns when averaging made it worse.
The averaged model, in ``averaged/``, gets its own model card and results files (test and validation scores, test
translations); the run folder's card and results describe its own (final) weights.

:func:`run_training` is the whole job (data, tokenizer, model, training, checkpoint averaging, test BLEU, example
translations, summary); :func:`main` parses the command line for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pickle
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import yaml
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    set_seed,
)

from .card import trainer_metric_reports, training_info_from_trainer, training_info_of_model
from .checkpoints import (
    NOT_RESUMING,
    average_last_checkpoints,
    checkpoint_step,
    find_checkpoints,
    resolve_resume_checkpoint,
)
from .cli import did_you_mean, output_path_problem, unknown_arguments_message
from .configuration_vaswani_transformer import VaswaniTransformerConfig, preset_training_arguments
from .data import (
    SOURCE_LENGTH_COLUMN,
    TARGET_LENGTH_COLUMN,
    FilterReport,
    TranslationDataCollator,
    first_pair_line,
    iter_parallel_texts,
    load_parallel_dataset,
    tokenize_parallel_dataset,
)
from .evaluation import make_compute_metrics
from .flops import run_training_cost
from .hardware import emulated_precision_warning, has_native_bf16, keep_freed_cpu_memory
from .hub import push_trained_model, write_repository_extras
from .pipeline import source_length_limit, truncate_source
from .synthetic import TASK_LANGUAGES, write_synthetic_task
from .textio import unique_keys, write_lines
from .tokenization import check_tokenizer_matches_config, config_kwargs_from_tokenizer, train_tokenizer
from .trainer import (
    LR_SCHEDULES,
    CheckpointWriteError,
    ClockedWarmupStableDecay,
    NonFiniteLossError,
    VaswaniSeq2SeqTrainer,
    gradient_accumulation_for,
    keep_onednn_primitives,
    rank0_decides,
    skip_cudnn_attention,
)

logger = logging.getLogger(__name__)

SUMMARY_NAME = "training_summary.json"
_BASE_TRAINING = preset_training_arguments("base")  # the paper's base recipe: the arguments' defaults


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
                  "of its row (label_smoothing_factor, max_steps, warmup_steps); a flag or recipe key overrides them. "
                  "With model_name_or_path (or a recipe's preset with config_name): its training values only; "
                  "--preset with config_name is an error."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config fields for a new model, 'd_model=256,d_ff=1024' (a mapping in a recipe file)."},
    )
    tokenizer_vocab_size: int = field(
        default=37000,
        metadata={"help": "Size of a newly trained shared vocabulary (the flag with tokenizer_name or "
                          "model_name_or_path, whose tokenizer is used, is an error)."},
    )
    tokenizer_model: str = field(
        default="bpe",
        metadata={"help": "bpe (paper EN-DE) or wordpiece (paper EN-FR), for a newly trained vocabulary."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel for training: sdpa, eager, flash_attention_2 or flex_attention. Default: "
            "eager for bf16 on a CPU (PyTorch's CPU SDPA backward in bf16 is no faster than fp32; "
            "benchmarks/training_step_speed.py compares them), else sdpa. The saved model keeps sdpa."
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
    length_penalty_grid: list[float] | None = field(
        default=None,
        metadata={"help": "After training (and averaging), decode the validation set with each of these length "
                  "penalties (alpha of the paper's beam search) and keep the best sacreBLEU in the tested model's "
                  "generation config, as the paper chose its alpha 0.6 on the development set. E.g. 0.6 0.8 1.0 1.2."},
    )
    num_translation_examples: int = field(default=5, metadata={"help": "Test translations printed at the end."})

    def __post_init__(self):
        for name in ("max_source_length", "max_target_length"):  # 0 was taken for the default, < 0 dropped every pair
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (the </s> token), got {value}; leave it out for the "
                                 "default, max_tokens_per_batch.")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            value = getattr(self, name)  # 0 left a split without pairs, which failed later with datasets' error
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}; leave it out to keep every pair (or leave "
                                 "out the --do_* flag of that split).")
        ratio = self.max_length_ratio  # longer / shorter side is at least 1: below it drops all, NaN keeps all
        if ratio is not None and not ratio >= 1:
            raise ValueError(f"max_length_ratio (longer side / shorter side) must be at least 1, got {ratio}.")


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
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "DDP: search the autograd graph for parameters without a gradient every update. Every "
                  "parameter of this model gets one, so no search (transformers' default would search)."},
    )
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
        metadata={"help": "Wall-clock budget: stop (and save) after this many minutes of training; max_steps still "
                  "applies. Counted from this run's start: a resumed run gets the whole budget again."},
    )
    lr_decay_minutes: float | None = field(
        default=None,
        metadata={"help": "With max_train_minutes and lr_scheduler_type warmup_stable_decay: anneal over the budget's "
                  "last N minutes, with as many updates as the run's speed says fit (no num_decay_steps), so the run "
                  "ends annealed on any machine; lr_scheduler_kwargs may set warmup_type, decay_type, min_lr_ratio."},
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU with generate()."})
    report_to: None | str | list[str] = field(default="tensorboard", metadata={"help": "Loggers (tensorboard)."})
    logging_first_step: bool = field(default=True, metadata={"help": "Log the first update."})
    bf16_where_native: bool = field(
        default=False,
        metadata={"help": "bf16 mixed precision (as --bf16) where the training device multiplies bf16 in hardware "
                  "(CPUs with AVX-512 BF16 or AMX, CUDA GPUs with bf16), fp32 elsewhere (emulated bf16 is slower)."},
    )
    keep_freed_cpu_memory: bool = field(
        default=True,
        metadata={"help": "Training on CPU: keep freed memory in the process (glibc malloc) instead of returning it "
                  "to the OS and faulting it back in every step (see hardware.keep_freed_cpu_memory)."},
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
        if not 0 <= self.label_smoothing_factor <= 1:  # (also refuses nan) F.cross_entropy's range
            raise ValueError(f"label_smoothing_factor must be in [0, 1] (the probability mass spread over the "
                             f"vocabulary; paper: 0.1), got {self.label_smoothing_factor}.")
        if not 0 < self.lr_factor < float("inf"):  # a negative factor climbs the loss, 0 trains nothing
            raise ValueError(f"lr_factor must be positive and finite (it multiplies the paper schedule's rates; "
                             f"paper: 1), got {self.lr_factor}.")
        device_type = "cpu" if self.use_cpu or not torch.cuda.is_available() else "cuda"
        if self.bf16_where_native and not (self.bf16 or self.fp16):
            # Decided before transformers' own checks, which set up mixed precision from --bf16.
            self.bf16 = has_native_bf16(device_type)
        elif self.bf16 or self.fp16:  # asked for: kept, but not silently slow
            dtype, flag = (torch.bfloat16, "--bf16") if self.bf16 else (torch.float16, "--fp16")
            warning = emulated_precision_warning(dtype, device_type, f"Training with {flag}",
                                                 f"leave {flag} out (bf16_where_native picks bf16 where it is native)")
            if warning:
                logger.warning(warning)
        super().__post_init__()
        if self.lr_decay_minutes is not None:
            self._check_lr_decay_minutes()

    def _check_lr_decay_minutes(self):
        """The clock-placed decay (``lr_decay_minutes``) needs a time budget longer than it and transformers'
        warmup_stable_decay, whose number of decay and stable updates it sets itself."""
        scheduler = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        kwargs = dict(self.lr_scheduler_kwargs or {})
        if not 0 < self.lr_decay_minutes < float("inf"):
            raise ValueError(f"lr_decay_minutes must be positive, got {self.lr_decay_minutes}.")
        if self.max_train_minutes is None or self.lr_decay_minutes >= self.max_train_minutes:
            raise ValueError(f"lr_decay_minutes={self.lr_decay_minutes} anneals over the last minutes of the time "
                             f"budget: it needs max_train_minutes above it (now {self.max_train_minutes}).")
        if self.lr_schedule != "hf" or scheduler != "warmup_stable_decay":
            raise ValueError(f"lr_decay_minutes places the decay of transformers' warmup_stable_decay: it needs "
                             f"lr_schedule=hf and lr_scheduler_type=warmup_stable_decay (now {self.lr_schedule} and "
                             f"{scheduler}).")
        placed = sorted(set(kwargs) & {"num_decay_steps", "num_stable_steps", "num_training_steps"})
        unknown = sorted(set(kwargs) - {"warmup_type", "decay_type", "min_lr_ratio", "num_cycles", *placed})
        if placed or unknown:
            raise ValueError(f"lr_scheduler_kwargs {placed or unknown} with lr_decay_minutes: "
                             + ("the clock places the decay (leave them out)." if placed else "not arguments of "
                                "warmup_stable_decay (warmup_type, decay_type, min_lr_ratio, num_cycles)."))
        if self.warmup_steps != int(self.warmup_steps):
            raise ValueError(f"lr_decay_minutes needs warmup_steps in updates, got {self.warmup_steps} (a fraction of "
                             "max_steps, which the clock decides).")
        ClockedWarmupStableDecay(int(self.warmup_steps), **kwargs)  # a bad warmup_type or decay_type, now


ARGUMENT_CLASSES = (ModelArguments, DataTrainingArguments, VaswaniTrainingArguments)


def valid_argument_names() -> list[str]:
    return sorted(f.name for cls in ARGUMENT_CLASSES for f in dataclasses.fields(cls) if f.init)


def unknown_names_message(what: str, unknown: list[str], valid: set[str]) -> str:
    """``"unknown config field(s) [...]. 'x': did you mean 'y'? Valid fields: ..."`` (``what``: "config field"): each
    unknown name with the valid ones closest to it, then all of them."""
    hints = "; ".join(f"{k!r}: {did_you_mean(k, valid, quote=True)}" for k in unknown if did_you_mean(k, valid))
    listed = f"Valid {what.split()[-1]}s: {', '.join(sorted(valid))}."
    return f"unknown {what}(s) {unknown}. {hints + ' ' if hints else ''}{listed}"


def _takes_a_boolean(hint: Any, argument: dataclasses.Field) -> bool:
    """Whether an argument of type ``hint`` takes True/False: a bool, a ``Literal[False]``, a bare flag (``--fsdp``)."""
    types = typing.get_args(hint) or (hint,)
    literal = [v for t in types if typing.get_origin(t) is typing.Literal for v in typing.get_args(t)]
    flag = isinstance(argument.metadata.get("const"), bool)
    return bool in types or any(isinstance(v, bool) for v in literal) or flag


def boolean_argument_names() -> set[str]:
    """The arguments a recipe may set to true/false (the others take text or numbers); `resume_from_checkpoint` too,
    as transformers' `Trainer.train(resume_from_checkpoint=True)` (the latest checkpoint)."""
    names = {"resume_from_checkpoint"}
    for cls in ARGUMENT_CLASSES:
        hints = typing.get_type_hints(cls)
        names.update(f.name for f in dataclasses.fields(cls) if f.init and _takes_a_boolean(hints[f.name], f))
    return names


def list_argument_names() -> set[str]:
    """The arguments that take only a list (`length_penalty_grid`, `label_names`): a recipe's single value for one is an
    error up front (it failed after training, where the list was first iterated)."""
    names = set()
    for cls in ARGUMENT_CLASSES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            types = [t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None)]
            if f.init and types and all(t is list or typing.get_origin(t) is list for t in types):
                names.add(f.name)
    return names


def _check_yaml_keys_once(text: str) -> None:
    """A ValueError naming a key given twice in one mapping of a YAML text and its lines (PyYAML's loaders keep the
    last one without a word); from the composed nodes, which construct no Python objects."""
    pending = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while pending:
        node = pending.pop()
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key in seen:
                    raise ValueError(f"{key!r} is given twice (lines {seen[key] + 1} and "
                                     f"{key_node.start_mark.line + 1}); keep one.")  # fmt: skip
                seen[key] = key_node.start_mark.line
                pending.append(value_node)
        elif isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or JSON recipe (a mapping of argument names to values); unknown keys are an error listing the
    valid ones (closest first), and so is a boolean for an argument that takes none (YAML reads an unquoted ``no`` as
    False). ``config_overrides`` may be a mapping; it becomes ``"k=v,..."``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Recipe file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise ValueError(f"{path}: a recipe must be a .yaml, .yml or .json file.")
    try:
        if path.suffix.lower() == ".json":
            recipe = json.loads(text, object_pairs_hook=unique_keys)
        else:
            _check_yaml_keys_once(text)
            recipe = yaml.safe_load(text)
    except ValueError as error:  # (a key twice; json's own syntax errors are ValueErrors too)
        raise ValueError(f"{path}: {error}") from None
    if recipe is None:
        recipe = {}
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe must be a mapping of argument names to values, got {type(recipe).__name__}.")
    valid = set(valid_argument_names())
    unknown = sorted(k for k in recipe if k not in valid)
    if unknown:
        raise ValueError(f"{path}: {unknown_names_message('recipe key', unknown, valid)}")
    booleans = boolean_argument_names()
    for key, value in recipe.items():
        if isinstance(value, bool) and key not in booleans:
            raise ValueError(
                f"{path}: {key}: {value} is a boolean (YAML reads an unquoted yes, no, on, off, true or false so), but "
                f'{key} takes text or a number: quote the word you meant, e.g. {key}: "{"yes" if value else "no"}".'
            )
    for key in sorted(list_argument_names() & set(recipe)):
        if recipe[key] is not None and not isinstance(recipe[key], list):
            raise ValueError(f"{path}: {key}: {recipe[key]!r} is one value, but {key} takes a list: write "
                             f"{key}: [{recipe[key]}].")  # fmt: skip
    if isinstance(recipe.get("config_overrides"), dict):
        recipe["config_overrides"] = ",".join(f"{k}={v}" for k, v in recipe["config_overrides"].items())
    return recipe


_CLI_DESCRIPTION = """\
Train a Transformer with the paper's recipe through transformers' Seq2SeqTrainer, in one process or under
`accelerate launch`. The first argument may be a recipe file (.yaml, .yml or .json) whose keys are the options below;
options written after it override its values.

    vaswani-train configs/quickstart.yaml
    accelerate launch --cpu --num_processes 1 scripts/train.py configs/multi30k_cpu.yaml --max_steps 2000 --output_dir runs/m30k
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (its example lines), each option with its default (HfArgumentParser's own)."""


def parse_arguments(argv: list[str] | None = None):
    """``(model_args, data_args, training_args)`` from the command line.

    The first argument may be a ``.yaml``/``.yml``/``.json`` recipe; further ``--flags`` override its values.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(
        ARGUMENT_CLASSES, allow_abbrev=False,  # --max_step is not --max_steps
        usage="%(prog)s [RECIPE.yaml] [--option VALUE ...]", description=_CLI_DESCRIPTION,
        formatter_class=_HelpFormatter,
    )  # fmt: skip
    recipe: dict[str, Any] = {}
    if argv and not argv[0].startswith("-") and Path(argv[0]).suffix.lower() in (".yaml", ".yml", ".json"):
        recipe = load_recipe(argv.pop(0))
        for action in parser._actions:
            if action.dest in recipe:
                action.required = False
    flags = given_arguments(argv)
    if recipe.get("config_overrides") and flags.get("config_overrides"):  # field by field, as other flags override
        flags["config_overrides"] = merge_config_overrides(recipe["config_overrides"], flags["config_overrides"])
    given = {**recipe, **flags}  # what the user set: recipe keys, then flags
    parser.set_defaults(**preset_training_defaults(given.get("preset", "base"), given), **recipe)
    model_args, data_args, training_args, rest = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True
    )
    if rest:
        raise ValueError(f"{unknown_arguments_message(parser, rest)} Unknown arguments: {rest}.")
    if "config_overrides" in flags:
        model_args.config_overrides = flags["config_overrides"]
    if isinstance(training_args.generation_config, os.PathLike):  # the parser makes a Path: not JSON, saving failed
        training_args.generation_config = os.fspath(training_args.generation_config)
    check_arguments_take_effect(given, data_args, training_args, flags)
    check_averaged_checkpoints_are_kept(data_args, training_args)
    return model_args, data_args, training_args


def check_arguments_take_effect(given: dict[str, Any], data_args, training_args,
                                flags: dict[str, Any] | None = None) -> None:
    """A ValueError for an argument the user gave (``given``: recipe keys and flags) that this training would ignore,
    naming what sets that value instead. ``preset`` and the tokenizer options are refused only as ``flags`` (the
    command line's; default: all of ``given``): a recipe's are its new model and tokenizer, which a config, model or
    tokenizer given replaces (the ablations' rows take a shared tokenizer so)."""
    flags = given if flags is None else flags
    if "preset" in flags and given.get("config_name"):
        raise ValueError(
            f"preset={flags['preset']} has no effect on the model with config_name={given['config_name']}, whose "
            "config sets it (config_overrides changes its fields), while the preset's training values "
            "(label_smoothing_factor, max_steps, warmup_steps) would still apply: leave preset out and set those, "
            "or leave config_name out for the preset's model."
        )
    tokenizer = [(k, given[k]) for k in ("tokenizer_name", "model_name_or_path") if given.get(k)][:1]
    for name in ("tokenizer_vocab_size", "tokenizer_model") if tokenizer else ():
        if name in flags:
            key, value = tokenizer[0]
            raise ValueError(
                f"{name}={flags[name]} has no effect with {key}={value}, whose tokenizer is used as it is "
                "(tokenizer_vocab_size and tokenizer_model set a tokenizer trained when none is given): leave it "
                f"out, or leave {key} out to train a new tokenizer."
            )
    if training_args.lr_schedule == "paper":
        for name in ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs"):
            if name in given:
                raise ValueError(
                    f"{name}={given[name]} has no effect with lr_schedule=paper, whose rates are "
                    "lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5): scale them with lr_factor, "
                    "or use lr_schedule=hf for transformers' schedules with learning_rate."
                )
    elif "lr_factor" in given:
        raise ValueError(
            f"lr_factor={given['lr_factor']} has no effect with lr_schedule={training_args.lr_schedule}, whose rates "
            f"are transformers' lr_scheduler_type with learning_rate (now {training_args.learning_rate}): set "
            "learning_rate, or use lr_schedule=paper for the paper's schedule that lr_factor scales."
        )
    if "per_device_train_batch_size" in given:
        raise ValueError(
            f"per_device_train_batch_size={given['per_device_train_batch_size']} has no effect: training batches are "
            f"token batches of max_tokens_per_batch tokens per side and device (now {data_args.max_tokens_per_batch}); "
            "set that instead (per_device_eval_batch_size sets the evaluation batches)."
        )
    if given.get("auto_find_batch_size"):
        raise ValueError(
            "auto_find_batch_size has no effect: on running out of memory it lowers per_device_train_batch_size, but "
            f"training batches are token batches of max_tokens_per_batch tokens per side and device (now "
            f"{data_args.max_tokens_per_batch}); set a max_tokens_per_batch that fits instead."
        )
    if given.get("dataloader_drop_last"):
        raise ValueError(
            "dataloader_drop_last has no effect on training: training batches are token batches of "
            f"max_tokens_per_batch tokens per side and device (now {data_args.max_tokens_per_batch}); it would only "
            "drop the last batch of the validation and test sets, which are scored whole. Leave it out."
        )
    if given.get("prediction_loss_only") and training_args.predict_with_generate:
        raise ValueError(
            "prediction_loss_only skips the translations that predict_with_generate decodes for BLEU (and the test "
            "set's examples): for losses alone, give predict_with_generate false instead."
        )
    if "gradient_accumulation_steps" in given and data_args.tokens_per_update is not None:
        raise ValueError(
            f"gradient_accumulation_steps={given['gradient_accumulation_steps']} and tokens_per_update="
            f"{data_args.tokens_per_update} both set the accumulation (tokens_per_update from max_tokens_per_batch and "
            "the number of processes): give one of them."
        )


def check_averaged_checkpoints_are_kept(data_args, training_args) -> None:
    """A ValueError when save_total_limit's rotation may delete one of the last ``average_last_checkpoints``
    checkpoints: with a best model tracked (metric_for_best_model, set by load_best_model_at_end) transformers keeps
    the best checkpoint and the newest others up to save_total_limit, so "the last N" could take the best in place of
    one deleted. save_total_limit > N keeps the newest N whatever the best."""
    num_last, limit = data_args.average_last_checkpoints, training_args.save_total_limit
    if num_last > 0 and limit and limit <= num_last and training_args.metric_for_best_model is not None:
        raise ValueError(
            f"average_last_checkpoints={num_last} with save_total_limit={limit} and a best model tracked "
            f"(metric_for_best_model={training_args.metric_for_best_model}): the rotation always keeps the best "
            f"checkpoint, counted in save_total_limit, so the last {num_last} averaged could include the best in place "
            f"of a newer one it deleted. Set save_total_limit to at least {num_last + 1}, or leave it out."
        )


def given_arguments(argv: list[str]) -> dict[str, Any]:
    """The arguments written on the command line ``argv`` (name -> parsed value), without any default.

    Parsed by a copy of the real parser whose defaults are all ``argparse.SUPPRESS``, so an argument appears only when
    the user gave it (HfArgumentParser's defaults cannot tell "given the default value" from "not given")."""
    parser = HfArgumentParser(ARGUMENT_CLASSES, add_help=False, allow_abbrev=False)  # --help is the real parser's
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


def merge_config_overrides(recipe: str, flag: str) -> str:
    """A recipe's ``config_overrides`` with a flag's fields over them (``"d_model=32,dropout=0.1"`` and
    ``"dropout=0.2"`` give ``"d_model=32,dropout=0.2"``): the flag changes the fields it names, as any flag changes
    the recipe's value, rather than replacing every field (the model fell back to the preset's size)."""
    named = set(parse_config_overrides(flag))
    kept = [item for item in recipe.split(",") if item.strip() and not set(parse_config_overrides(item)) & named]
    return ",".join([*kept, flag])


def parse_config_overrides(text: str | None) -> dict[str, Any]:
    """``"d_model=256,dropout=0.1,share_embeddings=true"`` -> typed dict (ints, floats, booleans, None, strings).
    Standard names (``hidden_size``) become the fields the config maps them to (``d_model``)."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # field -> the name it was given by
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"config_overrides: expected key=value, got {item!r}.")
        given, value = (s.strip() for s in item.split("=", 1))
        key = VaswaniTransformerConfig.attribute_map.get(given, given)
        if key in spelled:
            raise ValueError(f"config_overrides: {key} is given twice ({spelled[key]}, {given}): give it once.")
        spelled[key] = given
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
    valid = {f.name for f in dataclasses.fields(VaswaniTransformerConfig)} | set(VaswaniTransformerConfig.attribute_map)
    unknown = sorted(set(out) - valid)
    if unknown:
        raise ValueError(f"config_overrides: {unknown_names_message('config field', unknown, valid)}")
    return out


# --------------------------------------------------------------------------------------------- whole job


def format_summary(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in summary.items())


def _prepare_data(model_args, data_args, training_args):
    if data_args.synthetic_task is not None and data_args.dataset_name is not None:
        raise ValueError(f"Both --synthetic_task ({data_args.synthetic_task}) and --dataset_name "
                         f"({data_args.dataset_name}) given: the dataset would be trained on; give one or the other.")
    if data_args.synthetic_task is not None:
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
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is not None:
        return AutoTokenizer.from_pretrained(name, cache_dir=model_args.cache_dir)
    folder = os.path.join(training_args.output_dir, "tokenizer")
    asked = {"tokenizer_model": model_args.tokenizer_model, "tokenizer_vocab_size": model_args.tokenizer_vocab_size,
             # what it was trained on: a tokenizer left by a run on other data or languages would not fit this one's
             "source_lang": data_args.source_lang, "target_lang": data_args.target_lang,
             "train_file": os.path.abspath(data_args.train_file) if data_args.train_file else None,
             "dataset_name": data_args.dataset_name, "dataset_config_name": data_args.dataset_config_name}
    # Every process enters (and leaves) main_process_first exactly once: rank 0 trains, the others then load.
    with training_args.main_process_first(desc="training the tokenizer"):
        if os.path.isfile(os.path.join(folder, "tokenizer.json")):
            _check_earlier_tokenizer(folder, asked)
            logger.info("Using the tokenizer trained earlier in %s", folder)
            return AutoTokenizer.from_pretrained(folder)
        if "train" not in raw:
            raise ValueError("No tokenizer given and no train split to train one on: pass --tokenizer_name.")
        logger.info("Training a shared %s vocabulary of %d on the train split", model_args.tokenizer_model,
                    model_args.tokenizer_vocab_size)
        tokenizer = train_tokenizer(
            iter_parallel_texts(raw, data_args.source_lang, data_args.target_lang, split="train"),
            vocab_size=model_args.tokenizer_vocab_size,
            model=model_args.tokenizer_model,
            length=2 * len(raw["train"]),
            show_progress=training_args.process_index == 0 and not training_args.disable_tqdm,
            output_dir=folder,
        )
        if training_args.process_index == 0:
            Path(folder, TOKENIZER_OPTIONS_FILE).write_text(json.dumps(asked, indent=2) + "\n", encoding="utf-8")
        return tokenizer


TOKENIZER_OPTIONS_FILE = "training_options.json"


def _check_earlier_tokenizer(folder: str, asked: dict[str, Any]) -> None:
    """ValueError when the tokenizer that a run trained earlier in `folder` was trained with other options or on other
    data (languages, train file or dataset) than this run asks for: reusing it would silently ignore
    --tokenizer_model / --tokenizer_vocab_size, or fit another corpus. What an older record lacks is not compared."""
    options = Path(folder, TOKENIZER_OPTIONS_FILE)
    if not options.is_file():  # trained by a version that did not record its options, or placed there by hand
        logger.warning("%s holds no %s: cannot check that it was trained with %s.", folder, TOKENIZER_OPTIONS_FILE,
                       asked)
        return
    earlier = json.loads(options.read_text(encoding="utf-8"))
    differ = {k: (earlier[k], v) for k, v in asked.items() if k in earlier and earlier[k] != v}
    if differ:
        said = ", ".join(f"--{k} {v!r} (it has {e!r})" for k, (e, v) in differ.items())
        raise ValueError(
            f"{folder} holds a tokenizer an earlier run trained with other options than this run's {said}. Use a "
            f"new --output_dir, delete {folder} to train a new one, or pass the earlier run's options (or "
            f"--tokenizer_name {folder}) to reuse it."
        )


def prepare_kernels(device: torch.device, keep_freed_memory: bool = True) -> None:
    """This process's kernel settings for training on `device`, each logged: on a CPU freed memory kept
    (`keep_freed_cpu_memory`, unless `keep_freed_memory` is False) and more oneDNN kernels kept
    (`keep_onednn_primitives`); on a CUDA GPU SDPA kept off cuDNN's attention (`skip_cudnn_attention`), which builds a
    plan for each new shape of token batches."""
    if device.type == "cpu":
        if keep_freed_memory and keep_freed_cpu_memory():
            logger.info("Training on CPU: freed memory stays in the process (glibc mallopt, keep_freed_cpu_memory).")
        logger.info("Training on CPU: oneDNN keeps up to %s compiled kernels (keep_onednn_primitives).",
                    keep_onednn_primitives())
    if device.type == "cuda" and skip_cudnn_attention():
        logger.info("Training on CUDA: attention skips cuDNN's kernel, which plans each new shape "
                    "(skip_cudnn_attention).")


def idle_cpu_cores_warning(device: torch.device, world_size: int = 1) -> str | None:
    """The warning for CPU training that `accelerate launch` left at one torch thread per process while cores stay idle
    (its launcher sets OMP_NUM_THREADS=1 unless told `--num_cpu_threads_per_process`, or `--cpu --num_processes N`,
    which divides the physical cores among them). None where no core is idle."""
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1  # accelerate's count; hyperthreads add little
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    launched = "ACCELERATE_MIXED_PRECISION" in os.environ  # set by accelerate's launchers, not by a plain python
    if device.type != "cpu" or not launched or os.environ.get("OMP_NUM_THREADS") != "1" or processes >= cores:
        return None
    return (f"Training on CPU with 1 torch thread in each of {processes} process(es) while {cores} cores are "
            f"available: accelerate launch set OMP_NUM_THREADS=1. Pass it --cpu --num_processes {processes} (threads "
            f"= physical cores / processes) or --num_cpu_threads_per_process {cores // processes}.")


def training_attention(model_args, training_args) -> str | None:
    """The attention kernel to train with: the one asked for; else eager for bf16 on a CPU, where PyTorch's SDPA
    backward runs bf16 no faster than fp32 (eager: ~1.4x, benchmarks/training_step_speed.py); else the default."""
    if model_args.attn_implementation is not None:
        return model_args.attn_implementation
    return "eager" if training_args.bf16 and training_args.device.type == "cpu" else None


def _load_model(model_args, tokenizer, attention: str | None = None):
    overrides = parse_config_overrides(model_args.config_overrides)
    kernel = {} if attention is None else {"attn_implementation": attention}
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


def truncate_long_sources(dataset, limit: int | None, eos_token_id: int | None, where: str, warn: bool = True,
                          first_line: int = 1):
    """An evaluation split whose sources longer than ``limit`` tokens (what the model can take) are cut as translate
    cuts them (``pipeline.truncate_source``, keeping ``</s>``), with a warning naming each pair (``where:N``, N the
    pair's line in a data file: ``first_line``, the line of the first pair (``data.first_pair_line``: 2 after a TSV
    header), for the first; in a dataset its 1-based row). A reference longer than ``limit`` is kept whole, for BLEU,
    with a warning: the validation loss counts its first ``limit`` tokens (``VaswaniSeq2SeqTrainer.compute_loss``)."""
    if limit is None:
        return dataset
    lengths = dataset[SOURCE_LENGTH_COLUMN]
    long = {i for i, n in enumerate(lengths) if n > limit}
    for i in sorted(long) if warn else ():
        logger.warning("%s:%d: the source has %d tokens, more than the model's limit of %d; scoring its first %d "
                       "tokens.", where, i + first_line, lengths[i], limit, limit)
    for i, n in enumerate(dataset[TARGET_LENGTH_COLUMN]) if warn else ():
        if n > limit:
            logger.warning("%s:%d: the reference has %d tokens, more than the model's limit of %d; BLEU scores it "
                           "whole, the loss counts its first %d tokens.", where, i + first_line, n, limit, limit)
    if not long:
        return dataset

    def cut(example: dict, index: int) -> dict:
        if index in long:
            example["input_ids"] = truncate_source(example["input_ids"], limit, eos_token_id)
            example[SOURCE_LENGTH_COLUMN] = len(example["input_ids"])
        return example

    return dataset.map(cut, with_indices=True, desc="Truncating long sources")


def _length_limit(data_args, side: str, position_limit: int | None) -> tuple[int, str]:
    """The training filter's token limit for one side (``</s>`` included) and what sets it: ``--max_<side>_length``
    (default and most: ``--max_tokens_per_batch``), or a learned-position model's ``max_position_embeddings`` when
    smaller."""
    given, batch = getattr(data_args, f"max_{side}_length"), data_args.max_tokens_per_batch
    if given is not None and given <= batch:
        limit = (given, f"--max_{side}_length {given}")
    elif given is not None:  # a longer pair fits no token batch: the sampler would drop it, uncounted
        limit = (batch, f"--max_tokens_per_batch {batch}, a batch's most tokens, below --max_{side}_length {given}")
    else:
        limit = (batch, f"--max_tokens_per_batch {batch}, the default of --max_{side}_length")
    if position_limit is not None and position_limit < limit[0]:
        limit = (position_limit, f"max_position_embeddings={position_limit} of the model's learned positions")
    return limit


def check_training_pairs_left(report: FilterReport, limits: dict[str, tuple[int, str]],
                              max_length_ratio: float | None) -> None:
    """ValueError when the filters dropped every pair of the training split: the run would make no update and save
    an untrained model as if trained. Names the counts and the flag or limit behind each rule that dropped pairs
    (``limits``: side -> (tokens, what sets it), as `_length_limit` gives)."""
    counts = report.splits["train"]
    if counts["kept"] > 0 or counts["total"] == 0:  # (an empty split is refused before: `run_training`)
        return
    (source, source_by), (target, target_by) = limits["source"], limits["target"]
    causes = {
        "empty_source": "no source text",
        "empty_target": "no target text",
        "source_too_long": f"more than {source} source tokens, </s> included, set by {source_by}",
        "target_too_long": f"more than {target} target tokens, </s> included, set by {target_by}",
        "length_ratio": f"a longer/shorter side ratio above {max_length_ratio}, set by --max_length_ratio",
    }
    dropped = "; ".join(f"{rule} {counts[rule]} ({cause})" for rule, cause in causes.items() if counts[rule])
    raise ValueError(
        f"The filters dropped all {counts['total']} training pairs, so training would make no update: {dropped}. "
        "Raise the limits named, or check the training data."
    )


def run_training(model_args: ModelArguments, data_args: DataTrainingArguments,
                 training_args: VaswaniTrainingArguments, callbacks: list | None = None) -> dict[str, Any]:
    """The whole job: data -> tokenizer -> model -> train -> (average) -> test BLEU -> examples -> summary.

    Returns a dict with ``summary``, ``eval`` and ``test`` metrics (of the averaged model when averaging; then also
    ``eval_before_averaging`` and ``eval_averaged``, decoded with the same alpha) and ``examples``; also written to
    ``output_dir/training_summary.json`` by the main process.
    """
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
    resume = None
    if training_args.do_train and training_args.resume_from_checkpoint in NOT_RESUMING:
        refuse_other_checkpoints(training_args.output_dir)  # before anything is written there
    elif training_args.do_train:  # the newest complete checkpoint is found (and a broken one moved aside) by rank 0
        resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir,
                                           quarantine=training_args.process_index == 0)
        if resume is not None:
            refuse_other_checkpoints(training_args.output_dir, resume)
    prepare_kernels(training_args.device, training_args.keep_freed_cpu_memory)
    if training_args.process_index == 0 and (warning := idle_cpu_cores_warning(training_args.device,
                                                                             training_args.world_size)):
        logger.warning(warning)

    with training_args.main_process_first(desc="preparing the data"):
        raw = _prepare_data(model_args, data_args, training_args)
    if data_args.length_penalty_grid and ("validation" not in raw or not training_args.predict_with_generate):
        raise ValueError(
            f"length_penalty_grid={data_args.length_penalty_grid} chooses alpha by validation BLEU: it needs a "
            "validation set (--validation_file, or a dataset with a validation split) and predict_with_generate."
        )
    needed = {"do_eval": ("validation", "--validation_file"), "do_predict": ("test", "--test_file")}
    for flag, (split, file_flag) in needed.items():  # before any work: else they were skipped silently
        if getattr(training_args, flag) and split not in raw:
            strategy = training_args.eval_strategy
            by = f" (set by --eval_strategy {strategy.value})" if flag == "do_eval" and strategy != "no" else ""
            raise ValueError(f"--{flag}{by} scores the {split} set, but there is none: give {file_flag} (or a dataset "
                             f"with a {split} split), or leave --{flag} out.")
    if training_args.do_train and "train" in raw and len(raw["train"]) == 0:  # an empty split of a dataset
        raise ValueError("The training split holds no pairs, so training would make no update: give training data "
                         "with pairs, or leave --do_train out.")
    tokenizer = _load_tokenizer(model_args, data_args, training_args, raw)
    model = _load_model(model_args, tokenizer, training_attention(model_args, training_args))
    check_tokenizer_matches_config(tokenizer, model.config)  # before any training

    max_tokens = data_args.max_tokens_per_batch
    position_limit = source_length_limit(model.config)  # learned positions: the most tokens a side can have
    limits = {side: _length_limit(data_args, side, position_limit) for side in ("source", "target")}
    with training_args.main_process_first(desc="tokenizing"):
        # The filters apply to the training split only: validation and test sets are scored whole.
        tokenized, report = tokenize_parallel_dataset(
            raw, tokenizer, data_args.source_lang, data_args.target_lang,
            max_source_tokens=limits["source"][0],
            max_target_tokens=limits["target"][0],
            max_length_ratio=data_args.max_length_ratio,
            num_proc=data_args.preprocessing_num_workers,
            load_from_cache_file=not data_args.overwrite_cache,
            filter_splits=("train",),
        )
        for split in ("validation", "test"):
            if split in tokenized:
                file = getattr(data_args, f"{split}_file") if data_args.dataset_name is None else None
                where = file or f"{data_args.dataset_name or 'data'}[{split}]"
                first_line = first_pair_line(file, data_args.source_lang, data_args.target_lang) if file else 1
                tokenized[split] = truncate_long_sources(tokenized[split], position_limit, tokenizer.eos_token_id,
                                                         where, warn=training_args.process_index == 0,
                                                         first_line=first_line)  # fmt: skip
    if training_args.do_train and "train" in tokenized:  # on every process alike: each filtered the same pairs
        check_training_pairs_left(report, limits, data_args.max_length_ratio)
    collator = TranslationDataCollator(tokenizer)
    compute_metrics = None
    if training_args.predict_with_generate:
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
        trainer.save_model(push=False)  # --push_to_hub: the tested model, at the end (push_trained_model)
        trainer.save_state()
        result["summary"] = trainer.training_summary()
        # Table 2's cost: model FLOPs (forward + backward) from the config at the training set's average lengths.
        result["summary"].update(run_training_cost(model.config, tokenized["train"],
                                                   result["summary"]["target_tokens_seen"]))
        if trainer.is_world_process_zero():
            print("Training summary:\n" + format_summary(result["summary"]), flush=True)
            cost = result["summary"]
            if cost["training_flops"] is not None:
                print(f"Training cost: {cost['training_flops']:.3g} model FLOPs (forward + backward, "
                      f"{cost['model_flops_per_target_token']:.3g} per target token; vaswani_transformer.flops)",
                      flush=True)
    tested_dir = training_args.output_dir  # the folder of the model the test set scores
    validated_otherwise = decode_the_tested_model_as_saved(trainer)
    compare_average = data_args.average_last_checkpoints > 0 and training_args.do_eval and "validation" in tokenized
    if compare_average:  # the model before averaging, on the validation set: averaging a short run can cost BLEU
        before = (None if validated_otherwise else _final_step_eval(trainer)) or trainer.evaluate(
            metric_key_prefix="eval"
        )
        result["eval_before_averaging"] = _with_length_penalty(before, trainer)
    if data_args.average_last_checkpoints > 0:
        if trainer.is_world_process_zero():
            result["averaged_model"] = average_last_checkpoints(training_args.output_dir,
                                                                data_args.average_last_checkpoints)
        trainer.accelerator.wait_for_everyone()  # the other processes wait for rank 0's average, then load it
        averaged_dir = os.path.join(training_args.output_dir, "averaged")
        if os.path.isdir(averaged_dir):  # absent on a node that does not share rank 0's file system
            averaged_model = AutoModelForSeq2SeqLM.from_pretrained(averaged_dir)
            trainer.model = trainer.model_wrapped = averaged_model.to(trainer.args.device)
            tested_dir = averaged_dir
    if compare_average:  # the averaged model decoded as the one before it, before the grid changes alpha
        result["eval_averaged"] = _with_length_penalty(trainer.evaluate(metric_key_prefix="eval"), trainer)
        if trainer.is_world_process_zero():  # fewer checkpoints than asked are averaged when the run has fewer
            _report_averaging(result["eval_before_averaging"], result["eval_averaged"],
                              training_info_of_model(tested_dir).get("average_last_checkpoints"))
    if data_args.length_penalty_grid:
        record = trainer.choose_length_penalty(tokenized["validation"], data_args.length_penalty_grid)
        result["length_penalty"] = record
        if trainer.is_world_process_zero():
            if Path(tested_dir, "config.json").is_file():  # the tested model's folder decodes with the chosen alpha
                trainer.accelerator.unwrap_model(trainer.model).generation_config.save_pretrained(tested_dir)
            scores = ", ".join(f"{a:g}: {b:.2f}" for a, b in record["validation_bleu"].items())
            print(f"Length penalty chosen on the validation set: {record['chosen']:g} (validation sacreBLEU {scores})",
                  flush=True)
    if training_args.do_eval and "validation" in tokenized:  # the tested model, as tested (the grid's alpha)
        result["eval"] = result["eval_averaged"] if compare_average and not data_args.length_penalty_grid else \
            _with_length_penalty(trainer.evaluate(metric_key_prefix="eval"), trainer)
    if training_args.do_predict and "test" in tokenized:
        output = trainer.predict(tokenized["test"], metric_key_prefix="test")
        result["test"] = _with_length_penalty(output.metrics, trainer, "test")
        trainer.log_metrics("test", result["test"])
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            preds = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
            hyps = tokenizer.batch_decode(preds, skip_special_tokens=True)
            n = min(data_args.num_translation_examples, len(hyps))
            pairs = raw["test"].select(range(n))["translation"]
            result["examples"] = [
                {"source": p[data_args.source_lang], "reference": p[data_args.target_lang], "hypothesis": h}
                for p, h in zip(pairs, hyps[:n])
            ]
            write_lines(hyps, Path(tested_dir, "test_translations.txt"))
            print(f"Test BLEU {result['test'].get('test_bleu', float('nan')):.2f}; examples:", flush=True)
            for ex in result["examples"]:
                print(f"  src: {ex['source']}\n  ref: {ex['reference']}\n  hyp: {ex['hypothesis']}\n", flush=True)
    if trainer.is_world_process_zero():
        os.makedirs(training_args.output_dir, exist_ok=True)
        # The summary first: the card reads this run's figures (tokens, training FLOPs) from it.
        Path(training_args.output_dir, SUMMARY_NAME).write_text(json.dumps(result, indent=2, default=str) + "\n")
        # Each folder's results (and card) describe its own weights and decoding: the tested model's in tested_dir
        # (averaged/ when averaging), the final weights' validation score before averaging in output_dir.
        folders = {tested_dir: {"test": result.get("test"), "eval": result.get("eval")}}
        if tested_dir != training_args.output_dir:
            folders[training_args.output_dir] = {"eval": result.get("eval_before_averaging")}
        for folder, metrics in folders.items():
            for prefix, values in metrics.items():
                if values is not None:
                    _save_metrics(trainer, folder, prefix, values)
        if training_args.do_train:
            datasets = [data_args.dataset_name] if data_args.dataset_name else None  # the card's `datasets`
            trainer.create_model_card(language=[data_args.source_lang, data_args.target_lang], dataset=datasets)
            if tested_dir != training_args.output_dir:
                _write_averaged_model_card(trainer, tested_dir, data_args, datasets)
            if training_args.push_to_hub:
                result["pushed"] = push_trained_model(
                    trainer, tested_dir, data_args.source_lang, data_args.target_lang, datasets
                )
                print(f"Pushed {tested_dir} to the Hub: {result['pushed']}", flush=True)
    return result


def refuse_other_checkpoints(output_dir: str, resume: str | None = None) -> None:
    """ValueError, on every process alike (rank 0's file system decides), when output_dir holds ``checkpoint-*``
    folders of other training: any, for a run that does not resume (an earlier run's); newer than the checkpoint
    ``resume``, for one that does (another branch of training). Averaging, save_total_limit's rotation and a later
    ``--resume_from_checkpoint latest`` would take them for this run's."""
    found = find_checkpoints(output_dir) if os.path.isdir(output_dir) else []
    if resume is not None:
        step = _checkpoint_global_step(resume)
        found = [p for p in found if step is not None and checkpoint_step(p) > step]
    if not rank0_decides(bool(found)):
        return
    names = ", ".join(p.name for p in found[-3:]) if found else "checkpoint-* folders"
    if resume is None:
        raise ValueError(
            f"--output_dir {output_dir} holds checkpoints of an earlier run ({names}); a new run there would average, "
            "rotate and resume them as its own. Train into a new --output_dir, continue that run with "
            "--resume_from_checkpoint latest, or delete its checkpoint-* folders."
        )
    raise ValueError(
        f"resume_from_checkpoint={resume} is older than {names} in --output_dir {output_dir}: training on from it "
        "there would average, rotate and resume them as its own. Resume into a new --output_dir (the checkpoint "
        "stays where it is), or delete the newer checkpoint-* folders to go back."
    )


def _checkpoint_global_step(checkpoint: str) -> int | None:
    """The update a checkpoint was saved at: its folder's number, else its trainer_state.json's global_step."""
    step = checkpoint_step(checkpoint)
    state = Path(checkpoint, "trainer_state.json")
    if step is None and state.is_file():
        step = json.loads(state.read_text(encoding="utf-8")).get("global_step")
    return step


def decode_the_tested_model_as_saved(trainer) -> bool:
    """From here on (the scores of the tested model: before and after averaging, the length-penalty grid, validation
    and test), decode as the saved model decodes, with its generation config: transformers' `generation_num_beams` and
    `generation_max_length` decode the validation during training only (a cheaper one). They used to decode the test
    too, so the published score was another decoding's than the model's, and the grid's alpha was chosen for it (with
    one beam, any alpha ties). Returns whether they were set (then the last update's validation is not comparable)."""
    args = trainer.args
    names = ("generation_num_beams", "generation_max_length")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if given and args.predict_with_generate and trainer.is_world_process_zero():
        settings = ", ".join(f"{name}={value}" for name, value in given.items())
        config = trainer.accelerator.unwrap_model(trainer.model).generation_config
        logger.warning(
            f"{settings} decoded the validation during training; the tested model's scores decode as it is saved "
            f"(num_beams={config.num_beams}, its length rule): to publish another decoding, give --generation_config."
        )
    for name in given:
        setattr(args, name, None)
    return bool(given)


def _final_step_eval(trainer) -> dict[str, float] | None:
    """The validation metrics the Trainer logged at the run's last update (``eval_steps`` dividing ``max_steps``), or
    None when it logged none there, or when the model is not the last update's (``load_best_model_at_end`` loaded
    the best checkpoint's weights, whose score that is not)."""
    if trainer.args.load_best_model_at_end:
        return None
    step = trainer.state.global_step
    logged = [h for h in trainer.state.log_history if h.get("step") == step and "eval_loss" in h]
    return {k: v for k, v in logged[-1].items() if k.startswith("eval_")} if logged else None


def _with_length_penalty(metrics: dict[str, float], trainer, prefix: str = "eval") -> dict[str, float]:
    """``metrics`` of a validation (or test) run plus ``<prefix>_length_penalty``, the alpha its translations were
    decoded with (the model's generation config); as they are when the run does not decode."""
    if not trainer.args.predict_with_generate:
        return metrics
    alpha = trainer.accelerator.unwrap_model(trainer.model).generation_config.length_penalty
    return {**metrics, f"{prefix}_length_penalty": alpha}


def _save_metrics(trainer, folder: str, prefix: str, metrics: dict[str, float]) -> None:
    """``<prefix>_results.json`` in ``folder``, as ``Trainer.save_metrics`` writes it in ``output_dir`` (there it also
    updates ``all_results.json``); the model card of the folder reads it (``card.trainer_metric_reports``)."""
    if os.path.abspath(folder) == os.path.abspath(trainer.args.output_dir):
        trainer.save_metrics(prefix, metrics)
    else:
        Path(folder, f"{prefix}_results.json").write_text(json.dumps(metrics, indent=4, sort_keys=True) + "\n")


def _write_averaged_model_card(trainer, folder: str, data_args, datasets: list[str] | None = None) -> None:
    """The averaged model's card in ``folder`` (``hub.write_repository_extras``, as the run folder's): its own scores
    (the results files there), the run's recipe and totals plus the number of checkpoints averaged (as recorded
    there: fewer than asked when the run had fewer), and the run's learning curve."""
    run_dir = trainer.args.output_dir
    info = {**training_info_of_model(folder, run_dir), **training_info_from_trainer(trainer)}
    write_repository_extras(folder, info, trainer_metric_reports(folder), source_lang=data_args.source_lang,
                            target_lang=data_args.target_lang, training_run=run_dir, datasets=datasets)  # fmt: skip


def _report_averaging(before: dict[str, float], averaged: dict[str, float], num_last: int) -> None:
    """Print the validation score before and after averaging (BLEU of the same decoding: the alpha is printed); warn
    when averaging made it worse (BLEU where the run decodes, else the loss): a run whose last checkpoints still differ
    much (a short run) can lose several BLEU."""
    bleu = "eval_bleu" in before and "eval_bleu" in averaged
    key, name = ("eval_bleu", "BLEU") if bleu else ("eval_loss", "loss")
    alpha = before.get("eval_length_penalty")
    decoded = f", both decoded with length penalty {alpha:g}" if bleu and alpha is not None else ""
    print(f"Validation {name}: {averaged[key]:.4g} averaged (last {num_last} checkpoints), {before[key]:.4g} before "
          f"averaging{decoded}", flush=True)
    if (averaged[key] < before[key]) if bleu else (averaged[key] > before[key]):
        logger.warning(
            "Averaging the last %d checkpoints made the validation %s worse (%.4g -> %.4g); the averaged model is "
            "the one tested and in averaged/, the model before it in the run's folder. Checkpoints far apart or early "
            "in a short run average badly; vaswani-average averages any others.", num_last, name, before[key],
            averaged[key],
        )  # fmt: skip


def run_from_args(argv: list[str] | None = None, callbacks: list | None = None) -> dict[str, Any]:
    """Parse a training command line ``argv`` (a recipe file, then flags) and run the job; returns its results. Under
    ``accelerate launch`` the job ends the process group (`end_distributed_job`): one job per process, as a script."""
    model_args, data_args, training_args = parse_arguments(argv)
    results = run_training(model_args, data_args, training_args, callbacks=callbacks)
    end_distributed_job()
    return results


def end_distributed_job() -> None:
    """Shut the process group down while the interpreter is whole (accelerate's `end_training` does the same). Left to
    interpreter finalization, gloo's worker threads can abort a finished run's process (SIGABRT, "terminate called
    without an active exception"): a failed exit status after a successful run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Command line of training (``scripts/train.py``, ``vaswani-train``); a bad command line or recipe is one error
    line and exit status 2, as argparse answers; bad input met while running (data files, tokenizer, model config,
    checkpoint: a ValueError or FileNotFoundError naming it), a loss that is not finite, a checkpoint write that failed
    (disk full) and a checkpoint's state file that torch's weights-only loader refuses are one error line and exit
    status 1."""
    try:
        arguments = parse_arguments(argv)
    except (ValueError, FileNotFoundError) as error:
        print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    output_dir = arguments[2].output_dir
    if output_dir and (problem := output_path_problem(output_dir, "--output_dir", directory=True)):
        print(f"{Path(sys.argv[0]).name}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    try:
        run_training(*arguments)
        end_distributed_job()
    # Bad data, tokenizer, config or checkpoint, a loss that is not finite, a checkpoint that could not be written
    # (disk full): each names the problem in one line; the traceback is logged at debug level.
    except (ValueError, FileNotFoundError, NonFiniteLossError, CheckpointWriteError, pickle.UnpicklingError) as error:
        logger.debug("Training stopped", exc_info=True)
        message = _refused_pickle_message(error) if isinstance(error, pickle.UnpicklingError) else error
        print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
        raise SystemExit(1) from None


def _refused_pickle_message(error: pickle.UnpicklingError) -> str:
    """The one line for a resumed checkpoint's state file that torch's weights-only loader refused (its long message's
    reason line)."""
    lines = str(error).strip().splitlines()
    reason = next((line.strip() for line in lines if "Unpickler error" in line), lines[-1] if lines else "")
    return (f"a file of the checkpoint resumed (optimizer, scheduler or RNG state) holds a pickle that could run code, "
            f"refused by torch's weights-only loader ({reason}). Resume only checkpoints you trust; --model_name_or_path "
            "CHECKPOINT starts a new run from its safetensors weights.")


__all__ = [
    "DataTrainingArguments",
    "ModelArguments",
    "VaswaniTrainingArguments",
    "check_training_pairs_left",
    "end_distributed_job",
    "given_arguments",
    "idle_cpu_cores_warning",
    "load_recipe",
    "main",
    "parse_arguments",
    "parse_config_overrides",
    "prepare_kernels",
    "preset_training_defaults",
    "refuse_other_checkpoints",
    "run_from_args",
    "run_training",
    "truncate_long_sources",
]


if __name__ == "__main__":  # python -m vaswani_transformer.train, as the console script
    sys.exit(main())
