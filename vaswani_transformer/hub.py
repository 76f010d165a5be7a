"""Hub repositories for our models: export folder, model card, validation in a clean Python, upload.

A repository built here holds everything `pipeline("translation", model=repo, trust_remote_code=True)` needs where
only transformers is installed:

- `model.safetensors` and `config.json` with `auto_map` (written by `save_pretrained`, which also copies the code
  files `configuration_vaswani_transformer.py`, `modeling_vaswani_transformer.py`, `generation.py`);
- `pipeline.py` (`vaswani_transformer/pipeline.py`) and `custom_pipelines` in `config.json`, for the tasks
  "translation" and "translation_XX_to_YY";
- the tokenizer files;
- `generation_config.json` with the paper's decoding (beam 4, GNMT length penalty alpha 0.6, `max_len_a=1`,
  `max_len_b=50`: source length + 50);
- `README.md`, the model card rendered from `vaswani_transformer/model_cards/vaswani_transformer.md` (package data)
  with huggingface_hub's `ModelCard`.

Functions:

- `export_repository(model, output_dir, ...)`: the whole folder from a model (object or saved folder).
- `write_repository_extras(folder, training_info=None, eval_results=None, ...)`: adds card, pipeline code,
  `custom_pipelines` and generation config to a folder `save_pretrained` wrote (what `Seq2SeqTrainer(push_to_hub=True)`
  runs call through `write_model_card(folder, trainer=...)`).
- `validate_repository(folder)`: loads the folder in a fresh Python where `vaswani_transformer` cannot be imported,
  with `trust_remote_code=True`, and checks that the pipeline translates a sentence exactly like `generate` + decode.
- `push_repository(folder, repo_id, ...)`: validates, then creates the repo and uploads the folder; refuses to upload
  a folder that fails validation. The token comes from the usual login or environment and is never printed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .generation import PAPER_GENERATION_DEFAULTS


logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
PACKAGE_DIR = Path(__file__).resolve().parent
PIPELINE_SOURCE = PACKAGE_DIR / "pipeline.py"
PIPELINE_FILE = "pipeline.py"
PIPELINE_CLASS = "TranslationPipeline"
CODE_FILES = ("configuration_vaswani_transformer.py", "modeling_vaswani_transformer.py", "generation.py")
# The card template ships inside the package (package data), so installed wheels have it; or pass `template_path`.
TEMPLATE_NAME = "vaswani_transformer.md"
DEFAULT_TEMPLATE = PACKAGE_DIR / "model_cards" / TEMPLATE_NAME
DEFAULT_VALIDATION_SENTENCE = "A man is riding a bicycle down the street."

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
    "learning_rate": "learning rate",
    "warmup_steps": "warmup steps",
    "label_smoothing_factor": "label smoothing",
    "weight_decay": "weight decay",
    "max_grad_norm": "gradient clipping",
    "dropout": "dropout (P_drop)",
    "average_last_checkpoints": "checkpoints averaged",
    "source_tokens_seen": "source tokens seen",
    "target_tokens_seen": "target tokens seen",
    "wall_time_seconds": "wall time (s)",
    "bf16": "bf16",
    "fp16": "fp16",
    "seed": "seed",
}


class RepositoryValidationError(RuntimeError):
    """The folder does not load or translate in a clean Python with only transformers (see `validate_repository`)."""


# ------------------------------------------------------------------------------------------------- helpers


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.") from None
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON ({error}).") from None


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def custom_pipelines_entry(source_lang: str | None = None, target_lang: str | None = None) -> dict[str, dict]:
    """The `custom_pipelines` value of `config.json`: "translation" (and "translation_XX_to_YY" for a known pair)."""
    entry = {"impl": f"{Path(PIPELINE_FILE).stem}.{PIPELINE_CLASS}", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    tasks = {"translation": dict(entry)}
    if source_lang and target_lang:
        tasks[f"translation_{source_lang}_to_{target_lang}"] = dict(entry)
    return tasks


def count_parameters(folder: PathLike) -> int:
    """Number of parameters stored in the folder's safetensors files (tied matrices are stored, and counted, once)."""
    from safetensors import safe_open

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
    """The first paper preset (`base`, `big`, Table 3 rows) whose architecture equals `config`'s, else "custom"."""
    from .configuration_vaswani_transformer import PRESETS, VaswaniTransformerConfig

    for name in PRESETS:
        preset = VaswaniTransformerConfig.from_preset(name)
        if all(getattr(preset, f) == getattr(config, f) for f in _ARCHITECTURE_FIELDS):
            return name
    return "custom"


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --------------------------------------------------------------------------------------- training / results


