"""Two processes under `accelerate launch --multi_gpu` with `--use_cpu` (gloo): different batches per rank, identical weights."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_two_processes_see_different_batches_and_hold_identical_weights(tmp_path):
    data = write_fixture(tmp_path / "data", n_train=1200)
    out = tmp_path / "out"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--num_cpu_threads_per_process", "1", "--main_process_port", str(free_port()), str(probe),
        # 160 tokens per batch per rank x 2 ranks, 640 tokens per update -> 2 micro-batches per update
        *tiny_args(data, out, "--max_steps", "6", "--tokens_per_update", "640", "--save_strategy", "no"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
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
