"""A wheel installed like a PyPI release (not editable) is a complete product outside the checkout: its console
commands answer --help, and the quickstart trains, writes its model card and translates."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
CONSOLE_COMMANDS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"])
# The quickstart recipe made tiny: 200 training pairs, 4 updates of a 1+1-layer model, 2 checkpoints averaged.
TINY_QUICKSTART = [
    "--synthetic_train_size", "200", "--synthetic_eval_size", "8", "--max_steps", "4", "--save_steps", "2",
    "--warmup_steps", "2", "--average_last_checkpoints", "2", "--eval_strategy", "no", "--logging_steps", "2",
    "--tokenizer_vocab_size", "300", "--max_tokens_per_batch", "512", "--num_translation_examples", "1",
    "--config_overrides", "d_model=32,d_ff=64,num_heads=2,encoder_layers=1,decoder_layers=1", "--disable_tqdm", "true",
]  # fmt: skip


# In the venv: each console script's entry point (as the installed metadata names it) called with --help, as its
# script would be (argv[0] the script); prints {command: what it wrote} as JSON.
HELP_OF_EVERY_ENTRY_POINT = """
import contextlib, io, json, sys
from importlib.metadata import distribution
usages = {}
for entry in distribution("vaswani-transformer").entry_points.select(group="console_scripts"):
    sys.argv = [sys.argv[1] + "/" + entry.name, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        entry.load()()
    usages[entry.name] = out.getvalue()
print(json.dumps(usages))
"""


def run(command, cwd, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(list(map(str, command)), cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          **kwargs)  # fmt: skip
    assert done.returncode == 0, f"{command}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_wheel_install_trains_and_writes_its_model_card(tmp_path):
    # Build the wheel from a copy of the sources (the checkout stays untouched: no build/ folder in it).
    source = tmp_path / "source"
    shutil.copytree(REPO / "vaswani_transformer", source / "vaswani_transformer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
         source], cwd=tmp_path)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("vaswani_transformer-*.whl")

    # A venv that sees the installed torch, transformers, ... but gets this package only from the wheel.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=tmp_path)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "-q", wheel], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"  # outside the checkout: nothing can come from it
    elsewhere.mkdir()
    probe = run([python, "-c", "import json, vaswani_transformer as v; from vaswani_transformer import card, evaluation;"
                 "print(json.dumps([v.__file__, str(card.DEFAULT_TEMPLATE), evaluation.paper_bleu_path()]))"],
                cwd=elsewhere)  # fmt: skip
    package, template, metric = map(Path, json.loads(probe.stdout.strip().splitlines()[-1]))
    assert package.is_relative_to(venv) and template.is_relative_to(venv) and metric.is_relative_to(venv)
    assert template.is_file() and metric.is_file()

    # Every console command of [project.scripts] is installed next to the venv's python, and its entry point answers
    # --help (all in one process of the venv: a process each cost ~3 s of imports; vaswani-train and
    # vaswani-translate run as commands below).
    assert {"vaswani-train", "vaswani-average", "vaswani-translate", "vaswani-evaluate", "vaswani-push",
            "vaswani-train-tokenizer"} <= set(CONSOLE_COMMANDS)  # fmt: skip
    for command in CONSOLE_COMMANDS:
        assert os.access(python.parent / command, os.X_OK), command
    done = run([python, "-c", HELP_OF_EVERY_ENTRY_POINT, python.parent], cwd=elsewhere)
    usages = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(usages) == CONSOLE_COMMANDS
    for command, usage in usages.items():
        assert usage.startswith(f"usage: {command} "), (command, usage[:300])

    # The quickstart, tiny, through the installed `vaswani-train`; it ends by writing the card.
    run([python.parent / "vaswani-train", REPO / "configs" / "quickstart.yaml", "--output_dir", elsewhere / "run",
         *TINY_QUICKSTART], cwd=elsewhere)  # fmt: skip
    card = (elsewhere / "run" / "README.md").read_text(encoding="utf-8")
    assert "## Evaluation" in card and "| updates (optimizer steps) | 4 |" in card
    assert (elsewhere / "run" / "averaged" / "model.safetensors").is_file()
    # ... and its averaged model translates with the installed `vaswani-translate`, one line per line.
    done = run([python.parent / "vaswani-translate", "--model_name_or_path", elsewhere / "run" / "averaged",
                "--no_progress"], cwd=elsewhere, input="4821\n\n2026\n")  # fmt: skip
    assert done.stdout.count("\n") == 3 and done.stdout.split("\n")[1] == ""
