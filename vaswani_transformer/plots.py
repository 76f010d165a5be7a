"""Every picture of a run: the positional encoding (Section 3.5), the learning-rate schedule of any recipe or run
(Section 5.3) and learning curves (loss and BLEU against updates and wall time) from ``trainer_state.json``.

The numbers behind each picture come from a function of their own (:func:`position_encoding`,
:func:`position_similarity`, :func:`learning_rate_schedule`, :func:`learning_curve`, :func:`learning_curve_by_time`);
the ``plot_*`` functions draw them and return the image's path. :func:`main` is ``scripts/plot_run.py``
(subcommands ``encoding``, ``schedule``, ``curves``).

matplotlib is imported only inside the drawing functions (``pip install matplotlib``, in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import cli
from .checkpoints import TRAINER_STATE_NAME
from .modeling_vaswani_transformer import SinusoidalPositionalEncoding
from .trainer import TRAINING_ARGS_JSON, paper_lr_scheduler, saved_callback_attributes

PathLike = str | os.PathLike
DPI = 100  # every picture: figure size in inches x 100 = pixels
ENCODING_FIGSIZE = (12.0, 5.0)  # 1200 x 500 pixels
SCHEDULE_FIGSIZE = (8.0, 4.5)  # 800 x 450
CURVE_FIGSIZE = (12.0, 4.5)  # 1200 x 450: against updates | against wall time
ENCODING_LAYOUTS = ("sinusoidal", "tensor2tensor")
CURVE_KEYS = ("loss", "learning_rate", "eval_loss", "eval_bleu", "test_bleu", "grad_norm", "elapsed_seconds")


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def picture_path(output: PathLike) -> Path:
    """The file matplotlib's ``savefig`` writes for ``output``: a name without an extension gets its default ".png"."""
    output = Path(output)
    return output if output.suffix else output.with_name(output.name + ".png")


def _save(fig, output: PathLike) -> str:
    """Write ``fig`` at :data:`DPI` (its exact size: no tight bounding box), close it and return the path written."""
    output = picture_path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=DPI)
    _pyplot().close(fig)
    return str(output)


# ------------------------------------------------------------------------------------- positional encoding


def position_encoding(length: int, d_model: int, layout: str = "sinusoidal") -> torch.Tensor:
    """The model's own positional encodings of positions 0..length-1, shape (length, d_model), as float64.

    Computed by the module the model runs (``SinusoidalPositionalEncoding``); ``layout`` is the config's
    ``position_encoding``: "sinusoidal" (the paper's formula) or "tensor2tensor" (the authors' code)."""
    if layout not in ENCODING_LAYOUTS:
        raise ValueError(f"Unknown positional encoding layout {layout!r}. Valid: {', '.join(ENCODING_LAYOUTS)}.")
    if length < 1 or d_model < 2 or (layout == "tensor2tensor" and d_model < 4):
        raise ValueError(f"Need length >= 1 and d_model >= 2 (4 for tensor2tensor), got {length} and {d_model}.")
    encoder = SinusoidalPositionalEncoding(d_model, layout=layout)
    return encoder(length, 0, torch.empty(0, dtype=torch.float64))


def position_similarity(encoding: torch.Tensor) -> torch.Tensor:
    """Dot products PE(pos) . PE(pos') of every pair of rows: sum_i cos((pos - pos') w_i), a function of the offset."""
    encoding = encoding.double()
    return encoding @ encoding.T


