"""Two processes under `accelerate launch --multi_gpu` with `--use_cpu` (gloo): different batches per rank, identical
weights; what `configs/accelerate/fsdp.yaml` does on CPUs, and FSDP's checkpoint layouts under the completeness rule."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import helpers
from test_training import tiny_args, write_fixture

# Runs vaswani_transformer.train.run_from_args (what scripts/train.py runs) with a probe: a forward pre-hook records the
# source sequences of every micro-batch, and after every update the weights' digest is recorded.
PROBE = textwrap.dedent(
    """
    import hashlib, json, os, sys
    import torch
    from transformers import TrainerCallback
    from vaswani_transformer.train import run_from_args

    class Probe(TrainerCallback):
        def __init__(self):
            self.batches, self.digests, self.hooked = [], [], False

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if not self.hooked:
                def hook(module, a, kw):
                    ids = kw.get("input_ids")
                    if ids is not None and module.training:
                        self.batches.append([[t for t in row if t != 0] for row in ids.tolist()])
                model.register_forward_pre_hook(hook, with_kwargs=True)
                self.hooked = True

        def on_step_end(self, args, state, control, model=None, **kwargs):
            h = hashlib.sha256()
            for name, p in sorted(model.state_dict().items()):
                h.update(name.encode()); h.update(p.detach().cpu().contiguous().numpy().tobytes())
            self.digests.append((state.global_step, h.hexdigest()))

        def on_train_end(self, args, state, control, **kwargs):
            rank = int(os.environ.get("RANK", "0"))
            import torch.distributed as dist
            backend = dist.get_backend() if dist.is_initialized() else None
            with open(os.path.join(args.output_dir, f"probe_rank{rank}.json"), "w") as f:
                json.dump({"batches": self.batches, "digests": self.digests, "backend": backend,
                           "world_size": args.world_size, "accumulation": args.gradient_accumulation_steps}, f)

    run_from_args(sys.argv[1:], callbacks=[Probe()])
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Two CPU processes over gloo, as `accelerate launch --multi_gpu --num_processes 2` with train.py's --use_cpu.
TWO_CPU_PROCESSES = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                     "--dynamo_backend", "no"]  # fmt: skip


