"""Trainer checkpoints: which are complete (one rule), the latest, resuming, and averaging them.

A ``checkpoint-<step>`` folder is complete when every file in it loads and the files it needs exist
(:func:`checkpoint_problem`); resuming (:func:`resolve_resume_checkpoint`, :func:`find_last_complete_checkpoint`)
and averaging (:func:`average_checkpoints`) use that same rule. Averaging is the paper's (Section 6.1: the base
models average the last 5 checkpoints, the big ones 20): the float64 mean of the newest complete checkpoints,
written as a folder that ``from_pretrained`` loads (``save_pretrained``, so tied embeddings stay one tensor), with
the config, generation config and tokenizer. :func:`main` is the command line (``scripts/average_checkpoints.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import sys
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import SAFE_WEIGHTS_NAME

from . import cli

logger = logging.getLogger(__name__)

TRAINER_STATE_NAME = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME (not importable cheaply)
AVERAGING_RECORD_NAME = "averaged_checkpoints.json"
# accelerate's FSDP checkpoint files (accelerate.utils.constants.FSDP_MODEL_NAME): `pytorch_model_fsdp.bin` with
# fsdp_state_dict_type FULL_STATE_DICT, a torch.distributed.checkpoint folder `pytorch_model_fsdp_0/` with SHARDED
FSDP_MODEL_NAME = "pytorch_model_fsdp"
DEFAULT_NUM_LAST = 5  # the paper's base models
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


# ---------------------------------------------------------------------------------------------- finding


def checkpoint_step(path: os.PathLike | str) -> int | None:
    """The step of a `checkpoint-<step>` folder, None for other names."""
    match = _CHECKPOINT_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def find_checkpoints(run_dir: os.PathLike | str) -> list[Path]:
    """The `checkpoint-<step>` folders of a Trainer output directory, oldest (lowest step) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such directory.")
    found = [p for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)

# ------------------------------------------------------------------------------------ the completeness rule


