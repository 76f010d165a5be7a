"""Every command line in scripts/ answers `--help` (a real subprocess, as a newcomer runs it: one for all the scripts,
each run as `python scripts/NAME.py --help` runs it, since a process each spent ~5 s importing the same libraries)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path.name for path in (REPO / "scripts").glob("*.py"))
# Each script as its file run as __main__ with argv [path, "--help"] and the scripts folder first on sys.path, as
# `python scripts/NAME.py --help` has them; prints {name: {"code", "stdout", "stderr"}} as JSON.
RUN_EACH_WITH_HELP = """
import contextlib, io, json, runpy, sys, traceback
folder, names = sys.argv[1], sys.argv[2:]
sys.path.insert(0, folder)
results = {}
for name in names:
    sys.argv = [f"{folder}/{name}", "--help"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            code = 1
            traceback.print_exc()
    results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", RUN_EACH_WITH_HELP, str(REPO / "scripts"), *SCRIPTS], capture_output=True, text=True,
        cwd=tmp_path_factory.mktemp("cwd"), env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_script_is_covered():
    assert {"train.py", "evaluate_model.py", "translate.py", "average_checkpoints.py", "push_to_hub.py",
            "train_tokenizer.py"} <= set(SCRIPTS)
    assert "evaluate.py" not in SCRIPTS  # it would shadow the `evaluate` library for scripts in this folder


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_with_a_usage_line(script, helps):
    done = helps[script]
    assert done["code"] == 0, done["stderr"]
    assert done["stdout"].startswith(f"usage: {script} "), done["stdout"][:500]
    assert "Traceback" not in done["stderr"]
    if script == "train.py":  # its first argument may be a recipe: the usage line and examples say so
        assert done["stdout"].startswith("usage: train.py [RECIPE.yaml] [--option VALUE ...]")
        assert "accelerate launch --cpu --num_processes 1 scripts/train.py configs/multi30k_cpu.yaml" in done["stdout"]
        assert "included). (default: 4096)" in done["stdout"]  # options still show their defaults
