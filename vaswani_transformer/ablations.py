"""Table 3 at small scale: train chosen rows of the paper's Table 3 (the presets) scaled down, each for the same
budget and seed, and report dev perplexity and BLEU in the paper's layout (``scripts/ablations.py``).

A small-scale echo of the paper, not a reproduction: the paper trained each row for 100k updates of ~25k tokens on
WMT14 and scored newstest2013; here each row trains for a budget of your choice on the data of any recipe.

Scaling rule (:func:`scaled_row`): d_model, d_ff, d_k and d_v are divided by ``scale_factor`` (exactly: the factor
must divide each of them); N, h, P_drop, eps_ls and the positional encoding stay as the row sets them. Each row so
differs from the scaled base as it differs from the paper's base: in the same ratios for sizes, identically for
the rest. The recipe's other values (data, batch size, schedule, vocabulary, model fields Table 3 does not name)
apply to every row; its ``config_overrides`` of Table 3 fields are replaced by the row's.

Each row is a real training job (``vaswani_transformer.train.main`` in a child process: rows share no state) in
``output_dir/<row>/``, from the row's full recipe written there (``recipe.yaml``: ``vaswani-train`` reruns it). All
rows share one vocabulary (``output_dir/tokenizer``, trained once), so their perplexities compare. No checkpoint
averaging (Table 3 used none) and no validation decode in training: the recipe's ``length_penalty_grid``,
``eval_on_start`` and ``generation_config`` are dropped, so rows keep the paper's decoding (no alpha tuned on the dev
set the table reports). After training the runner scores the final weights on the recipe's validation set:

- dev perplexity: exp of the mean negative log-likelihood per target token (``</s>`` included), without label
  smoothing, dropout off (:func:`dev_perplexity`). The Trainer's ``eval_loss`` is not used: it is label-smoothed
  (the same mean over target tokens otherwise);
- dev BLEU: the paper's tokenized BLEU (``evaluation.compute_translation_metrics``) and sacreBLEU of the model's
  translations, decoded as the model's generation config says (the paper's beam 4, alpha 0.6; ``num_beams=1``
  for greedy).

Resumable: a row is done when its folder holds ``ablation_result.json`` (written last, atomically); such a row is
read, not re-run. An output folder holds one set of settings (recipe, scale, budget, seed, decoding; in
``ablation_settings.json``): a later run with other settings is an error naming them (other rows are fine). A row whose
training finished (``training_summary.json``) is only scored; an interrupted one resumes from its latest complete
checkpoint.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from . import cli
from .configuration_vaswani_transformer import (
    PRESETS,
    VaswaniTransformerConfig,
    available_presets,
    preset_training_arguments,
)

RESULT_NAME = "ablation_result.json"
SETTINGS_NAME = "ablation_settings.json"  # output_dir's settings: a later run must use the same
ROW_RECIPE_NAME = "recipe.yaml"
ROW_LOG_NAME = "train.log"
TABLE_STEM = "table3"  # output_dir/table3.{md,csv,png}
SCALED_FIELDS = ("d_model", "d_ff", "d_k", "d_v")  # divided by the scale factor; the others stay as the row says
# The config fields a Table 3 row sets (N is both stacks); a recipe's config_overrides of these are replaced.
TABLE3_CONFIG_FIELDS = ("encoder_layers", "decoder_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v", "dropout",
                        "position_encoding")  # fmt: skip
# The paper's columns, in its order: (column, key in a row's values).
COLUMNS = (("N", "N"), ("d_model", "d_model"), ("d_ff", "d_ff"), ("h", "h"), ("d_k", "d_k"), ("d_v", "d_v"),
           ("P_drop", "P_drop"), ("eps_ls", "eps_ls"), ("positional", "positional"))  # fmt: skip
_TRAIN_CODE = "import sys; from vaswani_transformer.train import main; main(sys.argv[1:])"


# ------------------------------------------------------------------------------------------------------ rows


def check_rows(rows: Sequence[str]) -> list[str]:
    """The rows, validated: each a preset name (``available_presets()``), none twice."""
    if not rows:
        raise ValueError(f"No rows given. Valid rows: {', '.join(available_presets())}.")
    for row in rows:
        if row not in PRESETS:
            hint = cli.did_you_mean(row, PRESETS, quote=True)
            raise ValueError(f"Unknown Table 3 row {row!r}{f' ({hint})' if hint else ''}. "
                             f"Valid rows: {', '.join(available_presets())}.")  # fmt: skip
    repeated = sorted({row for row in rows if list(rows).count(row) > 1})
    if repeated:
        raise ValueError(f"Row(s) given more than once: {', '.join(repeated)}.")
    return list(rows)


def scaled_row(row: str, scale_factor: float = 1) -> dict[str, Any]:
    """The model fields and label smoothing of Table 3 row ``row`` (a preset) with d_model, d_ff, d_k and d_v divided
    by ``scale_factor``; N, h, dropout, label smoothing and the positional encoding as the row sets them.

    Returns ``{"config": {encoder_layers, decoder_layers, d_model, d_ff, num_heads, d_k, d_v, dropout,
    position_encoding}, "label_smoothing_factor": eps}``. A factor that does not divide a size exactly is an error.
    """
    check_rows([row])
    if not scale_factor > 0:
        raise ValueError(f"scale_factor must be positive, got {scale_factor}.")
    config = VaswaniTransformerConfig.from_preset(row)
    values = {"encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
              "d_model": config.d_model, "d_ff": config.d_ff, "num_heads": config.num_heads,
              "d_k": config.head_dim_k, "d_v": config.head_dim_v, "dropout": config.dropout,
              "position_encoding": config.position_encoding}  # fmt: skip
    for name in SCALED_FIELDS:
        scaled = values[name] / scale_factor
        if scaled < 1 or scaled != int(scaled):
            raise ValueError(
                f"scale_factor {scale_factor:g} does not divide {name}={values[name]} of row {row!r} "
                f"({values[name]} / {scale_factor:g} = {scaled:g}): choose a factor that divides d_model, d_ff, d_k "
                "and d_v of every chosen row (2, 4, 8 and 16 do for every row; 32 not for A-h32 and B-dk16)."
            )
        values[name] = int(scaled)
    return {"config": values,
            "label_smoothing_factor": preset_training_arguments(row)["label_smoothing_factor"]}  # fmt: skip


def paper_values(scaled: dict[str, Any]) -> dict[str, Any]:
    """A :func:`scaled_row` result in the paper's column names (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls,
    positional)."""
    c = scaled["config"]
    if c["encoder_layers"] != c["decoder_layers"]:
        raise ValueError("Table 3 rows have as many decoder layers as encoder layers.")
    return {"N": c["encoder_layers"], "d_model": c["d_model"], "d_ff": c["d_ff"], "h": c["num_heads"],
            "d_k": c["d_k"], "d_v": c["d_v"], "P_drop": c["dropout"], "eps_ls": scaled["label_smoothing_factor"],
            "positional": "sinusoid" if c["position_encoding"] == "sinusoidal" else c["position_encoding"]}  # fmt: skip


def row_recipe(recipe: dict[str, Any], row: str, *, scale_factor: float, row_dir: str | os.PathLike,
               tokenizer_dir: str | os.PathLike, seed: int, max_steps: int | None = None,
               max_train_minutes: float | None = None, max_eval_samples: int | None = None) -> dict[str, Any]:
    """The training recipe of one row: ``recipe`` (as ``train.load_recipe`` returns it) with the row's scaled model
    (``config_overrides``), its label smoothing, the budget, the seed, the shared tokenizer and this row's folder;
    training only (validation is the runner's), no checkpoint averaging (one checkpoint kept, to resume from), the
    paper's decoding kept (no alpha tuned on the dev set the table reports, no other generation config)."""
    from .train import parse_config_overrides

    scaled = scaled_row(row, scale_factor)
    kept = {k: v for k, v in parse_config_overrides(recipe.get("config_overrides")).items()
            if k not in TABLE3_CONFIG_FIELDS}  # fmt: skip
    overrides = {**kept, **scaled["config"]}
    out = dict(recipe)
    out.update(
        preset=row,
        config_overrides=",".join(f"{k}={v}" for k, v in overrides.items()),
        label_smoothing_factor=scaled["label_smoothing_factor"],
        seed=seed,
        output_dir=str(row_dir),
        tokenizer_name=str(tokenizer_dir),
        max_train_minutes=max_train_minutes,  # None: the budget is updates only (reproducible)
        do_train=True, do_eval=False, do_predict=False, eval_strategy="no", eval_on_start=False,
        length_penalty_grid=None, generation_config=None,  # the paper's beam 4, alpha 0.6 (the runner's dev BLEU)
        average_last_checkpoints=0, save_total_limit=1,  # no averaging (Table 3 had none): one checkpoint to resume
        resume_from_checkpoint="latest", push_to_hub=False,
    )  # fmt: skip
    if max_steps is not None:
        out["max_steps"] = max_steps
    if max_eval_samples is not None:
        out["max_eval_samples"] = max_eval_samples
    return out


# ------------------------------------------------------------------------------------------- training a row


def _child_environment() -> dict[str, str]:
    """The runner's environment; run from a source tree, that tree first on the path: the child trains with the same
    code as the runner (an installed package is found by the child as it is by the runner)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false")}
    package_root = Path(__file__).resolve().parents[1]
    if package_root not in {Path(p).resolve() for p in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))
    return env


def train_row(row_dir: str | os.PathLike, recipe: dict[str, Any]) -> dict[str, Any]:
    """Write ``recipe`` to ``row_dir/recipe.yaml`` and run the training job on it in a child process (output in
    ``row_dir/train.log``); returns the job's ``training_summary.json``. A failed job is an error quoting the log."""
    row_dir = Path(row_dir)
    row_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = row_dir / ROW_RECIPE_NAME
    recipe_file.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True), encoding="utf-8")
    log_file = row_dir / ROW_LOG_NAME
    with open(log_file, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-c", _TRAIN_CODE, str(recipe_file)], stdout=log,
                              stderr=subprocess.STDOUT, env=_child_environment(), check=False)  # fmt: skip
    summary_file = row_dir / "training_summary.json"
    if done.returncode != 0 or not summary_file.is_file():
        tail = "".join(log_file.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-20:])
        raise RuntimeError(f"Training {row_dir.name} failed (exit status {done.returncode}); the end of "
                           f"{log_file}:\n{tail}")  # fmt: skip
    return json.loads(summary_file.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------ scoring


def dev_perplexity(model, dataset, tokenizer, batch_size: int = 64) -> dict[str, float]:
    """Perplexity of ``model`` on a tokenised split (``input_ids``, ``labels`` ending with ``</s>``): exp of the
    summed negative log-likelihood over all target tokens divided by their number; no label smoothing, eval mode.
    With learned positions, a reference longer than the table counts its first ``max_position_embeddings`` tokens
    (as ``VaswaniSeq2SeqTrainer.compute_loss``): the decoder has no positions for the rest.

    Returns ``{"perplexity", "nll_per_token", "tokens"}``.
    """
    from .data import TranslationDataCollator
    from .pipeline import source_length_limit

    collator = TranslationDataCollator(tokenizer)
    limit = source_length_limit(model.config)  # the learned position table's size; None for sinusoids
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.inference_mode():
            for start in range(0, len(dataset), batch_size):
                batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
                labels = batch["labels"][:, :limit]  # [:, :None] keeps all
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels),
                ).logits  # fmt: skip
                total += float(torch.nn.functional.cross_entropy(
                    logits.double().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"))
                count += int((labels != -100).sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("The validation set has no target tokens.")
    return {"perplexity": math.exp(total / count), "nll_per_token": total / count, "tokens": count}


def score_row(model_dir: str | os.PathLike, tokenizer, raw_validation, source_lang: str, target_lang: str,
              num_beams: int | None = None, hypotheses_file: str | os.PathLike | None = None) -> dict[str, Any]:
    """Dev perplexity (:func:`dev_perplexity`) and BLEU (tokenized, as the paper's, and sacreBLEU) of the model in
    ``model_dir`` on ``raw_validation`` (a ``datasets.Dataset`` with a ``translation`` column)."""
    from datasets import DatasetDict
    from transformers import AutoModelForSeq2SeqLM

    from .data import tokenize_parallel_dataset
    from .evaluation import compute_translation_metrics
    from .pipeline import source_length_limit
    from .textio import write_lines
    from .train import truncate_long_sources
    from .translate import translate_lines

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenized, _ = tokenize_parallel_dataset(DatasetDict(validation=raw_validation), tokenizer, source_lang,
                                             target_lang, filter_splits=())  # fmt: skip
    validation = truncate_long_sources(tokenized["validation"], source_length_limit(model.config),
                                       tokenizer.eos_token_id, "validation")  # fmt: skip
    perplexity = dev_perplexity(model, validation, tokenizer)
    pairs = raw_validation["translation"]
    sources, references = [p[source_lang] for p in pairs], [p[target_lang] for p in pairs]
    with torch.inference_mode():
        hypotheses = translate_lines(model, tokenizer, sources, num_beams=num_beams, show_progress=False)
    if hypotheses_file is not None:
        write_lines(hypotheses, hypotheses_file)
    scores = compute_translation_metrics(hypotheses, references, target_lang=target_lang)
    generation = model.generation_config
    beams = num_beams or generation.num_beams
    return {
        "dev_perplexity": perplexity["perplexity"], "dev_nll_per_token": perplexity["nll_per_token"],
        "dev_target_tokens": perplexity["tokens"], "dev_sentences": len(sources),
        "dev_bleu": scores["tokenized_bleu"], "dev_sacrebleu": scores["bleu"],
        "dev_sacrebleu_signature": scores["bleu_signature"],
        "decoding": {"num_beams": beams, **({"length_penalty": generation.length_penalty,
                     "length_penalty_type": getattr(generation, "length_penalty_type", None)} if beams > 1 else {})},
        "parameters": sum(p.numel() for p in model.parameters()),  # shared matrices once
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------- results


def _write_json_atomically(path: Path, value: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)  # a reader sees the old file or the whole new one, never a part


def _check_settings(path: Path, old: dict[str, Any], settings: dict[str, Any]) -> None:
    """An error naming each value of ``settings`` that differs from ``old``, those read from ``path``."""
    differing = []
    for key in sorted({*old, *settings}):
        before, now = old.get(key), settings.get(key)
        if key == "recipe" and isinstance(before, dict) and isinstance(now, dict):  # name the recipe keys that changed
            differing += [f"recipe {k}: {before.get(k)!r} now {now.get(k)!r}" for k in sorted({*before, *now})
                          if before.get(k) != now.get(k)]  # fmt: skip
        elif before != now:
            differing.append(f"{key}: {before!r} now {now!r}")
    if differing:
        raise ValueError(f"{path} was made with other settings ({'; '.join(differing)}): use another --output_dir, or "
                         "delete that folder to start again.")  # fmt: skip


def read_result(row_dir: str | os.PathLike, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The finished result of a row folder, or None when it has none; a result made with other ``settings`` is an
    error naming the differing ones."""
    path = Path(row_dir, RESULT_NAME)
    if not path.is_file():
        return None
    result = json.loads(path.read_text(encoding="utf-8"))
    _check_settings(path, result.get("settings", {}), settings)
    return result


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A Markdown table in Table 3's layout: the row, the values it changes (all of them for ``base`` and for the
    first row when ``base`` is absent, only the differences from it otherwise), train steps, dev PPL, dev BLEU
    (tokenized) and sacreBLEU, parameters in millions."""
    reference = next((r for r in results if r["row"] == "base"), results[0] if results else None)
    header = ["row", *(c for c, _ in COLUMNS), "train steps", "PPL (dev)", "BLEU (dev)", "sacreBLEU (dev)",
              "params ×10^6"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for result in results:
        values = result["values"]
        shown = [str(values[k]) if result is reference or values[k] != reference["values"][k] else ""
                 for _, k in COLUMNS]  # fmt: skip
        lines.append("| " + " | ".join([
            result["row"], *shown, str(result["train_steps"]), f"{result['dev_perplexity']:.2f}",
            f"{result['dev_bleu']:.1f}", f"{result['dev_sacrebleu']:.1f}", f"{result['parameters'] / 1e6:.2f}",
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


CSV_FIELDS = ("row", *(k for _, k in COLUMNS), "train_steps", "train_seconds", "parameters", "dev_perplexity",
              "dev_nll_per_token", "dev_bleu", "dev_sacrebleu", "dev_sentences", "num_beams")  # fmt: skip


def write_csv(results: Sequence[dict[str, Any]], path: str | os.PathLike) -> str:
    """One line per row with every value (CSV_FIELDS); returns the path."""
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results:
            writer.writerow({"row": r["row"], **r["values"], "num_beams": r["decoding"]["num_beams"],
                             **{k: r[k] for k in CSV_FIELDS if k in r}})  # fmt: skip
    return str(path)


def plot_ablations(results: Sequence[dict[str, Any]], output: str | os.PathLike, title: str | None = None) -> str:
    """Bar charts of dev perplexity and dev BLEU per row (base's value as a dashed line); returns the path.
    (Kept here rather than in ``plots.py``, which another change owns; it may move there.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r["row"] for r in results]
    base = next((r for r in results if r["row"] == "base"), None)
    fig, axes = plt.subplots(1, 2, figsize=(max(6.0, 1.0 + 0.9 * len(rows)) * 1.6, 4.2))
    for ax, key, label in ((axes[0], "dev_perplexity", "dev perplexity (lower is better)"),
                           (axes[1], "dev_bleu", "dev BLEU, tokenized (higher is better)")):  # fmt: skip
        values = [r[key] for r in results]
        bars = ax.bar(rows, values, color=["tab:gray" if r == "base" else "tab:blue" for r in rows])
        ax.bar_label(bars, labels=[f"{v:.2f}" if key == "dev_perplexity" else f"{v:.1f}" for v in values],
                     fontsize=8)  # fmt: skip
        if base is not None:
            ax.axhline(base[key], color="black", linestyle="--", linewidth=1, label="base")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_ylim(0, max(max(values) * 1.15, 1.0))  # room for the labels above the bars
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    fig.suptitle(title or "Table 3 at small scale", fontsize=11)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return str(output)


# ------------------------------------------------------------------------------------------------ the runner


def run_ablations(recipe_path: str | os.PathLike, rows: Sequence[str], output_dir: str | os.PathLike, *,
                  scale_factor: float = 1, max_steps: int | None = None, max_train_minutes: float | None = None,
                  seed: int | None = None, num_beams: int | None = None, max_eval_samples: int | None = None,
                  log=print) -> list[dict[str, Any]]:
    """Train and score each Table 3 row of ``rows`` (module docstring), skipping rows already done; write
    ``output_dir/table3.md``, ``.csv`` and ``.png``; return the rows' results in the order given."""
    from .train import _load_tokenizer, _prepare_data, load_recipe, parse_arguments

    rows = check_rows(rows)
    if max_steps is None and max_train_minutes is None:
        raise ValueError("Give a budget per row: max_steps (reproducible) and/or max_train_minutes.")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}.")
    if num_beams is not None and (isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1):
        # before any row trains (scoring refused it after the first row, whose settings then recorded it)
        raise ValueError(f"num_beams must be a positive integer (1 for greedy decoding), got {num_beams!r}.")
    recipe = load_recipe(recipe_path)
    for key in ("model_name_or_path", "config_name"):
        if recipe.get(key):
            raise ValueError(f"{recipe_path}: {key} is set; Table 3 rows train new models from their presets.")
    for row in rows:
        scaled_row(row, scale_factor)  # every row's sizes are checked before anything trains
    output_dir = Path(output_dir).resolve()
    seed = seed if seed is not None else recipe.get("seed", 42)
    settings = {"recipe": recipe, "scale_factor": scale_factor, "max_steps": max_steps,
                "max_train_minutes": max_train_minutes, "seed": seed, "num_beams": num_beams,
                "max_eval_samples": max_eval_samples}  # fmt: skip
    # One output folder, one set of settings (the shared tokenizer too): checked before anything is made or read.
    settings_file = output_dir / SETTINGS_NAME
    if settings_file.is_file():
        _check_settings(settings_file, json.loads(settings_file.read_text(encoding="utf-8")), settings)
    output_dir.mkdir(parents=True, exist_ok=True)
    flags = ["--output_dir", str(output_dir), "--seed", str(seed)]
    if max_eval_samples is not None:
        flags += ["--max_eval_samples", str(max_eval_samples)]
    model_args, data_args, training_args = parse_arguments([str(recipe_path), *flags])
    raw = _prepare_data(model_args, data_args, training_args)
    if "validation" not in raw:
        raise ValueError(f"{recipe_path}: no validation set (validation_file or a dataset with one) to score on.")
    tokenizer = _load_tokenizer(model_args, data_args, training_args, raw)  # trained once, in output_dir/tokenizer
    tokenizer_dir = model_args.tokenizer_name or str(output_dir / "tokenizer")
    _write_json_atomically(settings_file, settings)  # once the data loads: the tokenizer now depends on them
    results = []
    for number, row in enumerate(rows, 1):
        row_dir = output_dir / row
        result = read_result(row_dir, settings)
        if result is not None:
            log(f"[{number}/{len(rows)}] {row}: done earlier, read from {row_dir / RESULT_NAME}")
            results.append(result)
            continue
        recipe_for_row = row_recipe(recipe, row, scale_factor=scale_factor, row_dir=row_dir,
                                    tokenizer_dir=tokenizer_dir, seed=seed, max_steps=max_steps,
                                    max_train_minutes=max_train_minutes, max_eval_samples=max_eval_samples)  # fmt: skip
        summary_file = row_dir / "training_summary.json"
        if summary_file.is_file() and (row_dir / "model.safetensors").is_file():
            log(f"[{number}/{len(rows)}] {row}: trained earlier; scoring")
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        else:
            log(f"[{number}/{len(rows)}] {row}: training (log: {row_dir / ROW_LOG_NAME})")
            started = time.perf_counter()
            summary = train_row(row_dir, recipe_for_row)
            log(f"    trained in {time.perf_counter() - started:.0f} s; scoring on the validation set")
        scores = score_row(row_dir, tokenizer, raw["validation"], data_args.source_lang, data_args.target_lang,
                           num_beams=num_beams, hypotheses_file=row_dir / "dev_translations.txt")  # fmt: skip
        training = summary.get("summary", {})
        result = {"row": row, "settings": settings, "values": paper_values(scaled_row(row, scale_factor)),
                  "train_steps": training.get("updates"), "train_seconds": training.get("wall_time_seconds"),
                  **scores}  # fmt: skip
        _write_json_atomically(row_dir / RESULT_NAME, result)  # last: its presence means the row is done
        log(f"    {row}: dev PPL {result['dev_perplexity']:.2f}, dev BLEU {result['dev_bleu']:.1f}")
        results.append(result)
    table = format_table(results)
    (output_dir / f"{TABLE_STEM}.md").write_text(table + "\n", encoding="utf-8")
    write_csv(results, output_dir / f"{TABLE_STEM}.csv")
    plot_ablations(results, output_dir / f"{TABLE_STEM}.png",
                   title=f"Table 3 at 1/{scale_factor:g} scale, {max_steps or '-'} updates, seed {seed}")  # fmt: skip
    log(table)
    log(f"Wrote {output_dir / TABLE_STEM}.md, .csv and .png")
    return results


# ---------------------------------------------------------------------------------------------- command line

CLI_DESCRIPTION = """Table 3 at small scale: train chosen rows of the paper's Table 3 (presets), scaled down, each for
the same budget and seed on the data of a recipe, and print dev perplexity and BLEU in the paper's layout.

    %(prog)s configs/multi30k_cpu.yaml --rows base A-h1 B-dk16 C-N2 D-ls0.0 E-learned \\
        --scale_factor 4 --max_steps 500 --seed 1 --num_beams 1 --output_dir runs/table3

Scaling: d_model, d_ff, d_k and d_v are divided by --scale_factor; N, h, P_drop, eps_ls and the positional
encoding stay as the row sets them. Each row trains in its own folder under --output_dir from the recipe
written there (recipe.yaml), on one shared vocabulary, without checkpoint averaging or the recipe's
length_penalty_grid (no alpha tuned on the dev set). Dev perplexity: exp of the mean per-token NLL without label
smoothing; dev BLEU: tokenized BLEU as the paper's (and sacreBLEU), with the model's decoding (the paper's beam 4,
alpha 0.6) or --num_beams. Rows already done are read, not re-run. Writes table3.md, table3.csv and table3.png in
--output_dir. A small-scale echo of the paper, not a reproduction.
"""


def parse_args(argv: Sequence[str] | None = None):
    parser = cli.ArgumentParser(prog=Path(sys.argv[0]).name if argv is None else "ablations.py",
                                description=CLI_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("recipe", help="training recipe (YAML/JSON) giving the data and training values")
    parser.add_argument("--rows", nargs="+", required=True, metavar="ROW",
                        help=f"Table 3 rows (presets): {', '.join(available_presets())}")
    parser.add_argument("--output_dir", required=True, help="one folder per row, the shared tokenizer, the tables")
    parser.add_argument("--scale_factor", type=float, default=1.0,
                        help="divide d_model, d_ff, d_k and d_v by this (default 1: the paper's sizes)")
    parser.add_argument("--max_steps", type=int, default=None, help="updates per row (the reproducible budget)")
    parser.add_argument("--max_train_minutes", type=float, default=None,
                        help="wall-clock minutes per row (instead of or on top of --max_steps)")
    parser.add_argument("--seed", type=int, default=None, help="seed of every row (default: the recipe's)")
    parser.add_argument("--num_beams", type=int, default=None,
                        help="dev BLEU decoding: 1 for greedy (default: the model's, the paper's beam 4, alpha 0.6)")
    parser.add_argument("--max_eval_samples", type=int, default=None, help="score the first N validation pairs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (``scripts/ablations.py``); a bad row, scale factor or budget is one error line, exit status 2."""
    args = parse_args(argv)
    try:
        run_ablations(args.recipe, args.rows, args.output_dir, scale_factor=args.scale_factor,
                      max_steps=args.max_steps, max_train_minutes=args.max_train_minutes, seed=args.seed,
                      num_beams=args.num_beams, max_eval_samples=args.max_eval_samples)  # fmt: skip
    except (ValueError, FileNotFoundError) as error:
        print(f"ablations.py: error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # a row's training job failed: its log's end is in the message
        print(f"ablations.py: error: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "check_rows",
    "dev_perplexity",
    "format_table",
    "main",
    "paper_values",
    "plot_ablations",
    "read_result",
    "row_recipe",
    "run_ablations",
    "scaled_row",
    "score_row",
    "train_row",
    "write_csv",
]


if __name__ == "__main__":  # python -m vaswani_transformer.ablations, as the console script
    sys.exit(main())
