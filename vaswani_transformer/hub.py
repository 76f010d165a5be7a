"""Hub repositories for our models: export folder, validation in a clean Python, upload (the card: `card.py`).

A repository built here holds everything `pipeline("translation", model=repo, trust_remote_code=True)` needs where
only transformers is installed:

- `model.safetensors` and `config.json` with `auto_map` (written by `save_pretrained`, which also copies the code
  files `configuration_vaswani_transformer.py`, `modeling_vaswani_transformer.py`, `generation.py`);
- `pipeline.py` (`vaswani_transformer/pipeline.py`) and `custom_pipelines` in `config.json`, for the tasks
  "translation" and "translation_XX_to_YY";
- the tokenizer files;
- `generation_config.json` with the paper's decoding (beam 4, GNMT length penalty alpha 0.6, `max_len_a=1`,
  `max_len_b=50`: source length + 50);
- `README.md`, the model card (`vaswani_transformer.card.render_model_card`).

Functions:

- `export_repository(model, output_dir, ...)`: the whole folder from a model (object or saved folder).
- `write_repository_extras(folder, training_info=None, eval_results=None, ...)`: adds card, pipeline code,
  `custom_pipelines` and generation config to a folder `save_pretrained` wrote (what `Seq2SeqTrainer(push_to_hub=True)`
  runs call through `write_model_card(folder, trainer=...)`).
- `validate_repository(folder)`: loads the folder in a fresh Python where `vaswani_transformer` cannot be imported,
  with `trust_remote_code=True`, and checks that the pipeline translates a sentence exactly like `generate` + decode.
- `push_repository(folder, repo_id, ...)`: validates, then creates the repo and uploads the folder; refuses to upload
  a folder that fails validation or holds a run's training state or another model (`training_leftovers`). The token
  comes from the usual login or environment and is never printed.
  A Hub that does not answer (no network, a wrong `HF_ENDPOINT`, offline mode) is a `HubUnreachableError`: one line,
  "cannot reach the Hub at <endpoint>: <reason>; nothing was uploaded" (`check_hub_reachable` asks it first).
- `push_trained_model(trainer, folder, ...)`: `vaswani-train --push_to_hub`'s one push at the end of a run, of the
  tested model (averaged, scored).
- `main(argv)`: the command line `vaswani-push` (also `scripts/push_to_hub.py`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from huggingface_hub import HfApi, ModelCard
from transformers import AutoTokenizer

from . import cli
from .checkpoints import load_trained_model
from .card import (
    EXAMPLE_SENTENCE,
    as_reports,
    read_json,
    render_model_card,
    trainer_metric_reports,
    training_info_from_run,
    training_info_from_trainer,
    training_info_of_model,
)
from .configuration_vaswani_transformer import VaswaniTransformerConfig
from .generation import PAPER_GENERATION_DEFAULTS, VaswaniGenerationConfig
from .pipeline import model_language_pair
from .translate import check_model_folder


logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
PIPELINE_SOURCE = Path(__file__).resolve().parent / "pipeline.py"
PIPELINE_FILE = "pipeline.py"
PIPELINE_CLASS = "TranslationPipeline"
CODE_FILES = ("configuration_vaswani_transformer.py", "modeling_vaswani_transformer.py", "generation.py")
DEFAULT_COMMIT_MESSAGE = "Upload Transformer (Vaswani et al., 2017) translation model"


class RepositoryValidationError(RuntimeError):
    """The folder does not load or translate in a clean Python with only transformers (see `validate_repository`)."""


class HubUnreachableError(ConnectionError):
    """No answer from the Hub (no network, a wrong HF_ENDPOINT, offline mode); the message never holds the token."""

    def __init__(self, endpoint: str, error: BaseException):
        reason = str(error).rstrip(". ") or type(error).__name__
        for token in {os.environ.get("HF_TOKEN"), _stored_token()} - {None, ""}:
            reason = reason.replace(token, "<token>")
        super().__init__(f"cannot reach the Hub at {endpoint}: {reason}; nothing was uploaded.")
        self.endpoint = endpoint


def _stored_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - only used to keep a token out of a message
        return None


def hub_transport_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean the server gave no answer: Python's, and those of the HTTP client huggingface_hub uses
    (httpx for huggingface_hub 1.x, httpx2 for 2.x); an HTTP error status is an answer and is not among them."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx", "TransportError"), ("httpx2", "TransportError"), ("requests", "ConnectionError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def hub_endpoint(api=None) -> str:
    """The Hub's address: `api.endpoint`, else HF_ENDPOINT (https://huggingface.co by default)."""
    from huggingface_hub import constants

    return getattr(api, "endpoint", None) or constants.ENDPOINT


