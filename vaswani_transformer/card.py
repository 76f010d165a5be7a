"""The model card of our models: training recipe, evaluation results, rendered from the packaged template.

- `render_model_card(folder, training_info=..., eval_results=...)`: a huggingface_hub `ModelCard` rendered from
  `vaswani_transformer/model_cards/vaswani_transformer.md` (package data): language pair, preset and parameter count,
  the training recipe, sacreBLEU/chrF/tokenized BLEU as `model-index` results, usage, limitations.
- `training_info_from_run(run_dir)` / `training_info_from_trainer(trainer)`: the recipe a run recorded;
  `training_info_of_model(folder)`: the recipe behind a model folder (the run's, and the checkpoints averaged).
- `eval_results_for_card(reports, ...)`, `trainer_metric_reports(output_dir, trainer)`: evaluation results for the
  card, from the JSON reports of `vaswani_transformer.evaluation` or a Trainer run's own metrics.
- `write_card_pictures(folder, training_run=..., attention_source=...)`: the pictures the card shows, written next to
  it (relative Markdown images, so they show on the Hub): the run's learning curve and one cross-attention picture.

The repository around the card (code files, pipeline, generation config, upload) is `vaswani_transformer.hub`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import safe_open

from .checkpoints import AVERAGING_RECORD_NAME
from .configuration_vaswani_transformer import PRESETS, VaswaniTransformerConfig
from .generation import PAPER_GENERATION_DEFAULTS


logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
# The card template ships inside the package (package data), so installed wheels have it; or pass `template_path`.
TEMPLATE_NAME = "vaswani_transformer.md"
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "model_cards" / TEMPLATE_NAME
EXAMPLE_SENTENCE = "A man is riding a bicycle down the street."  # the card's usage example; hub validates with it
LEARNING_CURVE_FILE = "learning_curve.png"  # pictures written next to README.md, linked by relative paths
ATTENTION_PICTURE_FILE = "attention.png"

# Fields of the training run shown in the card, in this order (whatever is present), with their labels.
TRAINING_FIELDS = {
    "preset": "preset",
    "updates": "updates (optimizer steps)",
    "max_steps": "max_steps",
    "num_train_epochs": "epochs",
    "max_tokens_per_batch": "tokens per batch per process (each side)",
    "tokens_per_update": "tokens per update",
    "gradient_accumulation_steps": "gradient accumulation",
    "num_processes": "processes",
    "optimizer": "optimizer",
    "adam_beta1": "Adam beta1",
    "adam_beta2": "Adam beta2",
    "adam_epsilon": "Adam epsilon",
    "lr_schedule": "learning-rate schedule",
    "lr_factor": "schedule factor",
    "lr_scheduler_type": "transformers schedule",
    "lr_scheduler_kwargs": "schedule arguments",
    "learning_rate": "learning rate",
    "warmup_steps": "warmup steps",
    "max_train_minutes": "time budget (minutes)",
    "lr_decay_minutes": "decay over the budget's last (minutes)",
    "label_smoothing_factor": "label smoothing",
    "weight_decay": "weight decay",
    "max_grad_norm": "gradient clipping",
    "dropout": "dropout (P_drop)",
    "average_last_checkpoints": "checkpoints averaged",
    "source_tokens_seen": "source tokens seen",
    "target_tokens_seen": "target tokens seen",
    "wall_time_seconds": "wall time (s)",
    "training_flops": "training compute (model FLOPs, forward + backward)",
    "model_flops_per_target_token": "model FLOPs per target token",
    "bf16": "bf16",
    "fp16": "fp16",
    "seed": "seed",
}



def read_json(path: Path) -> dict:
    """The JSON object in `path`; errors name the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.") from None
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON ({error}).") from None