def file_problem(path: os.PathLike | str) -> str | None:
    """Why the checkpoint file `path` would not load, or None when it is whole (read without loading tensors).

    `*.safetensors`: safetensors' own header reader, which also refuses a file whose size differs from the end of the
    header's last tensor (a truncated file); `*.json`: must parse; `*.bin`, `*.pt`, `*.pth` (torch.save, e.g.
    `optimizer.pt`, `scheduler.pt`, `rng_state.pth`): a zip archive whose directory (at the end of the file) reads
    and whose every member lies inside the file, checked without unpickling anything.
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return f"empty {path.name}"
        if path.suffix == ".safetensors":
            with safe_open(path, framework="pt"):
                pass
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix in (".bin", ".pt", ".pth"):
            size = path.stat().st_size
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    if info.header_offset + info.compress_size > size:
                        return f"truncated {path.name} (member {info.filename} ends past the end of the file)"
    except Exception as error:  # OSError, JSON and zip errors, and safetensors' own error type
        return f"unreadable {path.name}: {error}"
    return None


def sharded_folder_problem(folder: os.PathLike | str) -> str | None:
    """Why a torch.distributed.checkpoint folder (FSDP's `pytorch_model_fsdp_0/`, `optimizer_0/`) is not whole, or
    None: its `.metadata`, which the coordinating rank writes (through a temporary file renamed into place) only
    after every rank wrote its `*.distcp` shards, must be there and non-empty, next to at least one shard."""
    folder = Path(folder)
    metadata = folder / ".metadata"
    if not metadata.is_file() or metadata.stat().st_size == 0:
        return f"unfinished sharded {folder.name}/ (no .metadata: the ranks did not all finish writing it)"
    if not any(folder.glob("*.distcp")):
        return f"sharded {folder.name}/ has no .distcp shard"
    return None


def checkpoint_problem(path: os.PathLike | str, for_resume: bool = False) -> str | None:
    """Why `path` is not a complete Trainer checkpoint, or None when it is: the one rule for averaging and resuming.

    Complete means every file in it loads (`file_problem`: safetensors header and size agree, JSON parses, torch
    archives are whole) and the needed files exist: `trainer_state.json` (the Trainer writes it last, so without it
    the checkpoint was left half-written by a run killed while saving) and the weights (`model.safetensors` for
    averaging; any weights format the Trainer saves, plus the optimizer and scheduler states, for resuming; a whole
    checkpoint with neither, which a ``save_only_model`` run writes, is `MODEL_ONLY` for resuming). FSDP's
    sharded folders (`pytorch_model_fsdp_0/`, `optimizer_0/`) must be whole (`sharded_folder_problem`); they resume
    but do not average (no `model.safetensors`: the shipped FSDP config saves full state dicts).
    """
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    weight_files = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_NAME + ".index.json", "pytorch_model.bin", f"{FSDP_MODEL_NAME}.bin")
    sharded = path / f"{FSDP_MODEL_NAME}_0"  # FSDP with SHARDED_STATE_DICT: resumable, no model.safetensors
    if for_resume and not (any((path / name).is_file() for name in weight_files) or sharded.is_dir()):
        return "missing model weights"
    if not for_resume and not (path / SAFE_WEIGHTS_NAME).is_file():
        if sharded.is_dir():
            return (f"sharded FSDP weights only ({sharded.name}/, fsdp_state_dict_type SHARDED_STATE_DICT), no "
                    f"{SAFE_WEIGHTS_NAME}: train with FULL_STATE_DICT (configs/accelerate/fsdp.yaml) to average")
        return f"missing {SAFE_WEIGHTS_NAME}"
    if not (path / TRAINER_STATE_NAME).is_file():
        return f"missing {TRAINER_STATE_NAME} (checkpoint not finished)"
    states = (any(path.glob("optimizer*")), any(path.glob("scheduler*")))
    if for_resume and any(states) and not all(states):
        return "missing optimizer or scheduler state"
    if for_resume and all(states) and not any(path.glob("rng_state*.pth")):  # written after the states, before the
        return "missing rng_state.pth (the random state, written after the optimizer's)"  # trainer state
    for file in sorted(path.iterdir()):
        if file.is_dir() and (file.name.startswith(f"{FSDP_MODEL_NAME}_") or file.name.startswith("optimizer_")):
            problem = sharded_folder_problem(file)
        else:
            problem = file_problem(file) if file.is_file() else None
        if problem is not None:
            return problem
    index = path / (SAFE_WEIGHTS_NAME + ".index.json")
    if index.is_file():  # sharded weights: every shard the index names must be there
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        absent = sorted(name for name in shards if not (path / name).is_file())
        if absent:
            return f"missing weight shard(s) {absent}"
    if for_resume and not any(states):  # whole, trainer state written last: the run saved no states on purpose
        return MODEL_ONLY
    return None


# A whole checkpoint without optimizer and scheduler states (`checkpoint_problem`): a save_only_model run's.
MODEL_ONLY = "saved with save_only_model (weights and trainer state only, no optimizer or scheduler state)"


def cannot_resume_model_only(path: os.PathLike | str) -> ValueError:
    """The error for resuming from `path`, a whole checkpoint a ``save_only_model`` run wrote: transformers would
    start a new optimizer and schedule at its step, not continue the run."""
    return ValueError(
        f"{path} was {MODEL_ONLY}: training cannot resume from it. Start a new run from its weights with "
        f"--model_name_or_path {path} and a new --output_dir (the learning-rate schedule starts again at update 1), "
        "and train with --save_only_model false to write checkpoints that resume."
    )


class UnsafePickleError(pickle.UnpicklingError, ValueError):
    """A pickled weights file (`pytorch_model.bin`) that torch's weights-only loader refused: it holds more than
    tensors, and unpickling it could run code."""


def pickle_refusal_reason(error: BaseException) -> str:
    """The one line of torch's weights-only refusal that names what was refused (e.g. `Unsupported global: GLOBAL
    exec ...`), without its advice to load with `weights_only=False`."""
    found = re.search(r"WeightsUnpickler error: ([^\n]*?)\.? Please", str(error))
    return found.group(1) if found else (str(error).strip().splitlines() or [type(error).__name__])[0]


@contextlib.contextmanager
def weights_load_errors(source: os.PathLike | str):
    """Name `source` in the errors of loading its weights (`from_pretrained` inside this block), as one-line
    ValueErrors that command lines print: a pickled `.bin` that torch's weights-only loader refused
    (`UnsafePickleError`), a truncated or corrupt safetensors file, tensors whose shapes do not fit `config.json`."""
    try:
        yield
    except UnsafePickleError:
        raise
    except pickle.UnpicklingError as error:
        raise UnsafePickleError(
            f"{source}: refused to load its pickled weights ({pickle_refusal_reason(error)}): the pickle holds more "
            "than tensors and could run code. Nothing was executed; convert weights you trust to safetensors."
        ) from None
    except SafetensorError as error:
        raise ValueError(f"{source}: unreadable weights (a truncated or corrupt safetensors file: {error}).") from None
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(
            f"{source}: the weights do not fit its config.json (tensors of another shape, listed in the load report "
            "above): the weights belong to another model configuration."
        ) from None


def load_trained_model(source: os.PathLike | str, **kwargs):
    """``AutoModelForSeq2SeqLM.from_pretrained(source, **kwargs)`` for translating, evaluating or exporting: errors of
    loading named in one line (`weights_load_errors`), and weights that leave any of the model's tensors missing
    (another architecture's names) refused, where transformers would start those tensors from random values."""
    from transformers import AutoModelForSeq2SeqLM

    with weights_load_errors(source):
        model, info = AutoModelForSeq2SeqLM.from_pretrained(source, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        listed = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise ValueError(
            f"{source}: its weights lack {len(missing)} of the model's tensors ({listed}): they were saved from "
            "another model; refusing to use random values in their place."
        )
    return model


# ---------------------------------------------------------------------------------------- latest, resume


def find_last_complete_checkpoint(output_dir: str | os.PathLike, quarantine: bool = True) -> str | None:
    """The newest ``checkpoint-N`` in ``output_dir`` (by N) complete for resuming, or None.

    Incomplete ones (left by a killed run: newer ones half-written, older ones half-deleted by the checkpoint
    rotation, which transformers runs in order of the folders' modification times, so that the half-deleted one,
    kept as the newest, would be kept again and averaged) are renamed ``incomplete-checkpoint-N`` (or
    ``incomplete-checkpoint-N.K``) with a warning when ``quarantine`` is true, so the Trainer's own checkpoint
    rotation, later saves and averaging never mistake them for real checkpoints. Whole ones a ``save_only_model`` run
    wrote (`MODEL_ONLY`) are passed over and left in place.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    found = None
    for p in reversed(find_checkpoints(output_dir)):
        if found is not None and not quarantine:
            break
        problem = checkpoint_problem(p, for_resume=True)
        if problem is None:
            found = found or str(p)
            continue
        if problem == MODEL_ONLY:
            continue
        if quarantine:
            target = output_dir / f"incomplete-{p.name}"
            k = 0
            while target.exists():
                k += 1
                target = output_dir / f"incomplete-{p.name}.{k}"
            logger.warning("Checkpoint %s is incomplete (a run stopped while saving or deleting it); moved to %s.", p,
                           target)  # fmt: skip
            p.rename(target)
    return found


NOT_RESUMING = (None, "", "false", "False", False)  # resume_from_checkpoint values that start a new run


def resolve_resume_checkpoint(value, output_dir: str | os.PathLike, quarantine: bool = True) -> str | None:
    """The checkpoint ``resume_from_checkpoint=value`` names: None for none, the newest complete one of
    ``output_dir`` for ``latest``/``true`` (None, with a warning, when there is none), or the given folder, which
    must be complete (a ValueError naming what is wrong otherwise). A ``save_only_model`` checkpoint (`MODEL_ONLY`),
    the one named or one newer than the latest complete one, is a ValueError saying how to go on from its weights."""
    if value in NOT_RESUMING:
        return None
    if value in ("latest", "true", "True", True):
        found = find_last_complete_checkpoint(output_dir, quarantine=quarantine)
        kept = find_checkpoints(output_dir) if Path(output_dir).is_dir() else []
        newer = [p for p in kept if found is None or checkpoint_step(p) > checkpoint_step(found)]
        model_only = [p for p in newer if checkpoint_problem(p, for_resume=True) == MODEL_ONLY]
        if model_only:
            raise cannot_resume_model_only(model_only[-1])
        if found is None:
            logger.warning("resume_from_checkpoint=%s: no complete checkpoint in %s; starting from scratch.",
                           value, output_dir)
        return found
    problem = checkpoint_problem(value, for_resume=True)
    if problem == MODEL_ONLY:
        raise cannot_resume_model_only(value)
    if problem is not None:
        raise ValueError(f"resume_from_checkpoint={value!r} is not a complete checkpoint: {problem}.")
    return value


# ------------------------------------------------------------------------------------------------ averaging


@dataclass
class AveragingResult:
    """What `average_checkpoints` did: the averaged checkpoints (oldest first) and the skipped ones."""

    output_dir: Path
    checkpoints: list[Path]
    skipped: dict[str, str] = field(default_factory=dict)
    tokenizer_source: Path | None = None

    def to_dict(self) -> dict:
        return {
            "checkpoints": [str(p) for p in self.checkpoints],
            "num_checkpoints": len(self.checkpoints),
            "skipped": self.skipped,
            "tokenizer_source": str(self.tokenizer_source) if self.tokenizer_source else None,
        }


def _candidates(run_dir_or_list) -> tuple[list[Path], Path | None]:
    """(candidate checkpoints oldest first, run directory or None)."""
    if isinstance(run_dir_or_list, (str, os.PathLike)):
        run_dir = Path(run_dir_or_list)
        if checkpoint_step(run_dir) is not None and not find_checkpoints(run_dir):
            raise ValueError(
                f"{run_dir} is a single checkpoint; pass the run directory that contains the checkpoint-<step> "
                "folders, or a list of checkpoints."
            )
        candidates = find_checkpoints(run_dir)
        if not candidates:
            raise ValueError(f"{run_dir} contains no {PREFIX_CHECKPOINT_DIR}-<step> folders.")
        return candidates, run_dir
    candidates = [Path(p) for p in run_dir_or_list]
    if not candidates:
        raise ValueError("Got an empty list of checkpoints.")
    if len(set(map(os.path.realpath, candidates))) != len(candidates):
        raise ValueError(f"The same checkpoint is listed twice in {[str(p) for p in candidates]}.")
    if all(checkpoint_step(p) is not None for p in candidates):
        candidates.sort(key=checkpoint_step)  # "last" = highest steps; otherwise the given order
    return candidates, None


def _tokenizer_source(folders: Sequence[Path | None]) -> Path | None:
    """The first folder holding tokenizer files."""
    for folder in folders:
        if folder is not None and any((folder / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json")):
            return folder
    return None


def average_checkpoints(
    run_dir_or_list: os.PathLike | str | Sequence[os.PathLike | str],
    num_last: int | None = DEFAULT_NUM_LAST,
    output_dir: os.PathLike | str | None = None,
    model_class=None,
) -> AveragingResult:
    """Average the newest `num_last` complete checkpoints into `output_dir` and return what was done.

    run_dir_or_list: a Trainer output directory (its `checkpoint-<step>` folders are the candidates) or a
        list of checkpoint folders ("last" = highest steps when all are named `checkpoint-<step>`, else the
        end of the list).
    num_last: how many to average (paper: 5 for base, 20 for big); None averages every valid candidate.
    model_class: class whose `from_pretrained` loads a checkpoint (default `AutoModelForSeq2SeqLM`).

    A candidate that is not complete (`checkpoint_problem`: no `model.safetensors` or `trainer_state.json`, or a
    file that does not load, as in a half-written checkpoint) is skipped with a warning naming it and the file;
    fewer valid checkpoints than `num_last` is a ValueError listing what was found and what was skipped. Floating
    tensors are averaged in float64 and cast back to their stored dtype; other tensors (integer buffers) must be
    identical in every checkpoint. The output also gets `averaged_checkpoints.json` recording the averaged and
    skipped checkpoints. `output_dir` may be neither one of the checkpoints nor the folder holding them (where the
    run saves its final model).
    """
    if num_last is not None and (not isinstance(num_last, int) or num_last < 1):
        raise ValueError(f"num_last must be a positive integer or None, got {num_last!r}.")
    if output_dir is None:
        raise ValueError("output_dir is required.")
    output_dir = Path(output_dir)
    candidates, run_dir = _candidates(run_dir_or_list)
    if any(os.path.realpath(output_dir) == os.path.realpath(c) for c in candidates):
        raise ValueError(f"output_dir {output_dir} is one of the checkpoints being averaged; choose another folder.")
    if any(os.path.realpath(output_dir) == os.path.realpath(c.parent) for c in candidates):  # the run directory
        raise ValueError(f"output_dir {output_dir} is the run directory holding the checkpoints being averaged (where "
                         f"the run saves its final model, which the average would overwrite); choose another folder, "
                         f"such as {candidates[-1].parent / 'averaged'}.")  # fmt: skip

    wanted = len(candidates) if num_last is None else num_last
    sums: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}  # newest valid checkpoint: names, shapes, dtypes, integer tensors
    used: list[Path] = []
    skipped: dict[str, str] = {}
    progress = tqdm(total=wanted, desc="Averaging checkpoints", unit="ckpt")
    for path in reversed(candidates):  # newest first
        if len(used) == wanted:
            break
        problem = checkpoint_problem(path)
        if problem is None:
            try:
                state = load_file(path / SAFE_WEIGHTS_NAME)
            except Exception as error:  # safetensors raises its own error types for truncated/corrupt files
                problem = f"unreadable {SAFE_WEIGHTS_NAME}: {error}"
        if problem is not None:
            warnings.warn(f"Skipping checkpoint {path}: {problem}.", stacklevel=2)
            skipped[str(path)] = problem
            continue
        if not used:
            reference = state
            sums = {k: v.to(torch.float64) for k, v in state.items() if v.is_floating_point()}
        else:
            _check_compatible(path, state, used[0], reference)
            for name, tensor in state.items():
                if tensor.is_floating_point():
                    sums[name] += tensor.to(torch.float64)
                elif not torch.equal(tensor, reference[name]):
                    raise ValueError(
                        f"Non-floating tensor {name!r} differs between {path} and {used[0]}; it cannot be averaged."
                    )
        used.append(path)
        progress.update(1)
    progress.close()

    if len(used) < (wanted if num_last is not None else 1):
        skipped_text = "; ".join(f"{p}: {why}" for p, why in skipped.items()) or "none"
        raise ValueError(
            f"Asked to average the last {wanted} checkpoints of "
            f"{run_dir if run_dir is not None else 'the given list'}, but found only {len(used)} valid "
            f"({', '.join(p.name for p in reversed(used)) or 'none'}). Skipped: {skipped_text}."
        )

    averaged = {
        name: (sums[name] / len(used)).to(tensor.dtype) if name in sums else tensor
        for name, tensor in reference.items()
    }
    newest = used[0]
    model = _load_with_weights(newest, averaged, model_class)
    if (output_dir / AVERAGING_RECORD_NAME).is_file():  # an earlier average: its scores, card and translations go too
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)

    tokenizer_source = _tokenizer_source([newest, run_dir])
    if tokenizer_source is None:
        where = f"{newest}" + (f" or {run_dir}" if run_dir else "")
        warnings.warn(f"No tokenizer files in {where}; {output_dir} has no tokenizer.", stacklevel=2)
    else:
        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(output_dir)

    result = AveragingResult(output_dir, list(reversed(used)), skipped, tokenizer_source)
    (output_dir / AVERAGING_RECORD_NAME).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result


# config.json fields that say how a checkpoint was saved, not what model it is
_BOOKKEEPING_FIELDS = frozenset({"transformers_version", "_name_or_path", "dtype", "torch_dtype", "auto_map",
                                 "custom_pipelines", "architectures"})  # fmt: skip


def _model_fields(path: Path) -> dict:
    """The fields of a checkpoint's config.json that define its model (not `_BOOKKEEPING_FIELDS`)."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return {k: v for k, v in config.items() if k not in _BOOKKEEPING_FIELDS}


def _check_compatible(path: Path, state: dict, reference_path: Path, reference: dict) -> None:
    """A ValueError unless `path` holds the model of `reference_path`: the same config fields (heads, the embedding
    scale and the like give the same shapes for other models) and the same tensors, shapes and dtypes."""
    fields, reference_fields = _model_fields(path), _model_fields(reference_path)
    differ = sorted(k for k in fields.keys() | reference_fields.keys() if fields.get(k) != reference_fields.get(k))
    if differ:
        shown = ", ".join(f"{k}: {fields.get(k)!r} against {reference_fields.get(k)!r}" for k in differ[:5])
        raise ValueError(f"{path} and {reference_path} are checkpoints of different models ({shown}); averaging them "
                         "would give the newest one's config to weights of both.")
    if state.keys() != reference.keys():
        missing = sorted(reference.keys() - state.keys())[:5]
        extra = sorted(state.keys() - reference.keys())[:5]
        raise ValueError(
            f"{path} and {reference_path} hold different tensors (missing in {path.name}: {missing}, "
            f"extra: {extra}); they are not checkpoints of the same model."
        )
    for name, tensor in state.items():
        if tensor.shape != reference[name].shape or tensor.dtype != reference[name].dtype:
            raise ValueError(
                f"Tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype} in {path} but "
                f"{tuple(reference[name].shape)} {reference[name].dtype} in {reference_path}."
            )


def _load_with_weights(checkpoint: Path, weights: dict[str, torch.Tensor], model_class=None):
    """The model of `checkpoint` (config, generation config, tying from `from_pretrained`) holding `weights`."""
    model = (model_class or AutoModelForSeq2SeqLM).from_pretrained(checkpoint)  # ours: registered by the package
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"{checkpoint}: tensors the model does not have: {sorted(unexpected)[:5]}.")
    # Keys absent from safetensors must be tied copies of loaded ones (e.g. lm_head.weight = shared embedding).
    params = model.state_dict()
    loaded = {params[name].data_ptr() for name in weights}
    untied = [name for name in missing if params[name].data_ptr() not in loaded]
    if untied:
        raise ValueError(f"{checkpoint}: {SAFE_WEIGHTS_NAME} lacks tensors of the model: {sorted(untied)[:5]}.")
    return model


def average_last_checkpoints(run_dir: str | os.PathLike, num_last: int) -> str:
    """Average the last ``num_last`` complete checkpoints of a training run into ``run_dir/averaged`` (all of them,
    with a warning, when the run has fewer) and return that folder."""
    available = [p for p in find_checkpoints(run_dir) if checkpoint_problem(p) is None]
    if not available:
        raise ValueError(f"average_last_checkpoints={num_last} but {run_dir} has no complete checkpoint.")
    if len(available) < num_last:
        logger.warning("average_last_checkpoints=%d but only %d checkpoint(s) exist (%s): averaging those.",
                       num_last, len(available), ", ".join(p.name for p in available))
        num_last = len(available)
    target = os.path.join(run_dir, "averaged")
    done = average_checkpoints(run_dir, num_last, target)
    logger.info("Averaged %s into %s", ", ".join(p.name for p in done.checkpoints), target)
    return target


# ---------------------------------------------------------------------------------------------- command line

_CLI_DESCRIPTION = """\
Average the last K checkpoints of a training run into a model folder that `from_pretrained` loads.

Paper (Section 6.1): the base models average the last 5 checkpoints, the big models the last 20.

    %(prog)s runs/base --num_last 5 --output_dir runs/base/averaged
    %(prog)s runs/base/checkpoint-90000 runs/base/checkpoint-100000 --output_dir avg    # these two

Incomplete checkpoints (no model.safetensors or trainer_state.json, or a file that does not load: a safetensors
file cut short, JSON that does not parse, a torch archive cut short) are skipped with a warning naming the file;
fewer valid checkpoints than --num_last is an error. See `vaswani_transformer.checkpoints.average_checkpoints`.
"""


def main(argv: list[str] | None = None) -> int:
    """Command line of checkpoint averaging (``scripts/average_checkpoints.py``, ``vaswani-average``)."""
    parser = cli.ArgumentParser(description=_CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkpoints", nargs="+",
        help="A run directory holding checkpoint-<step> folders, or several checkpoint folders.",
    )
    parser.add_argument(
        "--num_last", "--num-last", type=int, default=None,
        help=f"Number of newest valid checkpoints to average (default: {DEFAULT_NUM_LAST} of a run directory; every "
        "listed checkpoint folder, each of which must be valid; paper: 5 base, 20 big; 0 = all valid ones).",
    )
    parser.add_argument("--output_dir", "--output-dir", required=True, help="Folder for the averaged model.")
    args = parser.parse_args(argv)
    if args.num_last is None:  # folders named one by one are the ones wanted, each of them
        args.num_last = DEFAULT_NUM_LAST if len(args.checkpoints) == 1 else len(args.checkpoints)
    if args.num_last < 0:
        parser.error(f"--num_last must be >= 0, got {args.num_last}.")

    if problem := cli.output_path_problem(args.output_dir, "--output_dir", directory=True):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    source = args.checkpoints[0] if len(args.checkpoints) == 1 else args.checkpoints
    try:
        result = average_checkpoints(source, num_last=args.num_last or None, output_dir=args.output_dir)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Averaged {len(result.checkpoints)} checkpoints into {result.output_dir}:")
    print(json.dumps(result.to_dict(), indent=2))
    return 0


__all__ = [
    "AveragingResult",
    "MODEL_ONLY",
    "NOT_RESUMING",
    "UnsafePickleError",
    "average_checkpoints",
    "average_last_checkpoints",
    "checkpoint_problem",
    "checkpoint_step",
    "file_problem",
    "find_checkpoints",
    "find_last_complete_checkpoint",
    "main",
    "pickle_refusal_reason",
    "sharded_folder_problem",
    "resolve_resume_checkpoint",
    "load_trained_model",
    "weights_load_errors",
]


if __name__ == "__main__":  # python -m vaswani_transformer.checkpoints, as the console script
    sys.exit(main())