def check_hub_reachable(endpoint: str | None = None, timeout: float = 10) -> None:
    """Raise `HubUnreachableError` unless the Hub at `endpoint` (default `hub_endpoint()`) answers a HEAD request
    (with any status), through huggingface_hub's own HTTP session (its proxies, offline mode and headers)."""
    from huggingface_hub.utils import get_session

    endpoint = endpoint or hub_endpoint()
    try:
        get_session().head(endpoint, timeout=timeout)
    except hub_transport_errors() as error:
        raise HubUnreachableError(endpoint, error) from None


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def custom_pipelines_entry(source_lang: str | None = None, target_lang: str | None = None) -> dict[str, dict]:
    """The `custom_pipelines` value of `config.json`: "translation" (and "translation_XX_to_YY" for a known pair)."""
    entry = {"impl": f"{Path(PIPELINE_FILE).stem}.{PIPELINE_CLASS}", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    tasks = {"translation": dict(entry)}
    if source_lang and target_lang:
        tasks[f"translation_{source_lang}_to_{target_lang}"] = dict(entry)
    return tasks


# ------------------------------------------------------------------------------------------ the repository


def write_repository_extras(
    folder: PathLike,
    training_info: Mapping[str, Any] | None = None,
    eval_results=None,
    *,
    source_lang: str | None = None,
    target_lang: str | None = None,
    **card_options,
) -> ModelCard:
    """Complete a folder written by `model.save_pretrained` (+ tokenizer) into a Hub repository; returns the card.

    Adds `pipeline.py` and `custom_pipelines` in `config.json` (tasks "translation" and, when the pair is known,
    "translation_XX_to_YY"); writes `generation_config.json` with the paper's decoding if the folder has none (an
    existing one is kept, only missing paper fields are added); renders `README.md` (see `render_model_card`).
    `training_info`: a dict of recipe fields (`training_info_from_run`/`training_info_from_trainer`);
    `eval_results`: evaluation reports (dicts or paths of the JSON `vaswani-evaluate` writes); `card_options`: the
    other keywords of `render_model_card` (license, datasets, model_name, repo_id, tags, example, template_path).
    Raises FileNotFoundError naming what the folder lacks (config, weights, the code files of `save_pretrained`).
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    config_dict = read_json(config_path)
    missing = [name for name in CODE_FILES if not (folder / name).is_file()]
    if not config_dict.get("auto_map"):
        missing.append("the 'auto_map' entry of config.json")
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks {', '.join(missing)}: save the model with `vaswani_transformer` imported (it registers "
            "the classes for remote code) or use export_repository."
        )
    reports = as_reports(eval_results)
    if not (source_lang and target_lang):
        recorded = model_language_pair(SimpleNamespace(custom_pipelines=config_dict.get("custom_pipelines")))
        for pair in ([recorded] if recorded else []) + [(r.get("source_lang"), r.get("target_lang")) for r in reports]:
            source_lang, target_lang = source_lang or pair[0] or None, target_lang or pair[1] or None

    shutil.copyfile(PIPELINE_SOURCE, folder / PIPELINE_FILE)
    config_dict["custom_pipelines"] = custom_pipelines_entry(source_lang, target_lang)
    _write_json(config_path, config_dict)

    generation_path = folder / "generation_config.json"
    if generation_path.is_file():
        generation = read_json(generation_path)
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
        **card_options,
    )
    card.save(folder / "README.md")
    return card


def write_model_card(output_dir: PathLike, trainer=None, **kwargs) -> ModelCard | None:
    """`Seq2SeqTrainer.create_model_card` for our runs: `write_repository_extras` on the trainer's output folder.

    Reads the recipe from `trainer` (`training_info_from_trainer`) and the run folder; evaluation reports from
    `eval_results=` (evaluation JSONs of vaswani-evaluate, or dicts) or else the run's own metrics
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
    datasets, model_name, repo_id, tags, template_path). From a saved folder, the card's recipe defaults to
    `training_info_of_model` (the run that wrote it, the checkpoints averaged) and its results to the folder's own
    `test_results.json`/`eval_results.json` (`trainer_metric_reports`); `eval_results` replaces them. A non-empty
    `output_dir` is refused unless `overwrite`."""
    output_dir = Path(output_dir)
    if isinstance(model, (str, os.PathLike)) and Path(model).exists():
        target, source = output_dir.resolve(), Path(model).resolve()
        if source == target or target in source.parents:
            raise ValueError(
                f"--output_dir {output_dir} {'is' if source == target else 'holds'} the model to export ({model}): "
                "writing the repository there would delete the model first. Choose another folder."
            )
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
                training_info = training_info_of_model(source) or None
            if eval_results is None:  # the folder's own scores (a run's test/validation results), not the run's around
                eval_results = trainer_metric_reports(source) or None
            # The card's learning curve: the run holding trainer_state.json (the model folder, or the run around it).
            runs = [d for d in (source, source.parent) if (d / "trainer_state.json").is_file()]
            card_options.setdefault("training_run", runs[0] if runs else None)
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model)
        model = load_trained_model(model)  # one-line errors: unsafe pickle, truncated, other shapes/names
    elif tokenizer is None:
        raise ValueError("Pass `tokenizer` when `model` is a model object.")
    if getattr(model.config, "model_type", None) != "vaswani_transformer":
        raise ValueError(f"export_repository exports vaswani_transformer models; got {model.config.model_type!r}.")
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    keep_only_our_code_references(output_dir)
    write_repository_extras(output_dir, training_info, eval_results, **card_options)
    return output_dir


def keep_only_our_code_references(folder: PathLike) -> None:
    """Drop every `auto_map` entry of the saved config and tokenizer config that names code other than this package's
    files in the folder: a folder from someone else may name its own or another repository's code (`repo--module.X`),
    which the validation (`trust_remote_code=True`) would run and the pushed repository would pass on."""
    ours = {Path(name).stem for name in CODE_FILES}
    for name in ("config.json", "tokenizer_config.json"):
        path = Path(folder) / name
        if not path.is_file():
            continue
        data = read_json(path)
        auto_map = data.get("auto_map")
        if not auto_map:
            continue
        kept = {key: value for key, value in auto_map.items()
                if isinstance(value, str) and "--" not in value and value.split(".")[0] in ours}  # fmt: skip
        dropped = sorted(set(auto_map) - set(kept))
        if dropped:
            logger.warning("%s: dropped auto_map entries naming code other than this package's: %s", path,
                           ", ".join(f"{key}={auto_map[key]!r}" for key in dropped))  # fmt: skip
            if kept:
                data["auto_map"] = kept
            else:
                del data["auto_map"]
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


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


def validate_repository(folder: PathLike, sentence: str = EXAMPLE_SENTENCE, timeout: float = 600) -> dict:
    """Load `folder` in a fresh Python where `vaswani_transformer` cannot be imported (`trust_remote_code=True`,
    offline) and translate `sentence` through `pipeline("translation")` and `generate`; they must agree.

    Returns what the subprocess reports (translation, model and pipeline classes, decoding settings); raises
    RepositoryValidationError with the subprocess's error output otherwise."""
    folder = Path(folder).resolve()
    if not (folder / "config.json").is_file():
        raise RepositoryValidationError(f"{folder} has no config.json.")
    with tempfile.TemporaryDirectory(prefix="vaswani-validate-") as scratch:
        dropped = ("PYTHONPATH", "PYTHONSTARTUP", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_DATASETS_CACHE")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        # an empty Hub cache: code the folder names in a cached repository cannot resolve
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=os.path.join(scratch, "modules"),
                   HF_HOME=os.path.join(scratch, "home"), HF_HUB_CACHE=os.path.join(scratch, "home", "hub"))
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
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    token: str | bool | None = None,
    validation_sentence: str = EXAMPLE_SENTENCE,
    api=None,
) -> str:
    """Validate `folder` (`validate_repository`; nothing is uploaded if that fails), create `repo_id` if needed
    (`private`), create the branch `revision` if needed, and upload the folder in one commit. Returns the commit URL.

    `token`: None uses the usual login (`hf auth login`) or `HF_TOKEN`; it is never printed or logged.
    `api`: a `huggingface_hub.HfApi` (default: a new one).

    A folder holding training state or another model (`training_leftovers`: a run's output folder) is refused
    before anything else: the whole folder would be uploaded. `export_repository` writes a clean one."""
    leftovers = training_leftovers(folder)
    if leftovers:
        shown = ", ".join(leftovers[:4]) + (f" and {len(leftovers) - 4} more" if len(leftovers) > 4 else "")
        raise ValueError(
            f"{folder} holds more than a model repository ({shown}): pushing it would upload all of that. Export the "
            "model to a clean folder first (export_repository, or vaswani-push --model_name_or_path with it)."
        )
    report = validate_repository(folder, validation_sentence)
    logger.info("Validated %s in a clean Python: %r -> %r", folder, validation_sentence, report["translation"])
    api = api if api is not None else HfApi()
    try:
        repo_url = api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
        repo_id = getattr(repo_url, "repo_id", None) or repo_id
        if revision is not None:
            api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), repo_type="model", revision=revision, token=token,
            commit_message=commit_message,
        )
    except hub_transport_errors() as error:
        raise HubUnreachableError(hub_endpoint(api), error) from None
    return str(getattr(commit, "commit_url", commit))