def plot_position_encoding(
    output: PathLike, d_model: int = 512, length: int = 100, layout: str = "sinusoidal"
) -> str:
    """Heat maps of the encoding (positions x dimensions) and of the positions' dot-product similarity."""
    encoding = position_encoding(length, d_model, layout)
    similarity = position_similarity(encoding)
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=ENCODING_FIGSIZE, gridspec_kw={"width_ratios": [1.3, 1]})
    shown, xlabel = encoding, "dimension i: sin | cos halves"
    if layout == "sinusoidal":  # interleaved sin/cos columns alias at screen resolution: drawn as two halves
        shown = torch.cat([encoding[:, 0::2], encoding[:, 1::2]], dim=1)
        xlabel = "column: the even dimensions 2i (sin), then the odd ones 2i+1 (cos)"
    image = left.imshow(shown.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    left.axvline((d_model + 1) // 2 - 0.5, color="black", linewidth=0.8)
    left.set(xlabel=xlabel, ylabel="position pos", title=f"PE(pos, i), d_model {d_model} ({layout} layout)")
    fig.colorbar(image, ax=left)
    image = right.imshow(similarity.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    right.set(xlabel="position pos'", ylabel="position pos",
              title="PE(pos) · PE(pos'): constant along each diagonal\n(a function of the offset pos - pos' only)")
    fig.colorbar(image, ax=right)
    fig.tight_layout()
    return _save(fig, output)


# ----------------------------------------------------------------------------------- learning-rate schedule


@dataclass
class LearningRateSchedule:
    """What sets a run's learning rates, read as the training job reads it (:func:`learning_rate_schedule`).

    ``lr_schedule`` "paper": ``lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``; "hf": transformers'
    ``lr_scheduler_type`` with ``learning_rate``. ``warmup`` is in updates (a ratio already resolved)."""

    lr_schedule: str
    d_model: int
    warmup: int
    max_steps: int
    lr_factor: float = 1.0
    learning_rate: float | None = None
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    stopped_at: int | None = None  # a finished run: the update it stopped at (a time budget may end it early)

    def rates(self, steps) -> list[float]:
        """The learning rate of each update number in ``steps`` (1-based), from the scheduler training builds."""
        param = torch.nn.Parameter(torch.zeros(1))
        if self.lr_schedule == "paper":
            optimizer = torch.optim.SGD([param], lr=1.0)
            scheduler = paper_lr_scheduler(optimizer, self.d_model, self.warmup, self.lr_factor)
        else:
            from transformers import get_scheduler

            optimizer = torch.optim.SGD([param], lr=self.learning_rate)
            scheduler = get_scheduler(self.lr_scheduler_type, optimizer=optimizer, num_warmup_steps=self.warmup,
                                      num_training_steps=self.max_steps,
                                      scheduler_specific_kwargs=self.lr_scheduler_kwargs)  # fmt: skip
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise ValueError(f"lr_scheduler_type {self.lr_scheduler_type!r} depends on the run (not a fixed function "
                             "of the update): it cannot be plotted ahead of training.")  # fmt: skip
        # Update n (1-based) trains with the rate after n - 1 scheduler steps.
        base, factor = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
        return [base * factor(n - 1) for n in steps]

    def peak(self) -> tuple[int, float]:
        """(update, rate) of the highest rate over updates 1..max_steps (the first one on a tie)."""
        rates = self.rates(range(1, self.max_steps + 1))
        best = max(range(len(rates)), key=rates.__getitem__)
        return best + 1, rates[best]

    def describe(self) -> str:
        """The schedule in one line (the paper's formula with this run's numbers)."""
        if self.lr_schedule == "paper":
            return f"lr = {self.lr_factor:g} * {self.d_model}^-0.5 * min(step^-0.5, step * {self.warmup}^-1.5)"
        return f"{self.lr_scheduler_type}, learning_rate {self.learning_rate:g}, warmup {self.warmup}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path}: not valid JSON ({error}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object.")
    return data


def _warmup_updates(warmup_steps: float, max_steps: int) -> int:
    """``TrainingArguments.get_warmup_steps``: a value below 1 is a fraction of the updates."""
    return int(warmup_steps) if warmup_steps >= 1 else math.ceil(max_steps * warmup_steps)


def _schedule_from_recipe(path: Path, max_steps: int | None) -> LearningRateSchedule:
    """Parse the recipe with the training job's own parser (preset defaults, flags; device-independent)."""
    from transformers import AutoConfig

    from .configuration_vaswani_transformer import VaswaniTransformerConfig
    from .train import parse_arguments, parse_config_overrides

    model_args, _, args = parse_arguments([str(path), "--use_cpu", "true"])  # no GPU needed to read a bf16 recipe
    overrides = parse_config_overrides(model_args.config_overrides)
    name = model_args.model_name_or_path or model_args.config_name
    # As train._load_model: a given model or config, else the preset with the recipe's overrides.
    config = AutoConfig.from_pretrained(name, **overrides) if name else VaswaniTransformerConfig.from_preset(
        model_args.preset, **overrides
    )
    steps = max_steps or args.max_steps
    if not steps or steps < 1:
        raise ValueError(f"{path}: the recipe trains for a number of epochs (max_steps is not set), so its number "
                         "of updates depends on the data: give max_steps (--max_steps) to plot the schedule.")
    if args.lr_decay_minutes:
        raise ValueError(f"{path}: lr_decay_minutes={args.lr_decay_minutes} places the decay by the clock, so its "
                         "updates depend on the machine: plot a finished run's folder instead.")
    scheduler_type = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)  # an enum in the arguments
    return LearningRateSchedule(
        lr_schedule=args.lr_schedule, d_model=config.d_model, warmup=args.get_warmup_steps(steps), max_steps=steps,
        lr_factor=args.lr_factor, learning_rate=args.learning_rate, lr_scheduler_type=str(scheduler_type),
        lr_scheduler_kwargs=dict(args.lr_scheduler_kwargs or {}), source=str(path),
    )


def _schedule_from_run(folder: Path, max_steps: int | None) -> LearningRateSchedule:
    """A training output folder: its arguments (``training_args.json``), model config and trainer state."""
    for name in (TRAINING_ARGS_JSON, "config.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} has no {name}: not a training output folder (training writes "
                                    f"{TRAINING_ARGS_JSON}, config.json and {TRAINER_STATE_NAME} at its end).")
    args = _read_json(folder / TRAINING_ARGS_JSON)
    d_model = _read_json(folder / "config.json").get("d_model")
    state = _read_json(folder / TRAINER_STATE_NAME) if (folder / TRAINER_STATE_NAME).is_file() else {}
    own = state.get("max_steps") or args.get("max_steps")
    if own and max_steps and max_steps != own:  # (a decaying schedule's shape depends on the total)
        raise ValueError(f"{folder} trained for {own} updates, with the schedule of that total: --max_steps "
                         f"{max_steps} would draw rates its optimizer never applied. Leave --max_steps out.")
    steps = own or max_steps
    if not steps or steps < 1 or not d_model:
        raise ValueError(f"{folder}: cannot tell the run's number of updates or d_model; give --max_steps.")
    kwargs = dict(args.get("lr_scheduler_kwargs") or {})
    if args.get("lr_decay_minutes"):  # the clock placed the decay: warmup_stable_decay with its recorded numbers
        placed = saved_callback_attributes(state.get("stateful_callbacks"), "TimeBudgetCallback").get("placed")
        if placed:
            steps, kwargs["num_decay_steps"] = placed["decay_start"] + placed["decay_steps"], placed["decay_steps"]
        else:  # stopped before its decay began: the peak held
            steps, kwargs["num_decay_steps"] = state.get("global_step") or steps, 0
    return LearningRateSchedule(
        lr_schedule=args.get("lr_schedule", "paper"), d_model=int(d_model),
        warmup=_warmup_updates(float(args.get("warmup_steps", 0)), steps), max_steps=int(steps),
        lr_factor=float(args.get("lr_factor", 1.0)), learning_rate=args.get("learning_rate"),
        lr_scheduler_type=str(args.get("lr_scheduler_type", "linear")),
        lr_scheduler_kwargs=kwargs, source=str(folder), stopped_at=state.get("global_step") or None,
    )  # fmt: skip


def learning_rate_schedule(recipe_or_run: PathLike, max_steps: int | None = None) -> LearningRateSchedule:
    """The schedule of a recipe (``configs/*.yaml``, read by ``train.parse_arguments`` with the preset's training
    defaults) or of a training output folder (its ``training_args.json``, ``config.json``, ``trainer_state.json``).
    ``max_steps`` overrides a recipe's number of updates (needed for an epoch-based recipe); a run's is its own."""
    path = Path(recipe_or_run)
    if path.is_dir():
        return _schedule_from_run(path, max_steps)
    if not path.exists():
        raise FileNotFoundError(f"Recipe file or training output folder not found: {path}")
    return _schedule_from_recipe(path, max_steps)


def _plot_steps(max_steps: int, peak_step: int) -> list[int]:
    """About 2,000 updates spread over the run, plus the peak (so the drawn maximum is the true one)."""
    stride = max(1, max_steps // 2000)
    return sorted(set(range(1, max_steps + 1, stride)) | {peak_step, max_steps})


def plot_learning_rate_schedule(schedules, output: PathLike, title: str | None = None) -> str:
    """The learning rate against updates of one or more :class:`LearningRateSchedule` (or recipe / run paths),
    each with its peak marked and annotated (update and rate)."""
    if isinstance(schedules, (LearningRateSchedule, str, os.PathLike)):
        schedules = [schedules]
    schedules = [s if isinstance(s, LearningRateSchedule) else learning_rate_schedule(s) for s in schedules]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SCHEDULE_FIGSIZE)
    peaks = [schedule.peak() for schedule in schedules]
    for schedule, (peak_step, peak_rate) in zip(schedules, peaks):
        steps = _plot_steps(schedule.max_steps, peak_step)
        label = (f"d_model {schedule.d_model}, warmup {schedule.warmup}, factor {schedule.lr_factor:g}"
                 if schedule.lr_schedule == "paper" else schedule.describe())  # fmt: skip
        label = f"{Path(schedule.source).name}: {label}" if schedule.source else label
        (line,) = ax.plot(steps, schedule.rates(steps), label=label)
        ax.plot([peak_step], [peak_rate], "o", color=line.get_color())
        ax.annotate(f"peak {peak_rate:.3e} at update {peak_step:,}", (peak_step, peak_rate), xytext=(8, 4),
                    textcoords="offset points", color=line.get_color())  # fmt: skip
        if schedule.stopped_at and schedule.stopped_at < schedule.max_steps:
            ax.axvline(schedule.stopped_at, color=line.get_color(), linestyle=":",
                       label=f"run stopped at update {schedule.stopped_at:,}")  # fmt: skip
    ax.set(xlabel="update", ylabel="learning rate")
    ax.set_ylim(0, 1.15 * max(rate for _, rate in peaks))  # room for the annotations
    paper = "lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)"
    if any(s.lr_schedule == "paper" for s in schedules):
        title = f"{title}\n{paper}" if title else paper
    ax.set_title(title or "learning-rate schedule")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    return _save(fig, output)


def plot_lr_schedule(
    output: PathLike,
    d_model: int = 512,
    warmup_steps: int = 4000,
    total_steps: int = 100_000,
    factors: tuple[float, ...] = (1.0,),
) -> str:
    """The paper's learning rate (equation 3) against updates for one or more ``lr_factor`` values."""
    schedules = [LearningRateSchedule("paper", d_model, warmup_steps, total_steps, lr_factor=f) for f in factors]
    return plot_learning_rate_schedule(schedules, output, title=f"the paper's schedule, d_model {d_model}")


# ------------------------------------------------------------------------------------------ learning curves


def _log_history(trainer_state: PathLike) -> tuple[Path, list[dict]]:
    path = Path(trainer_state)
    if path.is_dir():
        path = path / TRAINER_STATE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"No {TRAINER_STATE_NAME} at {path}: not a training output or checkpoint folder "
                                "(the Trainer writes it at the end of training and into every checkpoint).")
    history = _read_json(path).get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: no 'log_history' list (not a Trainer state file?).")
    return path, [entry for entry in history if isinstance(entry, dict)]