def launch(launcher_flags: list[str], script: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    """`accelerate launch <launcher_flags> script args`, one thread per process, offline, this checkout importable."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launcher_flags, "--num_cpu_threads_per_process", "1",
           "--main_process_port", str(free_port()), str(script), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_two_processes_see_different_batches_and_hold_identical_weights(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=1200)
    out = tmp_path / "out"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    # 160 tokens per batch per rank x 2 ranks, 640 tokens per update -> 2 micro-batches per update
    args = tiny_args(data, out, "--max_steps", "6", "--tokens_per_update", "640", "--save_strategy", "no")
    result = launch(TWO_CPU_PROCESSES, probe, args, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    # Every parameter gets a gradient: DDP is told so instead of searching the graph each update (torch warns).
    assert "find_unused_parameters=True" not in result.stderr
    ranks = [json.loads((out / f"probe_rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["backend"] == "gloo" and r["world_size"] == 2 and r["accumulation"] == 2
        assert len(r["batches"]) == 6 * 2  # 6 updates x 2 micro-batches
    # Different batches: no source sentence is seen by both ranks in these updates (all sources are distinct).
    seen = [{tuple(seq) for batch in r["batches"] for seq in batch} for r in ranks]
    assert seen[0] and seen[1] and not (seen[0] & seen[1])
    # Identical weights after every update, and they do change.
    assert ranks[0]["digests"] == ranks[1]["digests"]
    assert [s for s, _ in ranks[0]["digests"]] == [1, 2, 3, 4, 5, 6]
    assert len({d for _, d in ranks[0]["digests"]}) == 6
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    summary = json.loads((out / "training_summary.json").read_text())["summary"]
    assert summary["num_processes"] == 2 and summary["target_tokens_seen"] > 0


# The probe with rank 1's trainer clock running 100 times as fast as rank 0's: alone, rank 1 would place the decay and
# stop within the first tenth of a second.
CLOCK_AHEAD_ON_RANK_1 = textwrap.dedent(
    """
    import os, time, types
    if os.environ.get("RANK") == "1":
        import vaswani_transformer.trainer as trainer_module
        trainer_module.time = types.SimpleNamespace(monotonic=lambda: 100 * time.monotonic(), time=time.time)
    """
)


@pytest.mark.slow
def test_two_processes_follow_rank_0_s_clock_for_the_time_budget_and_its_decay(tmp_path):
    """Under lr_decay_minutes both processes place the decay where rank 0's clock says and stop at the same update,
    also when rank 1's clock reads otherwise: identical weights after every update, down to an annealed rate."""
    data = write_fixture(tmp_path / "data", n_train=1200)
    out, probe = tmp_path / "out", tmp_path / "probe.py"
    probe.write_text(CLOCK_AHEAD_ON_RANK_1 + PROBE)
    args = tiny_args(data, out, "--lr_schedule", "hf", "--learning_rate", "1e-3", "--lr_scheduler_type",
                     "warmup_stable_decay", "--max_train_minutes", "0.2", "--lr_decay_minutes", "0.1",
                     "--max_steps", "100000", "--save_strategy", "no")  # fmt: skip
    i = args.index("--lr_factor")
    result = launch(TWO_CPU_PROCESSES, probe, args[:i] + args[i + 2:], timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads((out / f"probe_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["digests"] == ranks[1]["digests"]
    state = json.loads((out / "trainer_state.json").read_text())
    placed = state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["placed"]
    assert placed["decay_start"] >= 10 and placed["decay_steps"] >= 1  # after the warmup (10 updates)
    assert [s for s, _ in ranks[0]["digests"]] == list(range(1, state["global_step"] + 1))
    assert state["global_step"] > placed["decay_start"] + 1


@pytest.mark.slow
def test_two_processes_resumed_inside_a_later_epoch_continue_as_the_uninterrupted_run(tmp_path):
    """A copy of checkpoint-12 (inside the second epoch) resumed by 2 processes sees, on each rank, the batches the
    uninterrupted run saw after update 12 and ends with its weights after every update. Before, the token batch
    sampler behind accelerate's shard wrapper missed transformers' set_epoch after the resume's batch skipping: the
    rest of that epoch came in epoch 0's order (pairs trained twice, others not at all)."""
    data = write_fixture(tmp_path / "data", n_train=300)
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)

    def args(out, *extra):
        return tiny_args(data, out, "--tokens_per_update", "320", "--num_train_epochs", "2", "--save_steps", "12",
                         *extra)  # fmt: skip

    result = launch(TWO_CPU_PROCESSES, probe, args(first), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    state = json.loads((first / "checkpoint-12" / "trainer_state.json").read_text())
    assert 1 < state["epoch"] < 2, state["epoch"]  # inside the second epoch
    resumed.mkdir()
    shutil.copytree(first / "checkpoint-12", resumed / "checkpoint-12")
    shutil.copytree(first / "tokenizer", resumed / "tokenizer")
    result = launch(TWO_CPU_PROCESSES, probe, args(resumed, "--resume_from_checkpoint", "latest"), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for rank in (0, 1):
        before, after = (json.loads((out / f"probe_rank{rank}.json").read_text()) for out in (first, resumed))
        steps_after = len(after["batches"])
        assert steps_after and after["batches"] == before["batches"][-steps_after:], rank
        assert after["digests"] == [d for d in before["digests"] if d[0] > 12], rank


# Rank 0 alone under a 200 kB file size limit (a full disk on the machine that writes): SIGXFSZ ignored, as a shell's
# `ulimit -f` with a trapped signal, so the write fails with EFBIG.
RANK0_FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import os, resource, runpy, signal, sys
    if os.environ.get("RANK") == "0":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    sys.argv = [{script!r}, *sys.argv[1:]]
    runpy.run_path({script!r}, run_name="__main__")
    """
)


@pytest.mark.slow
def test_a_failed_checkpoint_write_on_rank_0_stops_every_process_naming_the_file(tmp_path):
    """checkpoint-2's optimizer.pt (~283 kB) cannot be written by rank 0: the run ends (both processes, no wait for
    a collective's timeout) with rank 0's one-line error naming the file, and the incomplete checkpoint is gone."""
    data = write_fixture(tmp_path / "data", n_train=300)
    out = tmp_path / "out"
    wrapper = tmp_path / "limited.py"
    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    wrapper.write_text(RANK0_FILE_SIZE_LIMIT.format(script=str(script)))
    args = tiny_args(data, out, "--max_steps", "6", "--save_steps", "2")
    result = launch(TWO_CPU_PROCESSES, wrapper, args, timeout=200)
    assert result.returncode != 0
    named = f"file too large (the process's file size limit) while writing {out / 'checkpoint-2' / 'optimizer.pt'}"
    assert f"train.py: error: {named}: training stopped." in result.stderr, result.stderr[-6000:]
    assert not (out / "checkpoint-2").exists()


@pytest.mark.slow
def test_two_processes_score_the_model_before_and_after_averaging(tmp_path):
    """`scripts/train.py` in 2 processes with averaging and do_eval: both evaluate the model before averaging (a
    collective: one process alone would wait forever) and the averaged one; rank 0 prints the two scores once, and
    the summary holds them."""
    data = write_fixture(tmp_path / "data", n_train=300)
    out = tmp_path / "out"
    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    args = tiny_args(data, out, "--max_steps", "4", "--save_steps", "2", "--do_eval", "--average_last_checkpoints",
                     "2", "--generation_num_beams", "2")  # fmt: skip
    result = launch(TWO_CPU_PROCESSES, script, args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    summary = json.loads((out / "training_summary.json").read_text())
    before, averaged = summary["eval_before_averaging"]["eval_bleu"], summary["eval"]["eval_bleu"]
    assert result.stdout.count("Validation BLEU: ") == 1
    printed = f"Validation BLEU: {averaged:.4g} averaged (last 2 checkpoints), {before:.4g} before averaging"
    assert printed in result.stdout
    record = json.loads((out / "averaged" / "averaged_checkpoints.json").read_text())
    assert [Path(c).name for c in record["checkpoints"]] == ["checkpoint-2", "checkpoint-4"]


@pytest.mark.slow
def test_two_processes_evaluate_and_predict_each_sentence_once_as_one_process_does(tmp_path):
    """Validation and test sets of 13 sentences in batches of 4 per process: accelerate fills the last batch of each
    process with repeated sentences, which evaluation drops again. 2 processes write the same translations (each the
    model's translation of that line alone), one per line in order, with the same BLEU, chrF and loss as 1 process
    (before, the file had 3 extra lines and the scores counted them; the loss was a mean of per-batch means)."""
    from vaswani_transformer.train import run_from_args

    model_dir = tmp_path / "model"
    model, tokenizer = helpers.save_tiny_model(model_dir, seed=18, init_std=0.02, scale_embedding=True)
    sources = helpers.SOURCES + helpers.CORPUS[:7]
    alone = helpers.generate_one_by_one(model, tokenizer, sources)
    references = [t if i % 2 == 0 else "x y z" for i, t in enumerate(alone)]  # scores between 0 and 100
    data = tmp_path / "data"
    data.mkdir()
    (data / "set.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (data / "set.tgt").write_text("".join(r + "\n" for r in references), encoding="utf-8")

    def args(out: Path) -> list[str]:
        return ["--model_name_or_path", str(model_dir), "--validation_file", str(data / "set"), "--test_file",
                str(data / "set"), "--source_lang", "src", "--target_lang", "tgt", "--output_dir", str(out),
                "--do_eval", "--do_predict", "--per_device_eval_batch_size", "4", "--use_cpu", "--report_to", "none",
                "--disable_tqdm", "true"]  # fmt: skip

    one = run_from_args(args(tmp_path / "one"))
    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    result = launch(TWO_CPU_PROCESSES, script, args(tmp_path / "two"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    two = json.loads((tmp_path / "two" / "training_summary.json").read_text())
    written = {n: (tmp_path / n / "test_translations.txt").read_text(encoding="utf-8").split("\n")[:-1]
               for n in ("one", "two")}  # fmt: skip
    assert written["two"] == written["one"] == alone
    assert 0 < one["test"]["test_tokenized_bleu"] < 100 and 0 < one["test"]["test_chrf"] < 100
    for split in ("test", "eval"):  # (sacreBLEU is 0 here: the translations are one 13a token each)
        for key in ("bleu", "tokenized_bleu", "chrf", "gen_len", "loss"):  # loss: the mean over the set's tokens
            assert two[split][f"{split}_{key}"] == pytest.approx(one[split][f"{split}_{key}"], rel=1e-6), (split, key)


# ------------------------------------------------------------------------------------------------------------ FSDP

FSDP_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from accelerate.state import AcceleratorState
    from transformers import TrainerCallback
    from vaswani_transformer.train import run_from_args

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            from torch.distributed.fsdp import FSDPModule
            rank = int(os.environ.get("RANK", "0"))
            sharded = any(isinstance(m, FSDPModule) for m in model.modules())
            with open(os.path.join(args.output_dir, f"fsdp_probe_rank{rank}.json"), "w") as f:
                json.dump({"distributed_type": str(AcceleratorState().distributed_type), "sharded": sharded,
                           "use_fsdp_env": os.environ.get("ACCELERATE_USE_FSDP"), "world_size": args.world_size}, f)

    run_from_args(sys.argv[1:], callbacks=[Probe()])
    import torch
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[sys.argv.index("--output_dir") + 1], f"ended_rank{rank}.json"), "w") as f:
        json.dump({"process_group_left": torch.distributed.is_initialized()}, f)
    """
)


@pytest.mark.slow
def test_fsdp_config_on_cpu_runs_as_ddp_over_gloo_and_its_checkpoints_average(tmp_path):
    """`accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 --mixed_precision no` and
    train.py `--use_cpu` starts two processes asking for FSDP (ACCELERATE_USE_FSDP=true), but accelerate (1.15)
    selects FSDP only on accelerators (GPU, XPU, NPU, ...): on CPUs the run is DDP over gloo and nothing is sharded.
    The README says so; this test notices the day accelerate shards on CPUs too."""
    from vaswani_transformer.checkpoints import average_checkpoints, checkpoint_problem

    data = write_fixture(tmp_path / "data", n_train=200)
    out = tmp_path / "out"
    probe = tmp_path / "probe.py"
    probe.write_text(FSDP_PROBE)
    config = Path(__file__).resolve().parents[1] / "configs" / "accelerate" / "fsdp.yaml"
    fsdp_flags = ["--config_file", str(config), "--num_processes", "2", "--mixed_precision", "no"]
    result = launch(fsdp_flags, probe, tiny_args(data, out, "--max_steps", "4", "--save_steps", "2"), timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    ranks = [json.loads((out / f"fsdp_probe_rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["world_size"] == 2 and r["use_fsdp_env"] == "true"  # the launcher did ask for FSDP
        assert r["distributed_type"] == "DistributedType.MULTI_CPU" and not r["sharded"], (
            f"accelerate now runs FSDP on CPUs ({r}): test FSDP training, resume and averaging here and update the "
            "README table of distributed configurations"
        )
    # The job ends the process group: left to interpreter finalization, gloo's threads can abort a finished run.
    for r in (0, 1):
        assert json.loads((out / f"ended_rank{r}.json").read_text()) == {"process_group_left": False}
    for step in (2, 4):
        assert checkpoint_problem(out / f"checkpoint-{step}", for_resume=True) is None
    averaged = average_checkpoints(out, num_last=2, output_dir=tmp_path / "averaged")
    assert [p.name for p in averaged.checkpoints] == ["checkpoint-2", "checkpoint-4"]


def _fsdp_checkpoint(folder: Path, sharded: bool) -> Path:
    """A checkpoint laid out as the Trainer writes it under FSDP (accelerate's save_fsdp_model/save_fsdp_optimizer):
    SHARDED_STATE_DICT gives torch.distributed.checkpoint folders `pytorch_model_fsdp_0/` and `optimizer_0/` (written
    here by torch's own writer, in one process) and no model.safetensors; FULL_STATE_DICT gives model.safetensors plus
    `pytorch_model_fsdp.bin` and `optimizer.bin`."""
    import torch
    import torch.distributed.checkpoint as dcp

    from helpers import tiny_model

    model = tiny_model()
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters())
    model(input_ids=torch.tensor([[5, 6, 2]]), labels=torch.tensor([[7, 2]])).loss.backward()
    optimizer.step()
    folder.mkdir(parents=True)
    if sharded:
        dcp.save({"model": weights}, checkpoint_id=folder / "pytorch_model_fsdp_0")
        dcp.save({"optimizer": optimizer.state_dict()["state"]}, checkpoint_id=folder / "optimizer_0")
    else:
        model.save_pretrained(folder)  # what Trainer.save_model writes from the gathered full state dict
        torch.save(weights, folder / "pytorch_model_fsdp.bin")
        torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    torch.save({"last_epoch": 1}, folder / "scheduler.pt")
    torch.save({"cpu": torch.random.get_rng_state()}, folder / "rng_state_0.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    return folder


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process writes every shard
def test_fsdp_checkpoints_resume_by_the_completeness_rule_and_sharded_ones_do_not_average(tmp_path):
    """A sharded FSDP checkpoint is resumable (before: "missing model weights", so `--resume_from_checkpoint latest`
    moved every one aside), unless a `.metadata` is missing (a rank killed while saving); averaging it is refused
    naming the reason. A full-state-dict one is resumable and averages."""
    from vaswani_transformer.checkpoints import (
        average_checkpoints,
        checkpoint_problem,
        find_last_complete_checkpoint,
    )

    run = tmp_path / "run"
    sharded = _fsdp_checkpoint(run / "checkpoint-2", sharded=True)
    assert sorted(p.name for p in (sharded / "pytorch_model_fsdp_0").iterdir())[0] == ".metadata"
    assert checkpoint_problem(sharded, for_resume=True) is None
    assert find_last_complete_checkpoint(run) == str(sharded)
    assert "sharded FSDP weights only (pytorch_model_fsdp_0/" in checkpoint_problem(sharded)
    with pytest.warns(UserWarning, match="sharded FSDP weights only"), pytest.raises(ValueError, match="found only 0"):
        average_checkpoints(run, num_last=1, output_dir=tmp_path / "avg")
    (sharded / "optimizer_0" / ".metadata").unlink()  # the coordinator writes it last
    assert "unfinished sharded optimizer_0/" in checkpoint_problem(sharded, for_resume=True)

    full = _fsdp_checkpoint(tmp_path / "full" / "checkpoint-2", sharded=False)
    assert checkpoint_problem(full, for_resume=True) is None and checkpoint_problem(full) is None
    (full / "model.safetensors").unlink()
    assert checkpoint_problem(full, for_resume=True) is None  # pytorch_model_fsdp.bin is what FSDP resumes from