# What a training run's folder holds beside a model: checkpoints (with optimizer, scheduler and random states) and,
# in subfolders, other models (averaged/). None of it belongs in a model repository.
TRAINING_STATE_PATTERNS = ("checkpoint-*", "optimizer.pt", "scheduler.pt", "rng_state*.pth", "scaler.pt")


def training_leftovers(folder: PathLike) -> list[str]:
    """The paths in `folder` (relative, sorted) that a model repository should not hold: training state
    (`TRAINING_STATE_PATTERNS`, at any depth) and subfolders holding another model's config.json."""
    folder = Path(folder)
    found = {path for pattern in TRAINING_STATE_PATTERNS for path in folder.rglob(pattern)}
    found |= {path.parent for path in folder.glob("*/**/config.json")}
    return sorted(str(path.relative_to(folder)) for path in found if not any(p in found for p in path.parents))


def push_trained_model(trainer, folder: PathLike, source_lang=None, target_lang=None, datasets=None, api=None):
    """`--push_to_hub` of a `vaswani-train` run, once it is over: the tested model's folder (`averaged/` when the run
    averages), with its scores, exported (`export_repository`) and pushed (`push_repository`) to the trainer's
    repository after transformers' checkpoint pushes have finished. Returns the commit URL (None on other
    processes). transformers' own push of the final weights, before averaging and scoring, is not made
    (`VaswaniSeq2SeqTrainer.save_model(push=False)`)."""
    if not trainer.is_world_process_zero():
        return None
    trainer._finish_current_push()
    with tempfile.TemporaryDirectory(prefix="vaswani-push-") as scratch:
        export = export_repository(
            folder, Path(scratch) / "repository", source_lang=source_lang, target_lang=target_lang, datasets=datasets,
            repo_id=trainer.hub_model_id,
        )  # fmt: skip
        return push_repository(
            export, trainer.hub_model_id, private=bool(trainer.args.hub_private_repo), token=trainer.args.hub_token,
            revision=trainer.args.hub_revision, commit_message="End of training", api=api,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------------ command line

CLI_DESCRIPTION = """Build the Hub repository of a trained model (weights, code, tokenizer, generation config, model card) and upload it.

Dry run (writes the folder, uploads nothing):

    %(prog)s --model_name_or_path outputs/run/averaged --source_lang en --target_lang de \\
        --eval_results outputs/run/eval_test.json --dataset bentrevett/multi30k --output_dir outputs/hub-en-de

Upload (token from `hf auth login` or HF_TOKEN; never printed):

    %(prog)s --model_name_or_path outputs/run/averaged --repo_id me/transformer-base-en-de --private

Before any upload the folder is loaded in a fresh Python where `vaswani_transformer` cannot be imported
(`trust_remote_code=True`) and must translate a sentence; otherwise nothing is uploaded. Options are spelled as
transformers' scripts spell them; the first spelling shown is the canonical one, the dashed spellings and --model
are accepted aliases. See `vaswani_transformer.hub`.
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.ArgumentParser(
        description=CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", "--model", required=True,
                        help="Saved model folder (with its tokenizer).")  # fmt: skip
    parser.add_argument("--output_dir", "--output-dir",
                        help="Dry run: write the repository folder here, upload nothing.")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty --output_dir.")
    parser.add_argument("--repo_id", "--repo-id",
                        help="Hub repository, owner/name: uploads there (with --output_dir it only names the card).")
    parser.add_argument("--private", action="store_true", help="Create the repository private.")
    parser.add_argument("--revision", help="Branch to upload to (created if needed).")
    parser.add_argument("--commit_message", "--commit-message", help=f"Default: {DEFAULT_COMMIT_MESSAGE!r}.")
    parser.add_argument("--source_lang", "--source-lang", help="Source language code, e.g. en.")
    parser.add_argument("--target_lang", "--target-lang", help="Target language code, e.g. de.")
    parser.add_argument("--license", help="The card's license (default: apache-2.0).")
    parser.add_argument("--dataset", action="append", default=[], help="Training dataset (Hub id or name); repeat.")
    parser.add_argument("--eval_results", "--eval-results", action="append", default=[],
                        help="Evaluation JSON written by vaswani-evaluate; repeat for several test sets.")
    parser.add_argument("--training_run", "--training-run",
                        help="Training output folder to read the recipe and learning curve from (default: the model "
                        "folder, then its parent).")  # fmt: skip
    parser.add_argument("--model_name", "--model-name", help="Title of the model card (default: from the repo id).")
    parser.add_argument("--validation_sentence", "--validation-sentence", help=f"Default: {EXAMPLE_SENTENCE!r}.")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """`vaswani-push` / `scripts/push_to_hub.py`: exit status 0; 1 with an error line; 2 without a destination."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.output_dir is None and args.repo_id is None:
        print("error: give --output_dir (dry run) or --repo_id (upload).", file=sys.stderr)
        return 2
    if args.output_dir is not None and (problem := cli.output_path_problem(args.output_dir, "--output_dir", True)):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    card_options = dict(source_lang=args.source_lang, target_lang=args.target_lang, datasets=args.dataset or None,
                        model_name=args.model_name, repo_id=args.repo_id)  # fmt: skip
    if args.license is not None:
        card_options["license"] = args.license
    sentence = {} if args.validation_sentence is None else {"sentence": args.validation_sentence}
    training_info = training_info_of_model(args.model_name_or_path, args.training_run) if args.training_run else None
    if args.training_run:
        card_options["training_run"] = args.training_run  # its learning curve goes into the card
    try:
        if args.output_dir is None:  # an upload: ask the Hub first, before minutes of export and validation
            if os.path.isdir(args.model_name_or_path):
                check_model_folder(args.model_name_or_path)
            check_hub_reachable()
        with tempfile.TemporaryDirectory(prefix="vaswani-hub-") as scratch:
            folder = export_repository(
                args.model_name_or_path, args.output_dir or scratch, training_info=training_info,
                eval_results=args.eval_results or None, overwrite=args.overwrite, **card_options,
            )  # fmt: skip
            if args.output_dir is not None:  # dry run (the repo id, if given, only names the card)
                report = validate_repository(folder, **sentence)
                print(f"Wrote {folder}; it translates in a clean Python: {json.dumps(report, ensure_ascii=False)}")
                return 0
            options = {} if args.commit_message is None else {"commit_message": args.commit_message}
            if args.validation_sentence is not None:
                options["validation_sentence"] = args.validation_sentence
            url = push_repository(folder, args.repo_id, private=args.private, revision=args.revision, **options)
            print(f"Uploaded {folder} to {url}")
    except RepositoryValidationError as error:
        print(f"error: refusing to upload: {error}", file=sys.stderr)
        return 1
    except HubUnreachableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


__all__ = [
    "CODE_FILES",
    "HIDE_PACKAGE_CODE",
    "HubUnreachableError",
    "RepositoryValidationError",
    "check_hub_reachable",
    "custom_pipelines_entry",
    "export_repository",
    "main",
    "push_repository",
    "push_trained_model",
    "training_leftovers",
    "validate_repository",
    "write_model_card",
    "write_repository_extras",
]


if __name__ == "__main__":  # python -m vaswani_transformer.hub, as the console script
    sys.exit(main())
