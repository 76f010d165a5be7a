"""Every picture: the paper's learning-rate schedule and learning curves from ``trainer_state.json``.

matplotlib is imported only inside the plotting functions (``pip install matplotlib``, in the ``dev`` extra).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .checkpoints import TRAINER_STATE_NAME
from .trainer import paper_learning_rate


def learning_curve(trainer_state: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "eval_loss": [...], "eval_bleu": [...], ...}`` from a run's log history.

    ``trainer_state`` is a ``trainer_state.json`` file or a folder (run or checkpoint) holding one.
    """
    path = Path(trainer_state)
    if path.is_dir():
        path = path / TRAINER_STATE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"No {TRAINER_STATE_NAME} at {path}.")
    history = json.loads(path.read_text(encoding="utf-8")).get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"{path}: no 'log_history' list (not a Trainer state file?).")
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in history:
        step = entry.get("step")
        for key in ("loss", "learning_rate", "eval_loss", "eval_bleu", "test_bleu", "grad_norm"):
            if key in entry and step is not None:
                curves.setdefault(key, []).append((int(step), float(entry[key])))
    return curves


def plot_learning_curve(
    trainer_state: str | os.PathLike, output: str | os.PathLike, title: str | None = None, extra: dict[str, Any] | None = None
) -> str:
    """Training loss (and validation loss / BLEU when logged) against updates, saved as an image; returns its path.

    ``extra`` may give ``{"label": value}`` lines to print in the plot (e.g. the final test BLEU).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = learning_curve(trainer_state)
    if "loss" not in curves:
        raise ValueError(f"{trainer_state}: no training loss was logged.")
    fig, ax = plt.subplots(figsize=(7, 4))
    steps, values = zip(*curves["loss"])
    ax.plot(steps, values, label="training loss (label-smoothed)")
    if "eval_loss" in curves:
        ax.plot(*zip(*curves["eval_loss"]), "o-", label="validation loss")
    ax.set_xlabel("update")
    ax.set_ylabel("loss")
    if "eval_bleu" in curves:
        ax2 = ax.twinx()
        ax2.plot(*zip(*curves["eval_bleu"]), "s-", color="tab:green", label="validation BLEU")
        ax2.set_ylabel("BLEU")
        ax2.legend(loc="center right")
    ax.legend(loc="upper right")
    if extra:
        ax.text(0.02, 0.02, "\n".join(f"{k}: {v}" for k, v in extra.items()), transform=ax.transAxes, va="bottom")
    ax.set_title(title or Path(trainer_state).name)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return str(output)


def plot_lr_schedule(
    output: str | os.PathLike,
    d_model: int = 512,
    warmup_steps: int = 4000,
    total_steps: int = 100_000,
    factors: tuple[float, ...] = (1.0,),
) -> str:
    """The paper's learning rate (equation 3) against updates for one or more ``lr_factor`` values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(1, total_steps + 1, max(1, total_steps // 2000)))
    fig, ax = plt.subplots(figsize=(7, 4))
    for factor in factors:
        ax.plot(steps, [paper_learning_rate(s, d_model, warmup_steps, factor) for s in steps], label=f"factor {factor}")
    ax.axvline(warmup_steps, color="gray", linestyle=":", label=f"warmup {warmup_steps}")
    ax.set_xlabel("update")
    ax.set_ylabel("learning rate")
    ax.set_title(f"lrate = factor * {d_model}^-0.5 * min(step^-0.5, step * {warmup_steps}^-1.5)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return str(output)


__all__ = ["learning_curve", "plot_learning_curve", "plot_lr_schedule"]