def count_parameters(folder: PathLike) -> int:
    """Number of parameters stored in the folder's safetensors files (tied matrices are stored, and counted, once)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .safetensors weights.")
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                numel = 1
                for size in f.get_slice(name).get_shape():
                    numel *= size
                total += numel
    return total


_ARCHITECTURE_FIELDS = ("d_model", "encoder_layers", "decoder_layers", "num_heads", "d_ff", "head_dim_k", "head_dim_v",
                        "dropout", "position_encoding", "share_embeddings", "scale_embedding")  # fmt: skip


def detect_preset(config) -> str:
    """The first paper preset (`base`, `big`, Table 3 rows) whose architecture equals `config`'s, else "custom". The
    big model with P_drop 0.1 is `big`: Section 6.1's English-to-French big model (configs/wmt14_en_fr_big.yaml)."""
    for name in PRESETS:
        preset = VaswaniTransformerConfig.from_preset(name)
        if name == "big" and config.dropout == 0.1:
            preset.dropout = 0.1
        if all(getattr(preset, f) == getattr(config, f) for f in _ARCHITECTURE_FIELDS):
            return name
    return "custom"


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --------------------------------------------------------------------------------------- training / results


def _recipe_fields(args: Mapping[str, Any]) -> dict[str, Any]:
    """The card's recipe fields of training arguments (`TrainingArguments.to_dict()`): the number of updates or of
    epochs (whichever applies), the settings of the schedule in use (the paper's: its factor, not the learning rate
    it ignores; transformers': its type and arguments, not the paper's factor), the optimizer."""
    info = {k: args[k] for k in TRAINING_FIELDS if k in args and args[k] not in (None, "", {})}
    if info.get("max_steps", 0) and info["max_steps"] > 0:
        info.pop("num_train_epochs", None)
    elif "max_steps" in info:
        info.pop("max_steps")
    if info.get("lr_schedule") == "paper":
        for name in ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs"):  # ignored by the paper schedule
            info.pop(name, None)
    else:
        info.pop("lr_factor", None)  # the paper schedule's factor: no effect on transformers' schedules
    if "lr_scheduler_kwargs" in info:
        info["lr_scheduler_kwargs"] = json.dumps(info["lr_scheduler_kwargs"], sort_keys=True)
    if "lr_schedule" in args:  # our arguments: VaswaniSeq2SeqTrainer's Adam unless `optim` names another
        from .trainer import describe_optimizer, uses_paper_optimizer  # (the trainer module imports this one)

        info["optimizer"] = describe_optimizer(args)
        if not uses_paper_optimizer(args):  # Adam's settings do not apply
            for name in ("adam_beta1", "adam_beta2", "adam_epsilon"):
                info.pop(name, None)
    else:
        info["optimizer"] = str(args.get("optim", "adamw_torch"))
    return info


def training_info_from_run(run_dir: PathLike) -> dict[str, Any]:
    """What a training run recorded: `training_summary.json` (updates, tokens seen, wall time, processes, tokens per
    batch) and `trainer_state.json` (global step), plus `training_args.json` (any recipe fields) when present. Missing
    files are skipped; an empty dict means nothing was recorded."""
    run_dir = Path(run_dir)
    info: dict[str, Any] = {}
    args_file = run_dir / "training_args.json"  # written next to trainer_state.json by VaswaniSeq2SeqTrainer.save_state
    if args_file.is_file():
        info.update(_recipe_fields(read_json(args_file)))
    state_file = run_dir / "trainer_state.json"
    if state_file.is_file():
        state = read_json(state_file)
        if state.get("global_step"):
            info["updates"] = state["global_step"]
    summary_file = run_dir / "training_summary.json"
    if summary_file.is_file():
        summary = read_json(summary_file).get("summary") or {}
        info.update({k: v for k, v in summary.items() if k in TRAINING_FIELDS and v is not None})
    return info