def training_info_from_run(run_dir: PathLike) -> dict[str, Any]:
    """What a training run recorded: `training_summary.json` (updates, tokens seen, wall time, processes) and
    `trainer_state.json` (global step), plus `training_args.json` (any recipe fields) when present. Missing files
    are skipped; an empty dict means nothing was recorded."""
    run_dir = Path(run_dir)
    info: dict[str, Any] = {}
    args_file = run_dir / "training_args.json"
    if args_file.is_file():
        info.update({k: v for k, v in _read_json(args_file).items() if k in TRAINING_FIELDS})
    state_file = run_dir / "trainer_state.json"
    if state_file.is_file():
        state = _read_json(state_file)
        if state.get("global_step"):
            info["updates"] = state["global_step"]
    summary_file = run_dir / "training_summary.json"
    if summary_file.is_file():
        summary = _read_json(summary_file).get("summary") or {}
        info.update({k: v for k, v in summary.items() if k in TRAINING_FIELDS and v is not None})
    return info


def training_info_from_trainer(trainer) -> dict[str, Any]:
    """The recipe of a `Seq2SeqTrainer` run: its arguments (optimizer, schedule, smoothing, steps, precision) and
    state, plus `max_tokens_per_batch` when the trainer batches by tokens. Collective-free (rank 0 calls it)."""
    args = trainer.args.to_dict()
    info = {k: args[k] for k in TRAINING_FIELDS if k in args and args[k] not in (None, "")}
    if info.get("max_steps", 0) and info["max_steps"] > 0:
        info.pop("num_train_epochs", None)
    elif "max_steps" in info:
        info.pop("max_steps")
    if info.get("lr_schedule") == "paper":
        info.pop("learning_rate", None)  # ignored by the paper schedule
    info["optimizer"] = str(args.get("optim", "adamw_torch"))
    if getattr(trainer, "max_tokens_per_batch", None):
        info["max_tokens_per_batch"] = trainer.max_tokens_per_batch
    info["num_processes"] = trainer.args.world_size
    if trainer.state is not None and trainer.state.global_step:
        info["updates"] = trainer.state.global_step
    return info


def _as_reports(eval_results) -> list[dict]:
    """Evaluation reports (`vaswani_transformer.evaluation.evaluation_report` dicts) from dicts or JSON paths."""
    if eval_results is None:
        return []
    if isinstance(eval_results, (str, os.PathLike, Mapping)):
        eval_results = [eval_results]
    reports = []
    for item in eval_results:
        report = _read_json(Path(item)) if isinstance(item, (str, os.PathLike)) else dict(item)
        where = item if isinstance(item, (str, os.PathLike)) else "an evaluation result"
        if not any(report.get(k) is not None for k in ("sacrebleu", "tokenized_bleu", "chrf")):
            raise ValueError(f"{where}: no 'sacrebleu', 'tokenized_bleu' or 'chrf' score (an evaluation report is "
                             "written by scripts/evaluate.py).")
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
    results, rows, decodings = [], [], []
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
            explicit = ("num_beams", "length_penalty", "max_len_a", "max_len_b")
            shown.update({k: decoding[k] for k in explicit if k in decoding})
        if shown:
            decodings.append(", ".join(f"{k}={_format_value(v)}" for k, v in shown.items()))
    decoding_text = "; ".join(dict.fromkeys(decodings)) if decodings else None
    return results, rows, decoding_text


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
) -> ModelCard:
    """The model card of the saved model in `folder` (reads its config, generation config and weights)."""
    from .configuration_vaswani_transformer import VaswaniTransformerConfig

    folder = Path(folder)
    config = VaswaniTransformerConfig.from_pretrained(folder)
    reports = _as_reports(eval_results)
    for report in reports:  # languages recorded by the evaluation when not given
        source_lang = source_lang or report.get("source_lang") or None
        target_lang = target_lang or report.get("target_lang") or None
    generation = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
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
        example=(example or DEFAULT_VALIDATION_SENTENCE).replace('"', '\\"'),
    )


# ------------------------------------------------------------------------------------------ the repository