def learning_curve(trainer_state: PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "eval_loss": [...], "eval_bleu": [...], ...}`` from a run's log history
    (also ``"elapsed_seconds"``: the training wall time at each logged update, see ``TrainingTotalsCallback``).

    ``trainer_state`` is a ``trainer_state.json`` file or a folder (run or checkpoint) holding one."""
    _, history = _log_history(trainer_state)
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in history:
        step = entry.get("step")
        for key in CURVE_KEYS:
            if entry.get(key) is not None and step is not None:
                curves.setdefault(key, []).append((int(step), float(entry[key])))
    return curves


def learning_curve_by_time(trainer_state: PathLike) -> dict[str, list[tuple[float, float]]]:
    """The same curves against training wall time: ``{"loss": [(seconds, value), ...], ...}`` from the entries
    that record ``elapsed_seconds`` (empty for runs that did not log it)."""
    _, history = _log_history(trainer_state)
    curves: dict[str, list[tuple[float, float]]] = {}
    for entry in history:
        seconds = entry.get("elapsed_seconds")
        for key in CURVE_KEYS[:-1]:
            if entry.get(key) is not None and seconds is not None:
                curves.setdefault(key, []).append((float(seconds), float(entry[key])))
    return curves


def _draw_curves(ax, curves: dict[str, list], xlabel: str, scale: float = 1.0) -> None:
    """Losses on ``ax``, BLEU on a second y axis; x values divided by ``scale``."""

    def xy(points):
        return [x / scale for x, _ in points], [y for _, y in points]

    handles = ax.plot(*xy(curves["loss"]), label="training loss (label-smoothed)")
    if "eval_loss" in curves:
        handles += ax.plot(*xy(curves["eval_loss"]), "o-", label="validation loss (label-smoothed)")
    ax.set(xlabel=xlabel, ylabel="loss")
    if "eval_bleu" in curves:
        bleu = ax.twinx()
        handles += bleu.plot(*xy(curves["eval_bleu"]), "s-", color="tab:green", label="validation BLEU")
        bleu.set_ylabel("BLEU")
        bleu.set_ylim(0, max(1.0, 1.1 * max(y for _, y in curves["eval_bleu"])))
    ax.legend(handles=handles, loc="upper right", fontsize="small")


def plot_learning_curve(
    trainer_state: PathLike, output: PathLike, title: str | None = None, extra: dict[str, Any] | None = None
) -> str:
    """Training loss, validation loss and validation BLEU (when logged) against updates (left) and training wall
    time (right), saved as an image; returns its path. ``extra``: ``{"label": value}`` lines printed in the plot."""
    path, _ = _log_history(trainer_state)
    curves, timed = learning_curve(path), learning_curve_by_time(path)
    if "loss" not in curves:
        raise ValueError(f"{path}: no training loss was logged.")
    plt = _pyplot()
    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=CURVE_FIGSIZE)
    _draw_curves(by_update, curves, "update")
    if "loss" in timed:
        longest = max(x for points in timed.values() for x, _ in points)
        unit, scale = ("hours", 3600.0) if longest > 7200 else ("minutes", 60.0) if longest > 120 else ("seconds", 1.0)
        _draw_curves(by_time, timed, f"training wall time ({unit})", scale)
    else:
        by_time.text(0.5, 0.5, "no wall time in this run's log\n(elapsed_seconds)", ha="center", va="center",
                     transform=by_time.transAxes)  # fmt: skip
        by_time.set_axis_off()
    if extra:
        by_update.text(0.02, 0.02, "\n".join(f"{k}: {v}" for k, v in extra.items()), transform=by_update.transAxes,
                       va="bottom")  # fmt: skip
    fig.suptitle(title or path.parent.name)
    fig.tight_layout()
    return _save(fig, output)


# ----------------------------------------------------------------------------------------------- command line

CLI_DESCRIPTION = """Pictures of the model and of a training run (vaswani_transformer.plots): PNG, or any format
matplotlib writes (.pdf, .svg ...); a name without an extension gets .png.

    %(prog)s encoding --d_model 512 --length 100 --output encoding.png
    %(prog)s schedule configs/wmt14_en_de_base.yaml --output schedule.png     (a recipe, or a training output folder)
    %(prog)s curves runs/quickstart --output curves.png                      (a run or checkpoint folder)