def training_info_of_model(folder: PathLike, training_run: PathLike | None = None) -> dict[str, Any]:
    """The recipe behind the weights in a model `folder`: `training_info_from_run` of `training_run`, else of the
    folder, else of the run folder around it (`averaged/`, a copied model), plus the number of checkpoints averaged
    when the folder holds an average (`averaged_checkpoints.json` of `checkpoints.average_checkpoints`)."""
    folder = Path(folder)
    if training_run is not None:
        info = training_info_from_run(training_run)
    else:
        info = training_info_from_run(folder) or training_info_from_run(folder.parent)
    record = folder / AVERAGING_RECORD_NAME
    if record.is_file():
        info["average_last_checkpoints"] = read_json(record)["num_checkpoints"]
    return info


def training_info_from_trainer(trainer) -> dict[str, Any]:
    """The recipe of a `Seq2SeqTrainer` run: its arguments (optimizer, schedule, smoothing, steps, precision) and
    state, plus `max_tokens_per_batch` when the trainer batches by tokens. Collective-free (rank 0 calls it)."""
    info = _recipe_fields(trainer.args.to_dict())
    if getattr(trainer, "max_tokens_per_batch", None):
        info["max_tokens_per_batch"] = trainer.max_tokens_per_batch
    info["num_processes"] = trainer.args.world_size
    if trainer.state is not None and trainer.state.global_step:
        info["updates"] = trainer.state.global_step
    return info


REPORT_SCORES = ("sacrebleu", "tokenized_bleu", "chrf")


def is_evaluation_report(value: Any) -> bool:
    """Whether `value` is an evaluation report (`evaluation.evaluation_report`, vaswani-evaluate's JSON): a dict with
    at least one of the scores `REPORT_SCORES`."""
    return isinstance(value, Mapping) and any(value.get(k) is not None for k in REPORT_SCORES)


def as_reports(eval_results) -> list[dict]:
    """Evaluation reports (`vaswani_transformer.evaluation.evaluation_report` dicts) from dicts or JSON paths."""
    if eval_results is None:
        return []
    if isinstance(eval_results, (str, os.PathLike, Mapping)):
        eval_results = [eval_results]
    reports = []
    for item in eval_results:
        report = read_json(Path(item)) if isinstance(item, (str, os.PathLike)) else dict(item)
        where = item if isinstance(item, (str, os.PathLike)) else "an evaluation result"
        if not is_evaluation_report(report):
            raise ValueError(f"{where}: no 'sacrebleu', 'tokenized_bleu' or 'chrf' score (an evaluation report is "
                             "written by vaswani-evaluate).")
        reports.append(report)
    return reports


def _dataset_of(report: dict) -> dict[str, str | None]:
    dataset = report.get("dataset")
    if isinstance(dataset, Mapping):
        name = dataset.get("name") or dataset.get("type")
        return {"type": dataset.get("type") or name, "name": name, "split": dataset.get("split")}
    if isinstance(dataset, str):
        return {"type": dataset, "name": dataset, "split": report.get("split")}
    source = report.get("source_file")
    name = Path(source).name if source else "test set"
    return {"type": Path(source).stem if source else "custom", "name": name, "split": report.get("split") or "test"}


_METRICS = (  # report key, signature key, model-index type, display name
    ("sacrebleu", "sacrebleu_signature", "bleu", "sacreBLEU"),
    ("tokenized_bleu", "tokenized_bleu_signature", "bleu", "tokenized BLEU"),
    ("chrf", "chrf_signature", "chrf", "chrF"),
)