def write_repository_extras(
    folder: PathLike,
    training_info: Mapping[str, Any] | None = None,
    eval_results=None,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    license: str = "apache-2.0",
    datasets: Sequence[str] | str | None = None,
    model_name: str | None = None,
    repo_id: str | None = None,
    tags: Sequence[str] | None = None,
    template_path: PathLike | None = None,
) -> ModelCard:
    """Complete a folder written by `model.save_pretrained` (+ tokenizer) into a Hub repository; returns the card.

    Adds `pipeline.py` and `custom_pipelines` in `config.json` (tasks "translation" and, when the pair is known,
    "translation_XX_to_YY"); writes `generation_config.json` with the paper's decoding if the folder has none (an
    existing one is kept, only missing paper fields are added); renders `README.md` (see `render_model_card`).
    `training_info`: a dict of recipe fields (`training_info_from_run`/`training_info_from_trainer`);
    `eval_results`: evaluation reports (dicts or paths of the JSON `scripts/evaluate.py` writes).
    Raises FileNotFoundError naming what the folder lacks (config, weights, the code files of `save_pretrained`).
    """
    from .generation import VaswaniGenerationConfig
    from .configuration_vaswani_transformer import VaswaniTransformerConfig

    folder = Path(folder)
    config_path = folder / "config.json"
    config_dict = _read_json(config_path)
    missing = [name for name in CODE_FILES if not (folder / name).is_file()]
    if not config_dict.get("auto_map"):
        missing.append("the 'auto_map' entry of config.json")
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: save the model with `vaswani_transformer` imported (it registers "
            "the classes for remote code) or use export_repository."
        )
    reports = _as_reports(eval_results)
    if not (source_lang and target_lang):
        from .pipeline import model_language_pair

        recorded = model_language_pair(SimpleNamespace(custom_pipelines=config_dict.get("custom_pipelines")))
        for pair in ([recorded] if recorded else []) + [(r.get("source_lang"), r.get("target_lang")) for r in reports]:
            source_lang, target_lang = source_lang or pair[0] or None, target_lang or pair[1] or None

    shutil.copyfile(PIPELINE_SOURCE, folder / PIPELINE_FILE)
    config_dict["custom_pipelines"] = custom_pipelines_entry(source_lang, target_lang)
    _write_json(config_path, config_dict)

    generation_path = folder / "generation_config.json"
    if generation_path.is_file():
        generation = _read_json(generation_path)
        added = {k: v for k, v in PAPER_GENERATION_DEFAULTS.items() if k not in generation}
        if added:
            generation.update(added)
            generation["_from_model_config"] = False
            _write_json(generation_path, generation)
    else:
        model_config = VaswaniTransformerConfig.from_pretrained(folder)
        VaswaniGenerationConfig.from_model_config(model_config).save_pretrained(folder)

    card = render_model_card(
        folder, training_info=training_info, eval_results=reports, source_lang=source_lang, target_lang=target_lang,
        license=license, datasets=datasets, model_name=model_name, repo_id=repo_id, tags=tags,
        template_path=template_path,
    )
    card.save(folder / "README.md")
    return card


def trainer_metric_reports(output_dir: PathLike, trainer=None) -> list[dict]:
    """Evaluation reports from a Trainer run's own metrics: `test_results.json` / `eval_results.json` (written by
    `trainer.save_metrics`), else the last `test_bleu` / `eval_bleu` entry of `trainer.state.log_history`. The keys
    are those of `evaluation.make_compute_metrics` (`<prefix>_bleu` = sacreBLEU, `_chrf`, `_tokenized_bleu`); the
    signatures are not recorded there, so the card shows none."""
    reports = []
    history = list(getattr(getattr(trainer, "state", None), "log_history", None) or [])
    for prefix, split in (("test", "test"), ("eval", "validation")):
        path = Path(output_dir) / f"{prefix}_results.json"
        metrics = _read_json(path) if path.is_file() else next(
            (entry for entry in reversed(history) if entry.get(f"{prefix}_bleu") is not None), {}
        )
        if metrics.get(f"{prefix}_bleu") is None:
            continue
        reports.append({
            "sacrebleu": metrics[f"{prefix}_bleu"],
            "chrf": metrics.get(f"{prefix}_chrf"),
            "tokenized_bleu": metrics.get(f"{prefix}_tokenized_bleu"),
            "dataset": {"name": f"{split} split", "type": "custom", "split": split},
        })  # fmt: skip
    return reports


