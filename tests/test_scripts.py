"""Every command line in scripts/ answers `--help` (a real subprocess, as a newcomer runs it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path.name for path in (REPO / "scripts").glob("*.py"))


def test_every_script_is_covered():
    assert {"train.py", "evaluate_model.py", "translate.py", "average_checkpoints.py", "push_to_hub.py",
            "train_tokenizer.py"} <= set(SCRIPTS)
    assert "evaluate.py" not in SCRIPTS  # it would shadow the `evaluate` library for scripts in this folder


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_with_a_usage_line(script, tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--help"], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} "), done.stdout[:500]
    assert "Traceback" not in done.stderr
    if script == "train.py":  # its first argument may be a recipe: the usage line and examples say so
        assert done.stdout.startswith("usage: train.py [RECIPE.yaml] [--option VALUE ...]")
        assert "accelerate launch --cpu --num_processes 1 scripts/train.py configs/multi30k_cpu.yaml" in done.stdout
        assert "included). (default: 4096)" in done.stdout  # options still show their defaults
