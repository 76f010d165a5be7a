"""Faults in real training processes: SIGKILL (also while a checkpoint is being written), a diverging learning rate,
a full disk or a file size limit while saving. Every faulty run is `scripts/train.py` in a subprocess on the tiny
fixture; the runs they resume from run in this process (`run_from_args`, the same job), the uninterrupted run that
the kill-and-resume test compares losses with in a subprocess too."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_training import SCRIPT, losses, tiny_args, write_fixture
from vaswani_transformer.checkpoints import checkpoint_problem, find_last_complete_checkpoint
from vaswani_transformer.train import run_from_args

REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # this checkout first
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1", "PYTHONPATH": PYTHONPATH}  # fmt: skip
STEPS, EVERY = 24, 4  # 24 updates, a checkpoint every 4
COMMON = ["--max_steps", str(STEPS), "--save_steps", str(EVERY)]


def train(args: list[str], prefix: list[str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python scripts/train.py args` (or `python -c prefix[0] args`: the same script under a preamble)."""
    command = [sys.executable, *(prefix or [str(SCRIPT)]), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip


def kill_when(proc: subprocess.Popen, ready, what: str, timeout: float = 240) -> None:
    """SIGKILL `proc` as soon as `ready()` is true (polled every millisecond)."""
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def kill_while_writing(proc: subprocess.Popen, checkpoint: Path) -> None:
    """SIGKILL as soon as the first file of `checkpoint` appears (the Trainer writes trainer_state.json last)."""
    kill_when(proc, lambda: checkpoint.is_dir() and any(checkpoint.iterdir()), f"{checkpoint.name} appeared")


def kill_after_updates(proc: subprocess.Popen, n: int) -> None:
    """SIGKILL once the run has logged the loss of `n` more updates (logging_steps 1: one `{'loss': ...}` line each)."""
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("{'loss'")
        if seen == n:
            break
    assert seen == n, f"the run ended after {seen} updates"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume_matches_the_uninterrupted_run(tmp_path):
    """One run killed three times - while writing checkpoint-8, after some updates, while writing checkpoint-20 - and
    resumed with `--resume_from_checkpoint latest` each time: each resume starts at the last complete checkpoint, the
    half-written ones are moved aside (and never count among the 3 that `save_total_limit` keeps), the logged loss of
    every update equals the uninterrupted run's, and the totals are the uninterrupted run's, with only the updates after
    the last checkpoint counted as this run's."""
    data = write_fixture(tmp_path / "data")
    limit = ["--save_total_limit", "3"]
    # the uninterrupted run, in a process of its own as the resumed runs are: in the test worker's process, the state
    # earlier tests left there once changed its losses in the last bits (CI on a Zen 4, float32 on MKL's product)
    reference = train(tiny_args(data, tmp_path / "ref", *COMMON, *limit))
    assert reference.returncode == 0, reference.stderr[-4000:]
    expected = losses(tmp_path / "ref" / "trainer_state.json")
    assert sorted(expected) == list(range(1, STEPS + 1))

    out = tmp_path / "run"
    args = tiny_args(data, out, *COMMON, *limit, "--resume_from_checkpoint", "latest")
    half_written = []

    def resume_and_kill(kill) -> str | None:
        """Start (or resume) the run, kill it; return the checkpoint the next resume must start from."""
        proc = start(args)
        kill(proc)
        assert proc.returncode == -signal.SIGKILL
        return find_last_complete_checkpoint(out, quarantine=False)

    # 1. killed while checkpoint-8 is being written: it is incomplete, checkpoint-4 is the one to resume from
    last = resume_and_kill(lambda p: kill_while_writing(p, out / "checkpoint-8"))
    assert checkpoint_problem(out / "checkpoint-8", for_resume=True) is not None, "killed after the write ended"
    assert last == str(out / "checkpoint-4")
    half_written.append("checkpoint-8")
    # 2. resumed from checkpoint-4 (checkpoint-8 moved aside), killed after 9 more updates (update 13 or a bit later)
    last = resume_and_kill(lambda p: kill_after_updates(p, 9))
    assert (out / "incomplete-checkpoint-8").is_dir()
    assert int(last.rsplit("-", 1)[1]) >= 12
    # 3. resumed from there, killed while checkpoint-20 is being written
    last = resume_and_kill(lambda p: kill_while_writing(p, out / "checkpoint-20"))
    assert checkpoint_problem(out / "checkpoint-20", for_resume=True) is not None, "killed after the write ended"
    assert last == str(out / "checkpoint-16")
    half_written.append("checkpoint-20")
    # 4. resumed from checkpoint-16 to the end
    finished = train(args)
    assert finished.returncode == 0, finished.stderr[-4000:]
    assert "checkpoint-20 is incomplete" in finished.stderr
    for name in half_written:  # moved aside, never resumed from or averaged
        assert (out / f"incomplete-{name}").is_dir()
    assert [p.name for p in sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))] == [
        f"checkpoint-{s}" for s in range(STEPS - 2 * EVERY, STEPS + 1, EVERY)
    ]
    got = losses(out / "trainer_state.json")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(expected[step], abs=1e-6), (step, got[step], expected[step])
    # it resumed (a run from scratch with the same seed gives the same losses): the last run trained only the updates
    # after checkpoint-16, and the totals are the uninterrupted run's
    summary = json.loads((out / "training_summary.json").read_text())["summary"]
    totals = json.loads((tmp_path / "ref" / "training_summary.json").read_text())["summary"]
    assert summary["updates_this_run"] == STEPS - 16
    keys = ("updates", "target_tokens_seen", "source_tokens_seen")
    assert {k: summary[k] for k in keys} == {k: totals[k] for k in keys}