def write_model_card(output_dir: PathLike, trainer=None, **kwargs) -> ModelCard | None:
    """`Seq2SeqTrainer.create_model_card` for our runs: `write_repository_extras` on the trainer's output folder.

    Reads the recipe from `trainer` (`training_info_from_trainer`) and the run folder; evaluation reports from
    `eval_results=` (evaluation JSONs of scripts/evaluate.py, or dicts) or else the run's own metrics
    (`trainer_metric_reports`). Accepts `create_model_card`'s keywords: `language` (a
    [source, target] pair), `license`, `tags`, `model_name`, `dataset`/`dataset_tags`; also `source_lang`,
    `target_lang`. Does nothing on processes other than the main one (like the Trainer's own card).
    """
    if trainer is not None and not trainer.is_world_process_zero():
        return None
    output_dir = Path(output_dir)
    training_info = training_info_from_run(output_dir)
    if trainer is not None:
        training_info.update(training_info_from_trainer(trainer))
    language = kwargs.pop("language", None)
    source_lang, target_lang = kwargs.pop("source_lang", None), kwargs.pop("target_lang", None)
    if isinstance(language, (list, tuple)) and len(language) == 2:
        source_lang, target_lang = source_lang or language[0], target_lang or language[1]
    datasets = kwargs.pop("dataset", None) or kwargs.pop("dataset_tags", None)
    eval_results = kwargs.pop("eval_results", None)
    if eval_results is None:
        eval_results = trainer_metric_reports(output_dir, trainer)
    options = {k: kwargs[k] for k in ("license", "tags", "model_name", "repo_id") if kwargs.get(k) is not None}
    if isinstance(options.get("tags"), str):
        options["tags"] = [options["tags"]]
    if trainer is not None and "repo_id" not in options and getattr(trainer.args, "hub_model_id", None):
        options["repo_id"] = trainer.args.hub_model_id
    return write_repository_extras(
        output_dir, training_info, eval_results, source_lang=source_lang, target_lang=target_lang,
        datasets=datasets, **options,
    )