def eval_results_for_card(reports: Sequence[dict], source_lang: str | None, target_lang: str | None):
    """(model-index `EvalResult`s, rows for the card's table, decoding text) from evaluation reports."""
    task_name = f"Translation {source_lang}-{target_lang}" if source_lang and target_lang else "Translation"
    results, rows, decodings = [], [], []  # decodings: (test set, its decoding's text or None) per report
    for report in reports:
        dataset = _dataset_of(report)
        for key, signature_key, metric_type, metric_name in _METRICS:
            value = report.get(key)
            if value is None:
                continue
            signature = report.get(signature_key)
            results.append(EvalResult(
                task_type="translation", task_name=task_name, dataset_type=dataset["type"],
                dataset_name=dataset["name"], dataset_split=dataset["split"], metric_type=metric_type,
                metric_name=metric_name, metric_value=round(float(value), 2), metric_config=signature,
                verified=False,
            ))  # fmt: skip
            rows.append(
                {"dataset": dataset["name"], "metric": metric_name, "value": float(value), "signature": signature}
            )
        decoding = report.get("decoding") or {}
        fields = decoding.get("generation_config", decoding) if isinstance(decoding, Mapping) else {}
        shown = {k: fields[k] for k in PAPER_GENERATION_DEFAULTS if k != "early_stopping" and k in fields}
        if isinstance(decoding, Mapping):
            # what the evaluation passed (translate_lines' arguments, --decoding); None keeps the model's config
            passed = {k: v for k, v in decoding.items() if k in PAPER_GENERATION_DEFAULTS and v is not None}
            shown.update({k: v for k, v in passed.items() if k != "early_stopping"})
        decodings.append((dataset["name"], ", ".join(f"{k}={_format_value(v)}" for k, v in shown.items()) or None))
    texts = list(dict.fromkeys(text for _, text in decodings))
    if texts in ([], [None]):
        decoding_text = None
    elif len(texts) == 1:
        decoding_text = texts[0]
    else:  # each test set with its own (a report of hypotheses scored as given records none)
        decoding_text = "; ".join(f"{name}: {text or 'not recorded'}" for name, text in dict.fromkeys(decodings))
    return results, rows, decoding_text


# --------------------------------------------------------------------------------------------- pictures


def _first_source_line(reports: Sequence[dict], training_run: Path | None) -> str | None:
    """The first test source sentence the card knows: an evaluation report's `first_source_line`, else the first
    example of the run's `training_summary.json` (its test set's first pair). A report's `source_file` is never
    opened: a report from elsewhere could name any file (/proc/self/environ), and the card is published."""
    for report in reports:
        line = report.get("first_source_line")
        if isinstance(line, str) and line.strip():
            return line.strip()
    summary = training_run / "training_summary.json" if training_run is not None else None
    if summary is not None and summary.is_file():
        examples = read_json(summary).get("examples") or []
        if examples and isinstance(examples[0], Mapping) and str(examples[0].get("source") or "").strip():
            return str(examples[0]["source"]).strip()
    return None


def write_learning_curve_picture(folder: PathLike, training_run: PathLike) -> str | None:
    """`learning_curve.png` in `folder` from `training_run`'s `trainer_state.json` (`plots.plot_learning_curve`);
    None when the run logged no training loss or matplotlib is missing (logged)."""
    from .plots import plot_learning_curve  # plots imports the trainer, which imports this module

    try:
        plot_learning_curve(training_run, Path(folder) / LEARNING_CURVE_FILE, title=Path(training_run).resolve().name)
    except (FileNotFoundError, ValueError) as error:  # no trainer state, or nothing logged in it
        logger.info("The model card shows no learning curve: %s", error)
        return None
    except ImportError as error:
        logger.warning("The model card shows no learning curve: %s (pip install matplotlib).", error)
        return None
    return LEARNING_CURVE_FILE