def stopped_with(error: str, last_line: str) -> str:
    """The message of the CLI's one error line (`train.py: error: ...`) a run stopped with on `error` (the name of the
    exception, for the reader: the command line prints no traceback); empty for another line."""
    found = re.match(r"train\.py: error: (.*)", last_line)
    return found.group(1) if found else ""


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_absurd_learning_rate_stops_naming_the_update_and_the_last_checkpoint_stays_good(tmp_path):
    """Resumed from checkpoint-4 with a peak rate 1e30 times too high, the weights blow up within a few updates (the
    rate of update 5 is the restored optimizer's, the absurd one applies from update 6): the
    run stops naming the first update whose loss is not finite (the one after the last loss it logged) and
    checkpoint-4, writes no checkpoint of the blown-up weights, and checkpoint-4 is byte for byte what it was,
    complete, and loads with finite logits."""
    from vaswani_transformer import VaswaniTransformerForConditionalGeneration

    data = write_fixture(tmp_path / "data", n_train=100)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "4", "--save_steps", "4"))
    before = digest(out / "checkpoint-4")

    diverged = train(tiny_args(data, out, "--max_steps", "8", "--save_steps", "4", "--resume_from_checkpoint",
                               "latest", "--lr_factor", "1e30"))  # fmt: skip
    assert diverged.returncode != 0
    logged = sum(line.startswith("{'loss'") for line in diverged.stdout.splitlines())  # updates 5, 6, ... finite
    last_line = diverged.stderr.strip().splitlines()[-1]
    assert stopped_with("NonFiniteLossError", last_line).startswith("Non-finite loss"), last_line
    assert "Traceback" not in diverged.stderr
    assert logged >= 1 and f"at update {4 + logged + 1}:" in last_line, (logged, last_line)
    assert f"The last checkpoint, {out / 'checkpoint-4'}, is from before this update" in last_line
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    assert checkpoint_problem(out / "checkpoint-4", for_resume=True) is None
    assert digest(out / "checkpoint-4") == before
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(out / "checkpoint-4").eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[1, 5, 6]])).logits
    assert torch.isfinite(logits).all()


def checkpoints_of(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))


def assert_stopped_naming_the_file(result: subprocess.CompletedProcess, reason: str, folder: Path) -> str:
    """The run failed with one CheckpointWriteError line naming a file of `folder`; returns that line."""
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert stopped_with("CheckpointWriteError", last_line), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"{reason} while writing {folder}{os.sep}" in last_line, last_line
    assert "enforce fail" not in last_line
    return last_line