"""


def _output_problem(output: str) -> str | None:
    """Why ``--output`` cannot take a picture, or None; checked before any drawing. A folder is refused (also one
    named by a trailing separator), and so is an extension matplotlib cannot write; a name without one gets ".png"
    (``picture_path``), and that file must be writable (``cli.output_path_problem``)."""
    from matplotlib.backend_bases import FigureCanvasBase

    if output.endswith(("/", os.sep)):
        return f"--output {output} names a folder; give a file name such as {Path(output) / 'picture.png'}."
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(output).suffix.lower().lstrip(".")
    if suffix and suffix not in formats:
        return (f"--output {output}: matplotlib cannot write .{suffix} files; end the name in one of "
                f"{', '.join('.' + f for f in sorted(formats))} (no extension: .png).")  # fmt: skip
    for path in dict.fromkeys((Path(output), picture_path(output))):  # the name given, the file written
        if problem := cli.output_path_problem(path, "--output"):
            return problem
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(description=CLI_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{encoding,schedule,curves}")
    encoding = commands.add_parser("encoding", help="the sinusoidal positional encoding and its position similarity")
    encoding.add_argument("--d_model", "--d-model", type=cli.positive_int, default=512, help="Width (default 512).")
    encoding.add_argument("--length", type=cli.positive_int, default=100, help="Positions (default 100).")
    encoding.add_argument("--layout", choices=ENCODING_LAYOUTS, default="sinusoidal",
                          help="The config's position_encoding (default: sinusoidal, the paper's).")  # fmt: skip
    schedule = commands.add_parser("schedule", help="the learning-rate schedule of a recipe or a training run")
    schedule.add_argument("recipe_or_run", help="A recipe (configs/*.yaml) or a training output folder.")
    schedule.add_argument("--max_steps", "--max-steps", type=cli.positive_int,
                          help="A recipe's updates to plot (default: its max_steps; needed for an epoch-based "
                               "recipe); a run is drawn with its own.")  # fmt: skip
    curves = commands.add_parser("curves", help="learning curves of a run against updates and wall time")
    curves.add_argument("run", help="A training output or checkpoint folder (or its trainer_state.json).")
    curves.add_argument("--title", help="Title (default: the run folder's name).")
    for sub in (encoding, schedule, curves):
        sub.add_argument("--output", "-o", help="Picture file to write (required; .png, or .pdf, .svg ...: "
                         "matplotlib's formats; no extension: .png added).")  # checked after unknown options
        sub.set_defaults(command_parser=sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``scripts/plot_run.py``: exit status 0; 1 with one error line for a missing or unusable input."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # the did-you-mean of the chosen subcommand's options
        args.command_parser.error(cli.unknown_arguments_message(args.command_parser, extras))
    if args.output is None:
        args.command_parser.error("the following argument is required: --output/-o")
    if problem := _output_problem(args.output):
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        if args.command == "encoding":
            written = plot_position_encoding(args.output, args.d_model, args.length, args.layout)
        elif args.command == "schedule":
            schedule = learning_rate_schedule(args.recipe_or_run, args.max_steps)
            written = plot_learning_rate_schedule(schedule, args.output)
            peak_step, peak_rate = schedule.peak()
            print(f"Peak learning rate {peak_rate:.6g} at update {peak_step} ({schedule.describe()})")
        else:
            written = plot_learning_curve(args.run, args.output, title=args.title)
    except (OSError, ValueError) as error:  # a missing file, a recipe the training job refuses, an unreadable model
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Wrote {written}")
    return 0


__all__ = [
    "LearningRateSchedule",
    "learning_curve",
    "learning_curve_by_time",
    "learning_rate_schedule",
    "main",
    "picture_path",
    "plot_learning_curve",
    "plot_learning_rate_schedule",
    "plot_lr_schedule",
    "plot_position_encoding",
    "position_encoding",
    "position_similarity",
]


if __name__ == "__main__":  # python -m vaswani_transformer.plots, as the console script
    sys.exit(main())