def write_attention_picture(folder: PathLike, source: str) -> str | None:
    """`attention.png` in `folder`: the cross-attention of the saved model (and tokenizer) in `folder` translating
    `source` (`vaswani_transformer.attention.write_card_attention_picture`); None, logged, when it cannot be drawn
    here (matplotlib missing, no tokenizer in the folder)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / "tokenizer_config.json").is_file():
        logger.warning("The model card shows no attention picture: %s has no tokenizer.", folder)
        return None
    from .attention import write_card_attention_picture

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    try:
        write_card_attention_picture(model, tokenizer, source, folder / ATTENTION_PICTURE_FILE)
    except ImportError as error:  # matplotlib is not installed (the plots extra)
        logger.warning("The model card shows no attention picture: %s (pip install matplotlib).", error)
        return None
    return ATTENTION_PICTURE_FILE


def write_card_pictures(
    folder: PathLike,
    *,
    training_run: PathLike | None = None,
    attention_source: str | None = None,
    eval_results=None,
    example: str | None = None,
) -> dict[str, str]:
    """The pictures the card of the model in `folder` shows, written into `folder`: ``{"learning_curve":
    "learning_curve.png", "attention": "attention.png"}`` (paths relative to `folder`; a picture that cannot be
    drawn is left out, with a logged reason).

    `training_run`: the run whose `trainer_state.json` gives the learning curve (default: `folder` itself, a
    training output folder). `attention_source`: the sentence of the attention picture (default: the first test
    source line the card knows: an evaluation report's `first_source_line`, the run's first test example; else
    `example`, the card's usage sentence)."""
    folder = Path(folder)
    run = Path(training_run) if training_run is not None else folder
    pictures = {}
    if (run / "trainer_state.json").is_file():
        curve = write_learning_curve_picture(folder, run)
        if curve:
            pictures["learning_curve"] = curve
    test_line = None if attention_source else _first_source_line(as_reports(eval_results), run)
    sentence = attention_source or test_line or example or EXAMPLE_SENTENCE
    attention = write_attention_picture(folder, sentence)
    if attention:
        pictures.update(attention=attention, attention_source=sentence,
                        attention_source_kind="the first test sentence" if test_line else "a sentence")  # fmt: skip
    return pictures


# ----------------------------------------------------------------------------------------------- the card


def _language_name(code: str | None) -> str:
    names = {"en": "English", "de": "German", "fr": "French", "cs": "Czech", "ro": "Romanian", "ru": "Russian",
             "es": "Spanish", "it": "Italian", "nl": "Dutch", "zh": "Chinese", "ja": "Japanese"}  # fmt: skip
    if not code:
        return "?"
    return f"{names[code]} ({code})" if code in names else code


def render_model_card(
    folder: PathLike,
    *,
    training_info: Mapping[str, Any] | None = None,
    eval_results=None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    license: str = "apache-2.0",
    datasets: Sequence[str] | str | None = None,
    model_name: str | None = None,
    repo_id: str | None = None,
    tags: Sequence[str] | None = None,
    example: str | None = None,
    template_path: PathLike | None = None,
    pictures: bool = True,
    training_run: PathLike | None = None,
    attention_source: str | None = None,
) -> ModelCard:
    """The model card of the saved model in `folder` (reads its config, generation config and weights).

    With `pictures` (default) it first writes the learning curve of `training_run` (default: `folder`) and an
    attention picture into `folder` and embeds them (`write_card_pictures`)."""
    folder = Path(folder)
    config = VaswaniTransformerConfig.from_pretrained(folder)
    reports = as_reports(eval_results)
    for report in reports:  # languages recorded by the evaluation when not given
        source_lang = source_lang or report.get("source_lang") or None
        target_lang = target_lang or report.get("target_lang") or None
    generation = read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
    results, rows, decoding_text = eval_results_for_card(reports, source_lang, target_lang)
    datasets = [datasets] if isinstance(datasets, str) else list(datasets or [])
    preset = detect_preset(config)
    parameters = count_parameters(folder)
    name = model_name or (repo_id.split("/")[-1] if repo_id else None) or (
        f"transformer-{preset}-{source_lang}-{target_lang}" if source_lang and target_lang else f"transformer-{preset}"
    )
    card_data = ModelCardData(
        language=[lang for lang in (source_lang, target_lang) if lang] or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=list(dict.fromkeys(["translation", "vaswani_transformer", "transformer", "custom_code", *(tags or [])])),
        datasets=datasets or None,
        metrics=sorted({r.metric_type for r in results}) or None,
        model_name=name,
        eval_results=results or None,
    )
    training = dict(training_info or {})
    training.setdefault("preset", preset)
    training.setdefault("dropout", config.dropout)
    training_rows = [(label, _format_value(training[key])) for key, label in TRAINING_FIELDS.items() if key in training]
    training_rows += [(key, _format_value(v)) for key, v in training.items() if key not in TRAINING_FIELDS]
    generation_rows = [(k, _format_value(generation[k])) for k in PAPER_GENERATION_DEFAULTS if k in generation]
    preset_note = {"base": "the paper's base model", "big": "the paper's big model"}.get(
        preset, "Table 3 variant" if preset != "custom" else "not a paper preset"
    )
    template = Path(template_path) if template_path is not None else DEFAULT_TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(
            f"Model card template {template} not found; reinstall vaswani-transformer (its package data includes "
            "model_cards/*.md) or pass template_path=..."
        )
    shown = {}
    if pictures:
        shown = write_card_pictures(folder, training_run=training_run, attention_source=attention_source,
                                    eval_results=reports, example=example)  # fmt: skip
    return ModelCard.from_template(
        card_data,
        template_path=str(template),
        model_name=name,
        repo_id=repo_id or name,
        source_language=_language_name(source_lang),
        target_language=_language_name(target_lang),
        source_language_code=source_lang or "src",
        target_language_code=target_lang or "tgt",
        preset=preset,
        preset_note=preset_note,
        config=config,
        parameters=parameters,
        parameters_text=f"{parameters:,} ({parameters / 1e6:.1f}M)",
        license=license,
        datasets=datasets,
        results=rows,
        results_decoding=decoding_text,
        training=training_rows,
        generation=generation_rows,
        example=(example or EXAMPLE_SENTENCE).replace('"', '\\"'),
        learning_curve=shown.get("learning_curve"),
        attention_picture=shown.get("attention"),
        attention_source=shown.get("attention_source"),
        attention_source_kind=shown.get("attention_source_kind"),
    )


def trainer_metric_reports(output_dir: PathLike, trainer=None) -> list[dict]:
    """Evaluation reports from a Trainer run's own metrics: `test_results.json` / `eval_results.json` (written by
    `trainer.save_metrics`), else the last `test_bleu` / `eval_bleu` entry of `trainer.state.log_history`. The keys
    are those of `evaluation.make_compute_metrics` (`<prefix>_bleu` = sacreBLEU, `_chrf`, `_tokenized_bleu`); the
    signatures are not recorded there, so the card shows none. Such a file that holds a vaswani-evaluate report
    instead (its `--output_json` example once named `eval_results.json`) is taken as that report."""
    reports = []
    history = list(getattr(getattr(trainer, "state", None), "log_history", None) or [])
    for prefix, split in (("test", "test"), ("eval", "validation")):
        path = Path(output_dir) / f"{prefix}_results.json"
        metrics = read_json(path) if path.is_file() else next(
            (entry for entry in reversed(history) if entry.get(f"{prefix}_bleu") is not None), {}
        )
        if metrics.get(f"{prefix}_bleu") is None:
            if is_evaluation_report(metrics):
                reports.append(metrics)
            continue
        reports.append({
            "sacrebleu": metrics[f"{prefix}_bleu"],
            "chrf": metrics.get(f"{prefix}_chrf"),
            "tokenized_bleu": metrics.get(f"{prefix}_tokenized_bleu"),
            "dataset": {"name": f"{split} split", "type": "custom", "split": split},
        })  # fmt: skip
    return reports


__all__ = [
    "ATTENTION_PICTURE_FILE",
    "DEFAULT_TEMPLATE",
    "EXAMPLE_SENTENCE",
    "LEARNING_CURVE_FILE",
    "TRAINING_FIELDS",
    "as_reports",
    "count_parameters",
    "detect_preset",
    "eval_results_for_card",
    "is_evaluation_report",
    "read_json",
    "render_model_card",
    "trainer_metric_reports",
    "training_info_from_run",
    "training_info_from_trainer",
    "training_info_of_model",
    "write_attention_picture",
    "write_card_pictures",
    "write_learning_curve_picture",
]