@pytest.mark.slow
def test_full_disk_while_saving_names_the_file_and_keeps_earlier_checkpoints(tmp_path):
    """Output on a tmpfs of 2.5 checkpoints (measured on a first run: the checkpoints carry the model's code): 2 and 4
    fit, checkpoint-6 does not. The run stops with "no space left on device while writing <file of checkpoint-6>",
    removes the half-written checkpoint-6, and checkpoints 2 and 4 are unchanged and complete."""
    data = write_fixture(tmp_path / "data", n_train=100)
    run_from_args(tiny_args(data, tmp_path / "probe", "--max_steps", "2", "--save_steps", "2"))
    files = [path for path in (tmp_path / "probe" / "checkpoint-2").rglob("*") if path.is_file()]
    checkpoint = sum(-(-path.stat().st_size // 4096) * 4096 for path in files)  # tmpfs counts whole pages
    mount = tmp_path / "small"
    mount.mkdir()
    size = f"size={checkpoint * 5 // 2 // 1024 + 64}k"  # and 64 kB for the run's tokenizer
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(mount)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the file size limit test covers the path")
    try:
        out = mount / "out"
        result = train(tiny_args(data, out, "--max_steps", "10", "--save_steps", "2"))
        line = assert_stopped_naming_the_file(result, "no space left on device", out / "checkpoint-6")
        assert f"the last complete one is {out / 'checkpoint-4'}" in line
        assert checkpoints_of(out) == ["checkpoint-2", "checkpoint-4"]
        for name in ("checkpoint-2", "checkpoint-4"):
            assert checkpoint_problem(out / name, for_resume=True) is None
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# The same script with a file size limit: a write past it fails with EFBIG (SIGXFSZ ignored, as a shell's ulimit -f
# with a trapped signal does) - the same failing-write path as a full disk, without a mount.
FILE_SIZE_LIMIT = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_file_size_limit_while_saving_names_the_file_and_keeps_earlier_checkpoints(tmp_path):
    """checkpoint-2 is written without a limit; the run resumed under a 200 kB file size limit cannot write
    checkpoint-4's optimizer.pt (283 kB): it stops naming that file, removes checkpoint-4, keeps checkpoint-2."""
    data = write_fixture(tmp_path / "data", n_train=100)
    out = tmp_path / "out"
    run_from_args(tiny_args(data, out, "--max_steps", "2", "--save_steps", "2"))
    before = digest(out / "checkpoint-2")
    limited = train(tiny_args(data, out, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", "latest"),
                    prefix=["-c", FILE_SIZE_LIMIT.format(script=str(SCRIPT))])  # fmt: skip
    reason = "file too large (the process's file size limit)"
    line = assert_stopped_naming_the_file(limited, reason, out / "checkpoint-4")
    assert f"while writing {out / 'checkpoint-4' / 'optimizer.pt'}" in line
    assert f"the last complete one is {out / 'checkpoint-2'}" in line
    assert checkpoints_of(out) == ["checkpoint-2"] and digest(out / "checkpoint-2") == before
    assert checkpoint_problem(out / "checkpoint-2", for_resume=True) is None


# Real errors of the three savers past a 4 kB file size limit, classified by `write_failure` (in a child process).
THREE_SAVERS = """
import json, os, resource, signal, sys
import torch
from safetensors.torch import save_file
from vaswani_transformer.trainer import write_failure
folder = sys.argv[1]

def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
big = {"w": torch.zeros(4096)}
savers = {"safetensors": lambda p: save_file(big, p), "torch": lambda p: torch.save(big, p),
          "open": lambda p: write_text(p, "x" * 8192)}
found = {}
for name, save in savers.items():
    try:
        save(os.path.join(folder, "model.safetensors" if name == "safetensors" else name + ".out"))
    except Exception as error:
        found[name] = [type(error).__name__, write_failure(error, folder)]
found["other"] = write_failure(ValueError("not a write"), folder)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_write_failure_reads_each_savers_error(tmp_path):
    """safetensors (`SafetensorError: ... os error 27`), torch.save (`RuntimeError: [enforce fail at
    inline_container.cc...]`, no errno) and `open().write` (`OSError` without a file name) all become "file too large"
    naming the file being written; another error is not a write failure."""
    result = subprocess.run([sys.executable, "-c", THREE_SAVERS, str(tmp_path)], capture_output=True, text=True,
                            env=ENV, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert [found[name][0] for name in ("safetensors", "torch", "open")] == ["SafetensorError", "RuntimeError",
                                                                            "OSError"]  # fmt: skip
    for name in ("safetensors", "torch", "open"):
        reason, path = found[name][1]
        written = "model.safetensors" if name == "safetensors" else f"{name}.out"  # (safetensors leaves no file)
        assert reason.startswith("file too large") and path == str(tmp_path / written), found
    assert found["other"] is None