def export_repository(
    model,
    output_dir: PathLike,
    *,
    tokenizer=None,
    training_info: Mapping[str, Any] | None = None,
    eval_results=None,
    overwrite: bool = False,
    **card_options,
) -> Path:
    """Write the complete repository folder for `model` (a model object, or a saved model folder with its tokenizer)
    to `output_dir`: weights (safetensors), config with `auto_map` and `custom_pipelines`, code files, tokenizer,
    generation config, model card. `card_options` go to `write_repository_extras` (source_lang, target_lang, license,
    datasets, model_name, repo_id, tags, template_path). A non-empty `output_dir` is refused unless `overwrite`."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from .inference import check_model_folder

    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{output_dir} is not empty; choose a new folder or overwrite it (overwrite=True, --overwrite)."
            )
        shutil.rmtree(output_dir)
    if isinstance(model, (str, os.PathLike)):
        source = Path(model)
        if source.is_dir():
            check_model_folder(source)
            if training_info is None:
                training_info = training_info_from_run(source) or training_info_from_run(source.parent) or None
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model)
        model = AutoModelForSeq2SeqLM.from_pretrained(model)
    elif tokenizer is None:
        raise ValueError("Pass `tokenizer` when `model` is a model object.")
    if getattr(model.config, "model_type", None) != "vaswani_transformer":
        raise ValueError(f"export_repository exports vaswani_transformer models; got {model.config.model_type!r}.")
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    write_repository_extras(output_dir, training_info, eval_results, **card_options)
    return output_dir


# -------------------------------------------------------------------------------------- validation and push

# Prepended to code run in a fresh interpreter (cwd: an empty temporary folder, no PYTHONPATH): a meta-path finder
# makes `vaswani_transformer` unimportable even when it is pip-installed (editable or not), so only the files in a
# model folder (trust_remote_code) can provide the model. `validate_repository` and the tests use it.
HIDE_PACKAGE_CODE = textwrap.dedent(
    """
    import sys

    class _HidePackage:
        def find_spec(self, name, path=None, target=None):
            if name == "vaswani_transformer" or name.startswith("vaswani_transformer."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden: only remote code may load the model)")

    sys.meta_path.insert(0, _HidePackage())
    sys.path = [p for p in sys.path if p not in ("", ".")]
    try:
        import vaswani_transformer
    except ImportError:
        pass
    else:
        raise SystemExit("vaswani_transformer is importable: the check would prove nothing")
    """
)

# Run by `validate_repository`: load the folder with trust_remote_code and translate a sentence two ways.
_VALIDATION_CODE = HIDE_PACKAGE_CODE + textwrap.dedent(
    """
    import json

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    torch.set_num_threads(1)  # one sentence: threads only contend on a busy machine

    folder, sentence, _RESULT_PREFIX = sys.argv[1], sys.argv[2], sys.argv[3]
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        expected = tokenizer.batch_decode(
            model.generate(**tokenizer([sentence], return_tensors="pt")), skip_special_tokens=True
        )[0]
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    got = translator(sentence)[0]["translation_text"]
    if got != expected:
        raise SystemExit(f"pipeline gave {got!r} but generate + decode gave {expected!r}")
    generation = model.generation_config
    print()
    print(_RESULT_PREFIX + json.dumps({
        "translation": got,
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "pipeline_class": f"{type(translator).__module__}.{type(translator).__name__}",
        "num_beams": generation.num_beams,
        "length_penalty": generation.length_penalty,
        "length_penalty_type": getattr(generation, "length_penalty_type", None),
    }))
    """
)


_RESULT_PREFIX = "VASWANI_VALIDATION_RESULT "


def validate_repository(folder: PathLike, sentence: str = DEFAULT_VALIDATION_SENTENCE, timeout: float = 600) -> dict:
    """Load `folder` in a fresh Python where `vaswani_transformer` cannot be imported (`trust_remote_code=True`,
    offline) and translate `sentence` through `pipeline("translation")` and `generate`; they must agree.

    Returns what the subprocess reports (translation, model and pipeline classes, decoding settings); raises
    RepositoryValidationError with the subprocess's error output otherwise."""
    folder = Path(folder).resolve()
    if not (folder / "config.json").is_file():
        raise RepositoryValidationError(f"{folder} has no config.json.")
    with tempfile.TemporaryDirectory(prefix="vaswani-validate-") as scratch:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=os.path.join(scratch, "modules"))
        try:
            result = subprocess.run(
                [sys.executable, "-c", _VALIDATION_CODE, str(folder), sentence, _RESULT_PREFIX],
                cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise RepositoryValidationError(f"Validating {folder} took more than {timeout} s.") from None
    if result.returncode != 0:
        raise RepositoryValidationError(
            f"{folder} does not translate in a Python without vaswani_transformer (trust_remote_code=True):\n"
            + (result.stderr.strip()[-4000:] or result.stdout.strip()[-4000:])
        )
    reports = [line for line in result.stdout.splitlines() if line.startswith(_RESULT_PREFIX)]
    if not reports:
        raise RepositoryValidationError(f"Validating {folder} printed no result:\n{result.stdout[-4000:]}")
    return json.loads(reports[-1][len(_RESULT_PREFIX) :])


def push_repository(
    folder: PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload Transformer (Vaswani et al., 2017) translation model",
    token: str | bool | None = None,
    validation_sentence: str = DEFAULT_VALIDATION_SENTENCE,
    api=None,
) -> str:
    """Validate `folder` (`validate_repository`; nothing is uploaded if that fails), create `repo_id` if needed
    (`private`), create the branch `revision` if needed, and upload the folder in one commit. Returns the commit URL.

    `token`: None uses the usual login (`hf auth login`) or `HF_TOKEN`; it is never printed or logged.
    `api`: a `huggingface_hub.HfApi` (default: a new one)."""
    from huggingface_hub import HfApi

    report = validate_repository(folder, validation_sentence)
    logger.info("Validated %s in a clean Python: %r -> %r", folder, validation_sentence, report["translation"])
    api = api if api is not None else HfApi()
    repo_url = api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
    repo_id = getattr(repo_url, "repo_id", None) or repo_id
    if revision is not None:
        api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), repo_type="model", revision=revision, token=token,
        commit_message=commit_message,
    )
    return str(getattr(commit, "commit_url", commit))


__all__ = [
    "RepositoryValidationError",
    "count_parameters",
    "custom_pipelines_entry",
    "detect_preset",
    "eval_results_for_card",
    "export_repository",
    "push_repository",
    "trainer_metric_reports",
    "render_model_card",
    "training_info_from_run",
    "training_info_from_trainer",
    "validate_repository",
    "write_model_card",
    "write_repository_extras",
]
