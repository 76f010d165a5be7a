"""Optimisation with the paper's recipe: schedule, Adam, the loss, callbacks and the `Seq2SeqTrainer` subclass.

The recipe (Sections 5.3 and 5.4 of the paper):

* Adam with beta1=0.9, beta2=0.98, eps=1e-9 and no weight decay (:func:`build_optimizer`);
* ``lr = lr_factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)`` with ``warmup_steps=4000``
  (:func:`paper_learning_rate`); update number ``n`` (1-based, as in the paper) uses ``step = n``;
* label smoothing 0.1; no gradient clipping;
* batches of about ``max_tokens_per_batch`` source and target tokens per device from
  :class:`vaswani_transformer.data.TokenBatchSampler`; ``tokens_per_update`` (25000 in the paper: 8 GPUs x ~3k)
  sets ``gradient_accumulation_steps`` (:func:`gradient_accumulation_for`).

Loss normalisation: the label-smoothed cross-entropy (any eps, 0 included) is summed over the target tokens of the
whole update (all accumulation steps and all processes: transformers' ``num_items_in_batch``) and divided by their
number, so every target token weighs the same, as in the paper's token batches
(:meth:`VaswaniSeq2SeqTrainer.compute_loss`).

Distributed: each rank builds the sampler with its own ``rank`` (batch ``j`` of an epoch goes to rank
``j % num_processes``); the DataLoader is prepared by accelerate for device placement, and the
``BatchSamplerShard`` wrapper accelerate adds is made a pass-through so the batches are not split twice (the same
thing transformers does for its own rank-aware ``BatchRebalanceSampler``). DDP all-reduces gradients, so weights
stay identical across ranks.

Checkpoints: ``save_steps`` and/or ``save_every_minutes`` (the paper: every 10 minutes; the decision is made on
rank 0 and broadcast), and always the last update (:class:`SaveAtEndCallback`), so the final weights are averaged.
Tokens and wall time trained so far travel in the checkpoints' trainer state (:class:`TrainingTotalsCallback`), so
the summary's totals survive resumes.

Faults: a NaN or infinite loss raises :class:`NonFiniteLossError` naming the update and the last complete
checkpoint (or saying none was written) before the optimizer steps, so the weights and that checkpoint stay good.
A write that fails while saving (disk full, quota, file size limit) raises :class:`CheckpointWriteError` naming the
file; the half-written checkpoint is removed and the earlier ones stay as they were.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from accelerate.utils.operations import ConvertOutputsToFp32
from torch.utils.data import DataLoader, SequentialSampler
from transformers import Seq2SeqTrainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, IntervalStrategy, SaveStrategy, has_length, seed_worker
from transformers.utils import SAFE_WEIGHTS_NAME

from .checkpoints import find_last_complete_checkpoint
from .data import TokenBatchSampler
from .evaluation import choose_length_penalty
from .hub import write_model_card

logger = logging.getLogger(__name__)

LR_SCHEDULES = ("paper", "hf")  # the paper's equation (3), or transformers' schedules with learning_rate
TRAINING_ARGS_JSON = "training_args.json"  # the run's arguments, next to trainer_state.json (save_state)


# ------------------------------------------------------------------------------------------------- schedule


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's equation (3): ``factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``, step >= 1."""
    if step < 1:
        raise ValueError(f"step counts updates from 1, got {step}.")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}.")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def paper_lr_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int, factor: float = 1.0, last_epoch: int = -1
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` giving the ``n``-th optimizer update (n = 1, 2, ...) :func:`paper_learning_rate` of ``n``.

    The optimizer's base learning rate is ignored: the schedule sets absolute rates (the lambda returns the rate
    divided by the base rate of each parameter group).
    """
    if warmup_steps < 1:
        raise ValueError(f"The paper schedule needs warmup_steps >= 1, got {warmup_steps}.")
    lambdas = []
    for group in optimizer.param_groups:
        base = group.get("initial_lr", group["lr"])
        if base <= 0:
            raise ValueError(f"The optimizer's learning rate must be positive, got {base}.")
        lambdas.append(lambda s, base=base: paper_learning_rate(s + 1, d_model, int(warmup_steps), factor) / base)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas, last_epoch=last_epoch)


WSD_SHAPES = ("linear", "cosine", "1-sqrt")  # transformers' warmup_type and decay_type of warmup_stable_decay


class ClockedWarmupStableDecay:
    """transformers' ``warmup_stable_decay`` multiplier (``get_wsd_schedule``: warmup, the peak held, a decay to
    ``min_lr_ratio``) whose decay the clock places: ``decay_start`` and ``decay_steps`` stay None, the peak held, until
    :class:`TimeBudgetCallback` sets them ``lr_decay_minutes`` before the time budget's end. A callable object, so
    ``LambdaLR`` keeps them in the scheduler's state: a resumed run continues the decay it was in."""

    def __init__(self, num_warmup_steps: int, warmup_type: str = "linear", decay_type: str = "cosine",
                 min_lr_ratio: float = 0.0, num_cycles: float = 0.5):  # fmt: skip
        for name, shape in (("warmup_type", warmup_type), ("decay_type", decay_type)):
            if shape not in WSD_SHAPES:
                raise ValueError(f"{name} {shape!r} is not one of warmup_stable_decay's: {', '.join(WSD_SHAPES)}.")
        self.num_warmup_steps, self.warmup_type, self.decay_type = int(num_warmup_steps), warmup_type, decay_type
        self.min_lr_ratio, self.num_cycles = float(min_lr_ratio), float(num_cycles)
        self.decay_start: int | None = None  # the scheduler step the decay starts at (the updates trained before it)
        self.decay_steps: int | None = None

    def __call__(self, step: int) -> float:
        if step < self.num_warmup_steps:
            progress, shape = step / max(1, self.num_warmup_steps), self.warmup_type
            factor = {"linear": progress, "cosine": 0.5 * (1 - math.cos(math.pi * progress)),
                      "1-sqrt": 1 - math.sqrt(1 - progress)}[shape]  # fmt: skip
        elif self.decay_start is None or step < self.decay_start:
            return 1.0
        elif step < self.decay_start + self.decay_steps:
            progress = (step - self.decay_start) / max(1, self.decay_steps)
            factor = {"linear": 1 - progress, "cosine": 0.5 * (1 + math.cos(2 * math.pi * self.num_cycles * progress)),
                      "1-sqrt": 1 - math.sqrt(progress)}[self.decay_type]  # fmt: skip
        else:
            return self.min_lr_ratio
        return max(0.0, factor * (1 - self.min_lr_ratio) + self.min_lr_ratio)


def clocked_decay(scheduler) -> ClockedWarmupStableDecay | None:
    """The clock-placed decay a scheduler (or accelerate's wrapper of one) follows, if any."""
    scheduler = getattr(scheduler, "scheduler", scheduler)
    found = [f for f in getattr(scheduler, "lr_lambdas", ()) if isinstance(f, ClockedWarmupStableDecay)]
    return found[0] if found else None


# transformers' default `optim` values, which give the paper's Adam (:func:`build_optimizer`); any other `--optim`
# (adafactor, sgd, adamw_8bit, ...) is transformers' own optimizer, with the schedule still ours or transformers'.
PAPER_OPTIM = ("adamw_torch_fused", "adamw_torch")


def _optim_name(args: TrainingArguments | Mapping[str, Any]) -> str:
    """``optim`` of arguments or of their ``to_dict()`` (an enum in the one, a string in the other)."""
    optim = args.get("optim") if isinstance(args, Mapping) else args.optim
    return str(getattr(optim, "value", optim) or PAPER_OPTIM[0])


def uses_paper_optimizer(args: TrainingArguments | Mapping[str, Any]) -> bool:
    """Whether ``args`` (arguments or their ``to_dict()``) train with :func:`build_optimizer`'s Adam: ``optim`` left
    at transformers' default (or set to the plain torch AdamW it names)."""
    return _optim_name(args) in PAPER_OPTIM


def build_optimizer(model: torch.nn.Module, args: TrainingArguments) -> torch.optim.Optimizer:
    """Adam with the arguments' betas and eps (paper: 0.9, 0.98, 1e-9). ``weight_decay > 0`` gives AdamW
    (decoupled decay) on all weights except biases and LayerNorms; the paper uses none.

    On CPU and CUDA it uses PyTorch's fused kernel: the same update in one pass over all parameters instead of one
    tensor at a time (``benchmarks/training_step_speed.py`` measures it)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") for p in params) or None
    common = dict(lr=1.0, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon, fused=fused)
    if not args.weight_decay:
        return torch.optim.Adam(params, weight_decay=0.0, **common)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() or name.endswith("bias") else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], **common
    )


def describe_optimizer(args: Mapping[str, Any]) -> str:
    """What the trainer builds from these arguments (a ``TrainingArguments.to_dict()``), in words."""
    if not uses_paper_optimizer(args):
        extra = args.get("optim_args")
        return f"transformers' --optim {_optim_name(args)}" + (f" ({extra})" if extra else "")
    decay = args.get("weight_decay") or 0.0
    name = f"AdamW (weight decay {decay:g}, not on biases and LayerNorms; " if decay else "Adam ("
    return f"{name}beta1 {args.get('adam_beta1'):g}, beta2 {args.get('adam_beta2'):g}, eps {args.get('adam_epsilon'):g})"


def gradient_accumulation_for(tokens_per_update: int, max_tokens_per_batch: int, num_processes: int) -> int:
    """Micro-batches per update so that one update sees about ``tokens_per_update`` tokens (at least 1)."""
    if tokens_per_update < 1 or max_tokens_per_batch < 1 or num_processes < 1:
        raise ValueError(
            f"tokens_per_update ({tokens_per_update}), max_tokens_per_batch ({max_tokens_per_batch}) and the "
            f"number of processes ({num_processes}) must be positive."
        )
    return max(1, round(tokens_per_update / (max_tokens_per_batch * num_processes)))


# ------------------------------------------------------------------------------------------------ CPU memory

class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of (tokens, vocabulary) logits times `scale`, in row blocks that stay in
    cache: one float32 block at a time, never vocabulary-sized float32 copies of the whole batch (on a CPU those
    passes over memory cost more than the arithmetic). When the logits need a gradient, the forward pass also writes
    it, from the same exponentials, (softmax - smoothed one-hot) * scale in the logits' dtype, and the backward pass
    only hands it on: one pass over the logits instead of two."""

    @staticmethod
    def forward(ctx, logits, labels, epsilon, scale, rows):
        valid, labels = labels != -100, labels.clamp(min=0)
        grad = torch.empty_like(logits) if logits.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, logits.shape[0], rows):
            block = logits[i : i + rows].to(torch.float32, copy=True)  # never in place in the caller's logits
            label, keep = labels[i : i + rows, None], valid[i : i + rows]
            # -log p(y) = lse - x_y; mean over the vocabulary of -log p(v) = lse - mean(x)
            target, mean = block.gather(1, label)[:, 0], block.mean(-1)
            largest = block.amax(-1, keepdim=True)
            exp_sum = block.sub_(largest).exp_().sum(-1, keepdim=True)  # the block now holds exp(x - max)
            lse = (largest + exp_sum.log())[:, 0]
            total += ((lse - (1 - epsilon) * target - epsilon * mean) * keep).sum()
            if grad is not None:  # d/dx = softmax(x) - (1 - eps) onehot(y) - eps / V, for the tokens that count
                weight = keep * scale
                block.mul_((weight / exp_sum[:, 0])[:, None]).sub_((epsilon / logits.shape[-1]) * weight[:, None])
                grad[i : i + rows] = block.scatter_add_(1, label, ((epsilon - 1) * weight)[:, None])
        ctx.save_for_backward(grad)
        return total * scale

    @staticmethod
    def backward(ctx, grad_total):
        (grad,) = ctx.saved_tensors
        # Usually 1 (the loss itself); otherwise one more rounding in the logits' dtype.
        return (grad if grad_total.item() == 1.0 else grad * grad_total.to(grad.dtype)), None, None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float, scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """`scale` x the sum over the target tokens (label -100 ignored) of (1 - eps) * -log p(y) + eps * mean_v(-log p(v)),
    from (tokens, vocabulary) logits of any float dtype, computed in float32: ``F.cross_entropy(logits.float(),
    labels, label_smoothing=eps, reduction="sum") * scale``. On a CPU in cache-sized row blocks, the gradient
    computed with the loss (`_LabelSmoothedCrossEntropy`); `scale` (1 / the number of target tokens, as the trainer
    gives it) is folded into that gradient before it is rounded to the logits' dtype."""
    if logits.device.type != "cpu":
        return torch.nn.functional.cross_entropy(
            logits.float(), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum"
        ) * scale
    rows = max(1, 2**20 // logits.shape[-1])  # 4 MiB of float32 per block: the fastest measured at 8k and 37k
    return _LabelSmoothedCrossEntropy.apply(logits, labels, float(epsilon), float(scale), rows)


@contextmanager
def outputs_in_compute_dtype(module: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``module`` (accelerate-prepared for mixed precision) returns its outputs in the autocast dtype.

    accelerate runs such a model as ``convert_outputs_to_fp32(autocast(forward))``: in training that makes a float32
    copy of the (tokens x vocabulary) logits and casts its gradient back, only for :func:`label_smoothed_cross_entropy`
    to read them again (it computes in float32 blocks from any dtype, with the same result from bf16 logits). The block
    keeps the autocast level and skips the conversion; outside it the model is as accelerate left it. A model without
    that wrapper is left alone.
    """
    forward = module.__dict__.get("forward")
    converter = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
    if not isinstance(converter, ConvertOutputsToFp32):
        yield
        return
    inner = converter.model_forward  # autocast(forward): unbound when accelerate bound the converter to the module
    module.forward = MethodType(inner, module) if hasattr(forward, "__func__") else inner
    try:
        yield
    finally:
        module.forward = forward


@contextmanager
def forward_as_saved(module: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``module`` (accelerate-prepared for mixed precision) runs its own forward: no autocast, no
    outputs cast to float32, what its saved weights compute wherever they are loaded. accelerate keeps the forward it
    wrapped as ``_original_forward`` (its ``unwrap_model(keep_fp32_wrapper=False)`` restores it for good). For a
    compiled module (``torch_compile``), the module inside, which its ``generate`` runs. A module without that wrapper
    is left alone."""
    module = getattr(module, "_orig_mod", module)
    original = module.__dict__.get("_original_forward")
    if original is None:
        yield
        return
    wrapped = module.__dict__.get("forward")
    module.forward = original
    try:
        yield
    finally:
        module.forward = wrapped


# oneDNN's variable for how many compiled kernels (primitives) it keeps, and the number this project's jobs ask for.
ONEDNN_CACHE_VARIABLE, ONEDNN_PRIMITIVES = "ONEDNN_PRIMITIVE_CACHE_CAPACITY", 8192


def keep_onednn_primitives(capacity: int = ONEDNN_PRIMITIVES) -> str:
    """Let oneDNN keep `capacity` compiled kernels ("primitives") instead of its default 1,024; returns the capacity
    the environment now asks for (a value already set there is left as it is).

    A CPU multiplies bf16 through oneDNN, which compiles a kernel for every product shape it meets and keeps the
    latest 1,024. Token batches change shape every update: the Multi30k recipe's model meets about 2,650 (linear
    layers, attention products; forward and backward) in its first 440 updates, so with the default it compiles
    again and again (20-100 ms of an update of about 200). oneDNN reads the variable at its first product: call this
    before. Each kept kernel holds about 70 kB.
    """
    return os.environ.setdefault(ONEDNN_CACHE_VARIABLE, str(capacity))


def skip_cudnn_attention() -> bool:
    """Keep PyTorch's SDPA off cuDNN's attention kernel in this process (flash and memory-efficient kernels remain);
    returns whether it had been on.

    PyTorch picks cuDNN's kernel for bf16/fp16 attention on recent GPUs, and cuDNN builds an execution plan for every
    attention shape it meets. Token batches change shape every update: on an H100 MarianMT's base configuration took
    241-276 ms per bf16 update with it and 34-43 ms without (fp32: 38-41 ms); ours took 357 ms per bf16 update with
    it on Multi30k token batches (fp32: 44 ms).
    """
    was_on = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    return was_on


# ------------------------------------------------------------------------------------------------- trainer


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite loss (the message names the update); checkpoints stay as they were."""


class CheckpointWriteError(OSError):
    """Saving stopped because a file could not be written (disk full, quota, file size limit); names the file."""


# Write failures that mean "out of room", by errno.
_NO_ROOM = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
            errno.EFBIG: "file too large (the process's file size limit)"}  # fmt: skip


def _newest_file(folder: str) -> str | None:
    """The most recently modified file under ``folder``: the one being written when a save failed."""
    files = [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]
    return max(files, key=lambda f: os.stat(f).st_mtime_ns, default=None) if files else None


def write_failure(error: BaseException, folder: str) -> tuple[str, str] | None:
    """``(reason, path)`` when ``error`` is a failed write into ``folder`` for lack of room, else None.

    The savers report it three ways: ``OSError`` with an errno (``open``/``write``; often no file name), safetensors'
    ``SafetensorError`` with ``os error N`` in its text, and ``torch.save``'s zip writer with a bare
    ``RuntimeError: [enforce fail at inline_container.cc...]`` (no errno: the free space and the file size limit tell).
    The path is the error's file name, else the newest file in ``folder`` (the one the failed write created), or
    ``model.safetensors`` for safetensors' error.
    """
    code = error.errno if isinstance(error, OSError) else None
    if code is None:
        found = re.search(r"os error (\d+)", str(error))
        code = int(found.group(1)) if found else None
    named = [f for f in (getattr(error, "filename2", None), getattr(error, "filename", None)) if f]
    inside = [f for f in named if os.path.abspath(f).startswith(os.path.abspath(folder) + os.sep)]
    path = (inside or [None])[0] or _newest_file(folder) or folder  # shutil's copy names its source first
    if type(error).__name__ == "SafetensorError":  # the weights (save_pretrained): safetensors removes a failed file
        path = os.path.join(folder, SAFE_WEIGHTS_NAME)
    if code in _NO_ROOM:
        return _NO_ROOM[code], str(path)
    if not (isinstance(error, RuntimeError) and "inline_container" in str(error)):
        return None
    try:
        if shutil.disk_usage(folder).free < (1 << 20):
            return _NO_ROOM[errno.ENOSPC], str(path)
        import resource  # POSIX only

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and os.path.getsize(path) >= limit:
            return _NO_ROOM[errno.EFBIG], str(path)
    except (OSError, ImportError):
        pass
    return "a write failed (I/O error)", str(path)


def rank0_values(values: list[int]) -> list[int]:
    """Rank 0's ``values`` on every process (clocks differ between processes; decisions must not)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        tensor = torch.tensor(values, dtype=torch.int64)
        if torch.distributed.get_backend() == "nccl":
            tensor = tensor.cuda()
        torch.distributed.broadcast(tensor, src=0)
        return tensor.tolist()
    return list(values)


def rank0_decides(flag: bool) -> bool:
    """Rank 0's value of ``flag`` on every process."""
    return bool(rank0_values([int(flag)])[0])


def saved_callback_attributes(stateful_callbacks: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """The attributes an ``ExportableState`` callback ``name`` saved in a trainer state's ``stateful_callbacks`` (one
    entry, or a list of them for several instances: the first); {} when it saved none."""
    saved = (stateful_callbacks or {}).get(name)
    saved = saved[0] if isinstance(saved, list) and saved else saved
    return saved.get("attributes", {}) if isinstance(saved, dict) else {}


class _WallClockCallback(TrainerCallback):
    """Whether ``minutes`` of wall time passed since ``start`` (the beginning of training), decided on rank 0."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def time_is_up(self) -> bool:
        return rank0_decides(time.monotonic() - self.start >= self.seconds)


class SaveEveryMinutesCallback(_WallClockCallback):
    """Ask for a checkpoint when ``minutes`` of wall time passed since the last one (decided on rank 0)."""

    def on_step_end(self, args, state, control, **kwargs):
        if self.time_is_up():
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.start = time.monotonic()


class TimeBudgetCallback(_WallClockCallback, ExportableState):
    """Stop training (saving a final checkpoint) once ``minutes`` of wall time have passed since this run's training
    began (decided on rank 0): a resumed run gets the whole budget again, not what the earlier runs left of it.

    With ``decay_minutes`` (``lr_decay_minutes``, under :class:`ClockedWarmupStableDecay`) it also places the decay:
    once the budget's last ``decay_minutes`` begin (and not before the warmup's end), the decay gets as many updates as
    the speed of the run's recent half says fit in the minutes left, and training ends with its last one: the run
    ends annealed on any machine. The placement is kept in the scheduler's state (a resumed run ends where it was
    planned) and in ``trainer_state.json`` (``stateful_callbacks``, for the plots)."""

    def __init__(self, minutes: float, decay_minutes: float | None = None):
        super().__init__(minutes)
        self.decay_seconds = decay_minutes * 60.0 if decay_minutes else None
        self.progress: list[tuple[float, int]] = []  # (seconds since the start, updates) after each update
        self.placed: dict[str, int] = {}

    def state(self) -> dict:
        return {"args": {"minutes": self.seconds / 60, "decay_minutes": self.decay_seconds and self.decay_seconds / 60},
                "attributes": {"placed": dict(self.placed)}}  # fmt: skip

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.progress = [(0.0, state.global_step)]
        decay = clocked_decay(lr_scheduler)
        if decay is not None and decay.decay_start is not None:  # resumed in the decay: it ends where planned
            self._end_with(decay, state)

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        elapsed = time.monotonic() - self.start
        decay = clocked_decay(lr_scheduler) if self.decay_seconds else None
        decay_steps = 0
        if decay is not None and decay.decay_start is None:
            self.progress.append((elapsed, state.global_step))
            if elapsed >= self.seconds - self.decay_seconds and state.global_step >= decay.num_warmup_steps:
                decay_steps = max(1, int(self._updates_per_second(elapsed) * (self.seconds - elapsed)))
        time_is_up, decay_steps = rank0_values([int(elapsed >= self.seconds), decay_steps])
        if decay_steps:
            decay.decay_start, decay.decay_steps = state.global_step, decay_steps
            self._end_with(decay, state)
            logger.info("lr_decay_minutes: the decay begins after update %d and lasts %d updates.",
                        state.global_step, decay_steps)  # fmt: skip
        if time_is_up:
            logger.info("max_train_minutes=%s reached at update %d: stopping.", self.seconds / 60, state.global_step)
            if decay is not None and decay.decay_start is not None and state.global_step < state.max_steps:
                logger.warning("The time budget ended training at update %d, before the end of its decay at update %s "
                               "(the run slowed down during the decay): the last updates trained at %.3g of the peak "
                               "rate.", state.global_step, state.max_steps, decay(state.global_step))  # fmt: skip
            control.should_training_stop = True
            control.should_save = True
        return control

    def on_train_end(self, args, state, control, lr_scheduler=None, **kwargs):
        decay = clocked_decay(lr_scheduler) if self.decay_seconds else None
        if decay is not None and decay.decay_start is None:
            logger.warning("Training ended at update %d before its decay began (the time budget's last "
                           "lr_decay_minutes, after the warmup): the rate was never annealed. Raise max_steps, or "
                           "shorten the warmup.", state.global_step)  # fmt: skip

    def _updates_per_second(self, elapsed: float) -> float:
        """Updates per second over the second half of the time so far (the first updates build kernels per shape)."""
        since, updates = next((t, n) for t, n in self.progress if t >= elapsed / 2)
        if elapsed <= since:
            since, updates = self.progress[0]
        return (self.progress[-1][1] - updates) / max(elapsed - since, 1e-9)

    def _end_with(self, decay: ClockedWarmupStableDecay, state) -> None:
        state.max_steps = decay.decay_start + decay.decay_steps
        self.placed = {"decay_start": decay.decay_start, "decay_steps": decay.decay_steps}


class TrainingTotalsCallback(TrainerCallback, ExportableState):
    """Source and target tokens trained on and training wall time since update 1, summed over processes: kept in
    every checkpoint's ``trainer_state.json`` (``stateful_callbacks``) and read back on resume, so that totals stay
    totals across resumes (like ``global_step``). ``at_start`` holds the totals when this run began: None when the
    resumed checkpoint did not record them (then only this run's figures are known). ``batching`` (tokens per batch,
    accumulation, processes) is kept too: resumed with others, a warning says that the resumed epoch's batches are
    not the checkpoint's (transformers skips as many batches of the new order as the checkpoint had trained)."""

    def __init__(self, batching: dict[str, Any] | None = None):
        self.batching = batching
        self.source, self.target = 0, 0
        self.at_start: dict[str, Any] | None = {"source": 0, "target": 0, "seconds": 0.0}
        self.start_step = 0
        self.run_start: float | None = None
        self.began = False  # on_train_begin seen (an evaluation before any training has no training time)

    def run_seconds(self) -> float:
        """Wall time of this run, from its first update."""
        return time.time() - self.run_start if self.run_start is not None else 0.0

    def state(self) -> dict:
        seconds = (self.at_start or {}).get("seconds", 0.0) + self.run_seconds()
        attributes = {"source": self.source, "target": self.target, "seconds": round(seconds, 3)}
        return {"args": {}, "attributes": {**attributes, **({"batching": self.batching} if self.batching else {})}}

    def on_train_begin(self, args, state, control, **kwargs):
        self.run_start, self.start_step, self.began = None, state.global_step, True
        if state.global_step == 0:
            self.source = self.target = 0
            self.at_start = {"source": 0, "target": 0, "seconds": 0.0}
            return
        # resumed: the state is the checkpoint's
        attributes = saved_callback_attributes(state.stateful_callbacks, type(self).__name__)
        before = attributes.get("batching") or {}
        # (a checkpoint written before a setting was recorded says nothing about it)
        changed = ", ".join(f"{k} {before[k]} -> {v}" for k, v in (self.batching or {}).items()
                            if k in before and before[k] != v)  # fmt: skip
        if changed:
            logger.warning(
                "Resumed with other batching than the checkpoint was trained with (%s): the rest of its epoch is "
                "cut from the new batches (as many skipped as the checkpoint had trained), so some pairs of that "
                "epoch are trained twice or not at all. Resume with the checkpoint's settings to continue it exactly.",
                changed,
            )
        if {"source", "target", "seconds"} <= attributes.keys():
            self.source, self.target = int(attributes["source"]), int(attributes["target"])
            self.at_start = {"source": self.source, "target": self.target, "seconds": float(attributes["seconds"])}
        else:
            logger.warning("The resumed checkpoint does not record the tokens and time trained before it: the "
                           "training summary gives this run's figures only.")
            self.source = self.target = 0
            self.at_start = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.run_start is None:
            self.run_start = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Add the training wall time since update 1 (``elapsed_seconds``) to each log entry, for curves against time
        (``plots.learning_curve_by_time``); not when a resumed checkpoint lacked the earlier time."""
        # (before update 1, an evaluation on start: at the time training began)
        if self.at_start is None or (self.run_start is None and not self.began) or not state.log_history:
            return
        elapsed = round(self.at_start["seconds"] + self.run_seconds(), 3)
        state.log_history[-1]["elapsed_seconds"] = elapsed  # the Trainer appended a copy of `logs` before on_log
        if logs is not None:
            logs["elapsed_seconds"] = elapsed


class SaveAtEndCallback(TrainerCallback):
    """Save a checkpoint at the last update (once: nothing more when that update is saved anyway), so that the end of
    training is a checkpoint like the others, also with time-based saves or ``save_strategy="no"``, and is averaged.
    Added last: under ``save_strategy="epoch"`` a save asked for at an update that ends the epoch or the training
    waits for the epoch's end, which saves that update (saved twice, it was rewritten in place: a kill meanwhile
    spoiled a checkpoint that was complete)."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_training_stop or state.global_step >= state.max_steps:
            control.should_save = True
        epoch_ends = control.should_training_stop or float(state.epoch or 0).is_integer()
        if args.save_strategy == SaveStrategy.EPOCH and epoch_ends:
            control.should_save = False  # the epoch's end (transformers' DefaultFlowCallback) saves this update
        return control


class VaswaniSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's optimizer and schedule, token batches and a NaN/inf guard.

    Args (besides the Trainer's): ``max_tokens_per_batch`` for the :class:`~vaswani_transformer.data.TokenBatchSampler`
    (``None``: the Trainer's usual sentence batches).
    """

    def __init__(self, *args, max_tokens_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.train_sampler = None
        self._eval_sentence_losses = None  # (sentences, 2): each sentence's loss sum and target tokens (last batch)
        self._eval_loss_totals = None  # float64 [loss sum, target tokens] of the evaluation running now
        self.add_callback(TrainingTotalsCallback(batching={
            "max_tokens_per_batch": max_tokens_per_batch,
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
            "num_processes": self.args.world_size,
            # the epoch's order: its seed, whether it is shuffled, and how many pairs it orders
            "data_seed": self.args.seed if self.args.data_seed is None else self.args.data_seed,
            "shuffle": getattr(self.args, "train_sampling_strategy", "random") != "sequential",
            "train_pairs": len(self.train_dataset) if has_length(self.train_dataset) else None,
        }))  # fmt: skip
        if getattr(self.args, "save_every_minutes", None):
            self.add_callback(SaveEveryMinutesCallback(self.args.save_every_minutes))
        if getattr(self.args, "max_train_minutes", None):
            budget = TimeBudgetCallback(self.args.max_train_minutes, getattr(self.args, "lr_decay_minutes", None))
            self.add_callback(budget)
        self.add_callback(SaveAtEndCallback())  # after the callbacks that stop training

    # -- optimisation
    def create_optimizer(self, model=None):
        """The paper's Adam (:func:`build_optimizer`), or transformers' optimizer for any other ``--optim``."""
        if self.optimizer is None:
            if not uses_paper_optimizer(self.args):
                return super().create_optimizer(model)
            self.optimizer = build_optimizer(self.model if model is None else model, self.args)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if getattr(self.args, "lr_schedule", "hf") != "paper":
            if self.optimizer is not None and self.lr_scheduler is None:
                for group in self.optimizer.param_groups:
                    group["lr"] = self.args.learning_rate
            if getattr(self.args, "lr_decay_minutes", None) and self.lr_scheduler is None:  # placed by the clock
                decay = ClockedWarmupStableDecay(int(self.args.warmup_steps), **(self.args.lr_scheduler_kwargs or {}))
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, decay)
                self._created_lr_scheduler = True
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            d_model = self.accelerator.unwrap_model(self.model).config.d_model
            self.lr_scheduler = paper_lr_scheduler(
                optimizer or self.optimizer, d_model, int(self.args.warmup_steps), self.args.lr_factor
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Resuming restores the optimizer's rate with its state: the rate the checkpoint's schedule gave the next
        update. The paper schedule of this run (its lr_factor and warmup_steps, which may differ) sets it again, so the
        first resumed update uses this run's rate, as the later ones do. transformers' schedules (multiplier
        functions of the step) also get this run's learning_rate as their base: their saved state holds the
        checkpoint's, which would otherwise silently stay."""
        super()._load_optimizer_and_scheduler(checkpoint)
        scheduler = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # (accelerate's wrapper, if any)
        if checkpoint is None or not hasattr(scheduler, "lr_lambdas"):  # (reduce_lr_on_plateau: its state decides)
            return
        if getattr(self.args, "lr_schedule", "hf") != "paper":
            scheduler.base_lrs = [self.args.learning_rate] * len(scheduler.base_lrs)
            for group in self.optimizer.param_groups:
                group["initial_lr"] = self.args.learning_rate
        for group, base, rate in zip(self.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * rate(scheduler.last_epoch)
        # the rate transformers logs for an update (`get_last_lr`) came back from the checkpoint's scheduler state
        scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _get_grad_norm(self, model, grad_norm=None):
        """The gradient norm for the log, computed only for updates that will be logged when nothing clips.

        transformers computes it after every update (a pass over all gradients: ~1.5% of a small model's CPU step)
        for the log line alone. When `max_grad_norm` clips, the clipping's own norm is used as before; otherwise it
        is computed where the default flow logs this update (the first with `logging_first_step`, every
        `logging_steps`-th with the steps strategy, each update with any other strategy, where the log cannot be
        predicted).
        """
        if grad_norm is None and not self._update_is_logged(self.state.global_step + 1):
            return None
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def _update_is_logged(self, update: int) -> bool:
        """Whether transformers' DefaultFlowCallback logs after update number `update` (1-based)."""
        args = self.args
        if args.logging_strategy != IntervalStrategy.STEPS:
            return True
        return (update == 1 and args.logging_first_step) or update % max(1, self.state.logging_steps) == 0

    def floating_point_ops(self, inputs) -> int:
        """transformers' estimate for `total_flos` (6 x input tokens x non-embedding parameters), the parameters
        counted once per model instead of after every update."""
        model = self.model
        if getattr(self, "_counted_model", None) is not model:
            self._counted_model = model
            self._counted_parameters = (
                model.num_parameters(exclude_embeddings=True) if hasattr(model, "num_parameters") else None
            )
        main_input = getattr(model, "main_input_name", "input_ids")
        if self._counted_parameters is None or main_input not in inputs:
            return 0
        return 6 * inputs[main_input].numel() * self._counted_parameters

    # -- data
    def get_train_dataloader(self):
        """Token batches (:class:`~vaswani_transformer.data.TokenBatchSampler`, built from the dataset's length
        columns) for this rank, as the DataLoader's ``batch_sampler``; the Trainer calls its ``set_epoch``.

        As transformers' samplers: seeded with ``data_seed`` when given (else ``seed``); ``train_sampling_strategy``
        "sequential" keeps the batches in their length order (no shuffle); the other strategies (random,
        group_by_length, batch_rebalance) are what token batches already do: similar lengths, equal counts per rank.
        The ``dataloader_*`` worker arguments and worker seeding are transformers' (``Trainer._get_dataloader``).
        """
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        self.train_sampler = TokenBatchSampler.from_dataset(
            self.train_dataset,
            self.max_tokens_per_batch,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.seed if self.args.data_seed is None else self.args.data_seed,
            shuffle=getattr(self.args, "train_sampling_strategy", "random") != "sequential",
        )
        args = self.args
        # The worker settings and worker seeding of transformers' ``Trainer._get_dataloader`` for a training loader
        # (not its batch_size and drop_last, which a batch_sampler replaces, nor its column removal: the sampler
        # reads the length columns).
        seed_workers = functools.partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index)
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=self.train_sampler,
            collate_fn=self.data_collator,
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            multiprocessing_context=args.dataloader_multiprocessing_context,
            prefetch_factor=args.dataloader_prefetch_factor,
            in_order=args.dataloader_in_order,
            worker_init_fn=seed_workers,
        )
        loader = self.accelerator.prepare(loader)
        # The sampler already gives each rank its own batches: make accelerate's BatchSamplerShard a pass-through.
        # It has no set_epoch: after a resume's batch skipping wraps it, transformers reaches it, not the sampler
        # (which would give the rest of a later epoch in epoch 0's order); it passes the epoch on.
        shard = getattr(loader, "batch_sampler", None)
        if shard is not None and getattr(shard, "batch_sampler", None) is self.train_sampler:
            shard.num_processes, shard.process_index = 1, 0
            shard.set_epoch = self.train_sampler.set_epoch
        return loader

    def _get_eval_sampler(self, eval_dataset):
        """Validation and test sets in their own order, whatever ``train_sampling_strategy``: with group_by_length
        transformers would read them through a shuffled ``LengthGroupedSampler``, and the written translations and
        examples would not follow the test file's lines. (Several processes each get a share of this order, which
        :meth:`evaluation_loop` puts back together.)"""
        return SequentialSampler(eval_dataset) if eval_dataset is not None and has_length(eval_dataset) else None

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):  # fmt: skip
        """transformers' loop, gathering across processes with ``gather_for_metrics``: `Seq2SeqTrainer`'s evaluate and
        predict set a plain ``gather``, which keeps the sentences accelerate repeats to fill the last batch of every
        process, so that with several processes the predictions gained lines and BLEU counted sentences twice.
        (transformers' reason, several hypotheses per sentence with ``num_return_sequences``, is not translation
        scored against one reference per sentence.)

        The loss it reports is the mean over the set's target tokens (each sentence's sum and token count gathered as
        the predictions are): transformers' loop averages per-batch means weighted by sentences, so its loss changed
        with the batch size and the number of processes."""
        self.gather_function = functools.partial(
            self.accelerator.gather_for_metrics, use_gather_object=self.args.eval_use_gather_object
        )
        self._eval_loss_totals = torch.zeros(2, dtype=torch.float64)
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)  # fmt: skip
        finally:
            totals, self._eval_loss_totals = self._eval_loss_totals, None
        key = f"{metric_key_prefix}_loss"
        if key in output.metrics and totals[1] > 0:
            output.metrics[key] = float(totals[0] / totals[1])
        return output

    def _gather_sentence_losses(self) -> None:
        """Add the last batch's sentence loss sums and token counts, gathered from every process (the sentences
        accelerate repeats to fill a last batch dropped), to the running evaluation's totals."""
        sentences, self._eval_sentence_losses = self._eval_sentence_losses, None
        if sentences is None or self._eval_loss_totals is None:
            return
        sentences = self.accelerator.gather_for_metrics(sentences.to(self.args.device)).cpu()
        # every sentence: a non-finite loss shows (as in transformers' evaluation; logging_nan_inf_filter is training's)
        self._eval_loss_totals += sentences.sum(0)

    # -- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Label-smoothed cross-entropy (:func:`label_smoothed_cross_entropy`), for every eps.

        The same value as transformers' ``LabelSmoother`` ((1 - eps) * NLL + eps * mean over the vocabulary of -log p,
        per non-padding target token; summed and divided by ``num_items_in_batch`` when the Trainer gives it), without
        materialising the log-probabilities several times. eps = 0 (no ``label_smoother``) takes the same path: the
        model's own loss is a per-micro-batch mean, which the Trainer would take as already normalised by
        ``num_items_in_batch`` (wrong under accumulation or several processes). The labels stay out of the forward
        call (the model would compute its own loss too); the model's ``prepare_decoder_input_ids_from_labels``, the
        one rule that shifts labels, gives the decoder inputs.
        """
        if self.compute_loss_func is not None or "labels" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        epsilon = self.label_smoother.epsilon if self.label_smoother is not None else 0.0
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        unwrapped = self.accelerator.unwrap_model(model)
        if not model.training and getattr(unwrapped.config, "position_encoding", None) == "learned":
            # A reference longer than the learned positions (evaluation only: training filters such pairs): the loss
            # counts the tokens the decoder has positions for; BLEU scores it whole (prediction_step returns it whole).
            labels = labels[:, : unwrapped.config.max_position_embeddings]
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = unwrapped.prepare_decoder_input_ids_from_labels(labels)
        # in training, bf16 logits straight to the loss (outputs_in_compute_dtype)
        with outputs_in_compute_dtype(unwrapped) if model.training else nullcontext():
            outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        labels = labels.to(logits.device)
        divisor = (labels != -100).sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        scale = 1.0 / (divisor.to(logits.device) if torch.is_tensor(divisor) else divisor)
        if self._eval_loss_totals is None:
            loss = label_smoothed_cross_entropy(logits.flatten(0, 1), labels.flatten(), epsilon, scale)
        else:  # in evaluation_loop: each sentence's sum, for the mean over all the set's target tokens
            sums = torch.stack([label_smoothed_cross_entropy(row, row_labels, epsilon)
                                for row, row_labels in zip(logits, labels)])  # fmt: skip
            self._eval_sentence_losses = torch.stack([sums.double(), (labels != -100).sum(-1).double()], dim=1)
            loss = sums.sum() * scale
        if num_items_in_batch is not None:
            if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs:
                loss = loss * self.accelerator.num_processes  # as Trainer.compute_loss: DDP averages gradients
        return (loss, outputs) if return_outputs else loss

    # -- guard and counters
    @property
    def totals(self) -> TrainingTotalsCallback:
        """The training totals (the callback object itself: the Trainer may replace it when restoring callbacks)."""
        return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, TrainingTotalsCallback))

    def training_step(self, model, inputs, num_items_in_batch=None):
        target = int((inputs["labels"] != -100).sum()) if "labels" in inputs else 0
        source = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else 0
        loss = super().training_step(model, inputs, num_items_in_batch)
        # One reduction gives every process the finite flag and the token counts of all processes.
        local = torch.tensor([int(torch.isfinite(loss.detach()).all()), source, target], dtype=torch.int64)
        total = local if self.args.world_size == 1 else self.accelerator.reduce(local.to(loss.device), "sum").cpu()
        totals = self.totals
        totals.source += int(total[1])
        totals.target += int(total[2])
        if int(total[0]) != self.args.world_size:
            last = find_last_complete_checkpoint(self.args.output_dir, quarantine=False)
            saved = (f"The last checkpoint, {last}, is from before this update." if last is not None
                     else f"No checkpoint was written in {self.args.output_dir}.")  # fmt: skip
            raise NonFiniteLossError(
                f"Non-finite loss ({loss.item()}) at update {self.state.global_step + 1}: training stopped before "
                f"the optimizer step. {saved} Lower the peak learning rate (lr_factor) or disable fp16."
            )
        return loss

    # -- saving: a full disk stops training with the file named, earlier checkpoints intact
    def _stop_on_write_failure(self, error: BaseException, folder: str, checkpoint: bool) -> None:
        """Raise :class:`CheckpointWriteError` from ``error`` when it is a write that found no room; for a checkpoint,
        remove the half-written folder first (it frees room and can never be resumed or averaged)."""
        failure = write_failure(error, folder)
        if failure is None:
            return
        reason, path = failure
        message = f"{reason} while writing {path}: training stopped."
        if checkpoint and self.args.should_save:
            shutil.rmtree(folder, ignore_errors=True)
            last = find_last_complete_checkpoint(self.args.output_dir, quarantine=False)
            message += (f" The incomplete {folder} was removed; the earlier checkpoints are intact (the last complete "
                        f"one is {last}). Free some space, then resume with --resume_from_checkpoint latest."
                        if last else f" The incomplete {folder} was removed; no complete checkpoint was written.")
        stop = CheckpointWriteError(message)
        stop.errno, stop.path = getattr(error, "errno", None), path  # (a file name would change the message)
        raise stop from error

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:  # OSError, torch's RuntimeError, safetensors' own error type
            if isinstance(error, CheckpointWriteError):
                raise
            self._stop_on_write_failure(error, folder, checkpoint=True)
            raise
        self._saved_at_step = self.state.global_step

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, *args, **kwargs):
        """transformers' logging, evaluation and saving; a save asked for before it (the last update's, the time
        budget's, a timed one: `SaveAtEndCallback` and kin) is made under ``save_strategy="best"`` too, whose rule
        replaces the request by whether the evaluation found a new best (the run then ended without its last
        update saved, and averaged older checkpoints)."""
        asked = self.control.should_save
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, *args, **kwargs)
        if asked and getattr(self, "_saved_at_step", None) != self.state.global_step:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False, push: bool = True) -> None:
        """transformers' saving (pushing with `push_to_hub` where `push`); a failed write is a one-line error."""
        try:
            super().save_model(output_dir, _internal_call or not push)  # (transformers pushes unless internal)
        except Exception as error:
            if _internal_call or isinstance(error, CheckpointWriteError):
                raise  # a checkpoint's weights: _save_checkpoint reports it
            self._stop_on_write_failure(error, output_dir or self.args.output_dir, checkpoint=False)
            raise

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):  # fmt: skip
        """Resuming restores the checkpoint's trainer state, and with it (in transformers) the logging, evaluation and
        save intervals it was written with: the intervals given to this run apply instead, as every other flag does.
        A checkpoint at or past max_steps trains nothing more (transformers' loop would run one more update when
        max_steps ends inside an epoch: a finished job run again grew by an update each time)."""
        resumed = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                               resume_from_checkpoint, trial)  # fmt: skip
        self.state.compute_steps(self.args, max_steps)
        if resume_from_checkpoint is not None and max_steps > 0 and self.state.global_step >= max_steps:
            logger.info("The resumed checkpoint has %d updates, max_steps is %d: nothing more to train.",
                        self.state.global_step, max_steps)
            return num_train_epochs, 0  # no epoch left to run
        return resumed

    def _issue_warnings_after_load(self, load_result) -> None:
        """Resuming loads ``model.safetensors`` with ``load_state_dict(strict=False)``: the tied copies of the shared
        embedding (stored once by ``save_pretrained``) come back as "missing" though loading the shared matrix
        filled them. Only keys that are really absent are reported."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        missing = set(load_result.missing_keys)
        really_missing = [k for k in load_result.missing_keys if not (k in tied and tied[k] not in missing)]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=really_missing))

    def evaluate(self, *args, **kwargs):
        """transformers' evaluation, leaving torch's random state as it found it: its DataLoader draws a seed from
        torch's generator, so an evaluation during training would change every later dropout mask (the trained model
        would depend on ``eval_steps``)."""
        device = self.args.device
        on_accelerator = device.type not in ("cpu", "meta")  # the CPU generator is forked always
        with torch.random.fork_rng(devices=[device] if on_accelerator else [],
                                   device_type=device.type if on_accelerator else None):
            return super().evaluate(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Loss on the batch plus ``generate`` from the source only (the model's generation config: the paper's
        beam search). Unlike `Seq2SeqTrainer`, ``labels`` are not passed to ``generate``, and under mixed precision
        it decodes without autocast (`forward_as_saved`), as the saved model does."""
        if not self.args.predict_with_generate or prediction_loss_only:
            step = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
            self._gather_sentence_losses()
            return step
        inputs = self._prepare_inputs(inputs)
        if not gen_kwargs and hasattr(self, "_gen_kwargs"):
            gen_kwargs = self._gen_kwargs.copy()
        gen_kwargs = {k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)}
        generation_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask") if k in inputs}
        unwrapped = self.accelerator.unwrap_model(model)
        # Decoded as the saved model decodes (mixed precision's autocast would score other translations than the
        # published model's: its test BLEU, the length penalty chosen on validation); the loss keeps the training's
        # precision, as without predict_with_generate.
        with torch.no_grad(), forward_as_saved(unwrapped):
            generated = unwrapped.generate(**generation_inputs, **gen_kwargs)
        loss = None
        labels = inputs.get("labels")
        if labels is not None:
            with torch.no_grad(), self.compute_loss_context_manager():
                loss = self.compute_loss(model, dict(inputs)).detach()
        self._gather_sentence_losses()
        return loss, generated, labels

    def choose_length_penalty(self, dataset, values) -> dict[str, Any]:
        """Decode `dataset` (the validation split) with each length penalty (alpha) of `values` and keep the one with
        the best sacreBLEU in the model's generation config: `evaluation.choose_length_penalty`, the paper's choice on
        the development set. The decoding is `predict`'s, the test score's own. Returns that function's record plus
        the alpha before (``"default"``)."""
        if self.compute_metrics is None or not self.args.predict_with_generate:
            raise ValueError("Choosing the length penalty needs BLEU of generated translations: predict_with_generate "
                             "and compute_metrics.")
        model = self.accelerator.unwrap_model(self.model)
        default = model.generation_config.length_penalty

        def score(value: float) -> float:
            metrics = self.predict(dataset, metric_key_prefix="validation", length_penalty=value).metrics
            return metrics["validation_bleu"]

        record = choose_length_penalty(score, values)
        model.generation_config.length_penalty = record["chosen"]
        return {**record, "default": default}

    def create_model_card(self, *args, **kwargs):
        """The project's card, pipeline code and generation config in ``output_dir`` (``hub.write_model_card``)."""
        if args:
            raise TypeError("create_model_card takes keyword arguments only.")
        return write_model_card(self.args.output_dir, trainer=self, **kwargs)

    def save_state(self):
        """``trainer_state.json`` and, next to it, the run's arguments as ``training_args.json`` (tokens masked, as
        ``TrainingArguments.to_dict`` does): read by the card and ``plots.learning_rate_schedule``."""
        try:
            super().save_state()
            if self.is_world_process_zero():
                path = Path(self.args.output_dir, TRAINING_ARGS_JSON)
                path.write_text(self.args.to_json_string() + "\n", encoding="utf-8")
        except (OSError, RuntimeError) as error:
            if not isinstance(error, CheckpointWriteError):
                self._stop_on_write_failure(error, self.args.output_dir, checkpoint=False)
            raise

    def training_summary(self) -> dict[str, Any]:
        """What training did, summed over processes. ``updates``, ``*_tokens_seen``, ``wall_time_seconds`` and
        ``target_tokens_per_second`` cover all training since update 1 (validation and saves during it included, as
        in transformers' ``train_runtime``; carried across resumes in the checkpoints;
        None when a resumed checkpoint did not record them); the ``*_this_run`` figures cover this run only;
        ``max_tokens_per_batch`` when batching by tokens (the card of a run folder reads it from there)."""
        totals, start = self.totals, self.totals.at_start
        run_seconds = totals.run_seconds()
        updates = int(self.state.global_step)
        run = {
            "updates": updates - totals.start_step,
            "source_tokens": totals.source - (start or {}).get("source", 0),
            "target_tokens": totals.target - (start or {}).get("target", 0),
            "wall_time_seconds": round(run_seconds, 2),
        }
        seconds = start["seconds"] + run_seconds if start is not None else None
        return {
            "updates": updates,
            "source_tokens_seen": totals.source if start is not None else None,
            "target_tokens_seen": totals.target if start is not None else None,
            "wall_time_seconds": round(seconds, 2) if seconds is not None else None,
            "target_tokens_per_second": round(totals.target / seconds, 1) if seconds else None,
            **{f"{k}_this_run": v for k, v in run.items()},
            "num_processes": int(self.args.world_size),
            **({"max_tokens_per_batch": self.max_tokens_per_batch} if self.max_tokens_per_batch else {}),
        }


__all__ = [
    "LR_SCHEDULES",
    "CheckpointWriteError",
    "ClockedWarmupStableDecay",
    "NonFiniteLossError",
    "SaveAtEndCallback",
    "SaveEveryMinutesCallback",
    "TRAINING_ARGS_JSON",
    "TimeBudgetCallback",
    "TrainingTotalsCallback",
    "VaswaniSeq2SeqTrainer",
    "build_optimizer",
    "gradient_accumulation_for",
    "keep_onednn_primitives",
    "paper_learning_rate",
    "paper_lr_scheduler",
    "rank0_decides",
    "rank0_values",
    "skip_cudnn_attention",
    "uses_paper_optimizer",
    "write_failure",
]
