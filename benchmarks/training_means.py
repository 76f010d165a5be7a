"""Issue 15's means, each against the recipe's own training step, the two alternating update by update in one process.

The shared 2-core host this project measures on drifts in speed by up to a third within an hour, so two settings
timed in separate processes minutes apart can differ by more than any of these means does. Here each change is a
second copy of the model (the same initial weights, its own fused Adam) stepped on the same Multi30k token batches as
the recipe's step, the two alternating update by update (the recipe's step first on even updates, the changed one
first on odd ones): drift and caches hit both alike.

The recipe's step is how `configs/multi30k_cpu.yaml` trains: our model, bf16 autocast where the device multiplies
bf16 in hardware (fp32 elsewhere) with the attention kernel `train.training_attention` picks, our dropout, the
blocked label-smoothed loss (`trainer.label_smoothed_cross_entropy`) on logits in the compute dtype, fused Adam;
the kernel settings of `train.prepare_kernels` (on a GPU, attention kept off cuDNN's kernel, as the training job does).
Each row changes one thing:

* `compile`: `torch.compile(model, dynamic=True)` (compiled during the untimed warm-up; its seconds are printed);
* `attention`: the other attention kernel (SDPA where the recipe uses eager, and the reverse);
* `bernoulli-dropout`: torch's `nn.Dropout` (`bernoulli_`) in place of ours, which draws 16 random bits per element;
* `plain-loss`: `F.cross_entropy(logits.float(), label_smoothing=0.1)` in place of the blocked loss;
* `fp32-logits`: the logits cast to float32 before the loss, as accelerate's mixed-precision wrapper returned them
  before `trainer.outputs_in_compute_dtype`;
* `bf16-model`: the model in bf16 with float32 master weights for fused Adam, no autocast;
* `sparse-embedding-grads`: the token embeddings, tied to the output layer, give sparse gradients that the output
  layer's dense gradient takes (the zeroed vocabulary-sized gradient of each lookup: 3 ms of the small model's
  update, 13 of the base one's, in a profile);
* `cast-once`: each attention layer's float32 input cast to bf16 once for its Q, K and V projections, not once per
  projection as autocast does (their gradients then sum in bf16: a numerics change);
* `compile-sublayers`: `torch.compile(dynamic=True)` of each residual connection (dropout, add, LayerNorm) only;
* `unpadded-softmax`: the attention's softmax over fewer keys than a float32 vector holds by torch's kernel as it is,
  not padded to a vector's (`modeling_vaswani_transformer.softmax_over_keys`): the recipe's step before that change;
* `fp32-kernel`: float32 linear products (forward and gradients) by the other kernel: torch's own (MKL) where the
  recipe's step sends them to oneDNN (`modeling_vaswani_transformer._ONEDNN_FP32_FASTER`: Zen 5 and later AVX-512
  CPUs not Intel's), oneDNN elsewhere; only a float32 step has such products (`--bf16 no`).

The speed column is the recipe's time over the changed step's: below 1x the change is slower. On a GPU our dropout
and loss are torch's own, so those rows are skipped there; in fp32 (no native bf16) `fp32-logits`, `bf16-model` and
`cast-once` are.

    python benchmarks/training_means.py                          # small model, 1024-token batches, all rows
    python benchmarks/training_means.py --means compile attention --steps 100
    python benchmarks/training_means.py --bf16 no --means fp32-kernel unpadded-softmax   # the float32 step

Needs ../shared/data/multi30k (relative to the repository root); trains (once, cached in `--cache-dir`) the recipe's
8k BPE vocabulary.
"""

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from device import add_device_argument, check_device, describe, now  # noqa: E402
from training_token_batches import attention_for, build, model_config, optimizer_step, prepare_batches  # noqa: E402

from vaswani_transformer import modeling_vaswani_transformer as modeling  # noqa: E402
from vaswani_transformer.modeling_vaswani_transformer import Dropout, MultiHeadAttention  # noqa: E402
from vaswani_transformer.modeling_vaswani_transformer import SublayerConnection  # noqa: E402
from vaswani_transformer.train import prepare_kernels  # noqa: E402
from vaswani_transformer.hardware import has_native_bf16  # noqa: E402
from vaswani_transformer.trainer import label_smoothed_cross_entropy  # noqa: E402

MEANS = ("compile", "attention", "bernoulli-dropout", "plain-loss", "fp32-logits", "bf16-model",
         "sparse-embedding-grads", "cast-once", "compile-sublayers", "unpadded-softmax", "fp32-kernel")  # fmt: skip
CPU_ONLY = ("bernoulli-dropout", "plain-loss")  # elsewhere ours are torch's own dropout and cross-entropy
BF16_ONLY = ("fp32-logits", "bf16-model", "cast-once")


class Step:
    """One model and its optimizer, and how its training step computes: `step(batch)` returns its seconds."""

    def __init__(self, model, device, bf16: bool, loss: str = "blocked", fp32_logits: bool = False,
                 constants: dict | None = None):
        self.model, self.raw, self.device = model, getattr(model, "_orig_mod", model), device
        self.constants = constants or {}  # other values of the modeling file's module constants during this step
        self.autocast = bf16 and next(self.raw.parameters()).dtype == torch.float32
        self.loss, self.fp32_logits = loss, fp32_logits
        self.masters = None
        if next(self.raw.parameters()).dtype == torch.bfloat16:  # a bf16 model: Adam updates float32 masters
            self.masters = [p.detach().float() for p in self.raw.parameters()]
        weights = self.masters or list(self.raw.parameters())
        self.optimizer = torch.optim.Adam(weights, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def __call__(self, batch: dict) -> float:
        kept = {name: getattr(modeling, name) for name in self.constants}
        for name, value in self.constants.items():
            setattr(modeling, name, value)
        try:
            return self._step(batch)
        finally:
            for name, value in kept.items():
                setattr(modeling, name, value)

    def _step(self, batch: dict) -> float:
        start = now(self.device)
        labels = batch["labels"]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            decoder_input_ids = self.raw.prepare_decoder_input_ids_from_labels(labels)
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                decoder_input_ids=decoder_input_ids).logits  # fmt: skip
        logits = logits.float() if self.fp32_logits else logits
        flat, targets, real = logits.flatten(0, 1), labels.flatten(), (labels != -100).sum()
        if self.loss == "plain":
            loss = F.cross_entropy(flat.float(), targets, ignore_index=-100, label_smoothing=0.1, reduction="sum") / real
        else:
            loss = label_smoothed_cross_entropy(flat, targets, 0.1, 1 / real)
        loss.backward()
        optimizer_step(self.raw, self.optimizer, self.masters)
        return now(self.device) - start


def with_torch_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each of our `Dropout` modules replaced by torch's `nn.Dropout` of the same rate."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, torch.nn.Dropout(child.p))
    return model


def with_sparse_embedding_gradients(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with the token embeddings that share the output layer's weight giving sparse gradients: the output
    layer's dense gradient takes their rows, instead of a vocabulary-sized zeroed gradient per lookup."""
    tied = model.get_output_embeddings().weight
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.weight is tied:
            module.sparse = True
    return model


def _cast_attention_inputs(module, args, kwargs):
    """Forward pre-hook: under autocast, the attention layer's inputs in the autocast dtype (one cast each)."""
    device_type = args[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    if kwargs.get("key_value_states") is not None:
        kwargs["key_value_states"] = kwargs["key_value_states"].to(dtype)
    return (args[0].to(dtype), *args[1:]), kwargs


def with_attention_inputs_cast_once(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each attention layer's input cast to the autocast dtype once for its Q, K and V projections
    (autocast casts a float32 input once per projection); the projections' input gradients then meet in that dtype."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.register_forward_pre_hook(_cast_attention_inputs, with_kwargs=True)
    return model


def with_compiled_sublayer_connections(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each residual connection (dropout, add, LayerNorm) compiled: `torch.compile(dynamic=True)`."""
    for module in model.modules():
        if isinstance(module, SublayerConnection):
            module.compile(dynamic=True)
    return model


def changed_step(means: str, config, device, bf16: bool, attention: str) -> tuple[str, Step]:
    """(the row's description, the step with `means` applied)."""
    other = "sdpa" if attention == "eager" else "eager"
    model = build("ours", copy.deepcopy(config), other if means == "attention" else attention).to(device).train()
    if means == "compile":
        return "torch.compile(model, dynamic=True)", Step(torch.compile(model, dynamic=True), device, bf16)
    if means == "attention":
        return f"{other} attention instead of {attention}", Step(model, device, bf16)
    if means == "bernoulli-dropout":
        return "torch's nn.Dropout (bernoulli_) instead of ours", Step(with_torch_dropout(model), device, bf16)
    if means == "plain-loss":
        return "F.cross_entropy(logits.float()) instead of the blocked loss", Step(model, device, bf16, loss="plain")
    if means == "fp32-logits":
        return "logits cast to float32 before the loss", Step(model, device, bf16, fp32_logits=True)
    if means == "bf16-model":
        return "bf16 model, float32 master weights, no autocast", Step(model.to(torch.bfloat16), device, bf16)
    if means == "sparse-embedding-grads":
        return "sparse embedding gradients, into the tied output layer's", Step(
            with_sparse_embedding_gradients(model), device, bf16
        )
    if means == "cast-once":
        return "attention inputs cast once, not per projection", Step(
            with_attention_inputs_cast_once(model), device, bf16
        )
    if means == "unpadded-softmax":
        return "softmax over few keys not padded", Step(model, device, bf16, constants={"_SOFTMAX_FAST_KEYS": 0})
    if means == "fp32-kernel":
        kernels = ("oneDNN", "MKL") if modeling._ONEDNN_FP32_FASTER else ("MKL", "oneDNN")
        return f"float32 products by {kernels[1]}, not {kernels[0]}", Step(
            model, device, bf16, constants={"_ONEDNN_FP32_FASTER": not modeling._ONEDNN_FP32_FASTER}
        )
    if means == "compile-sublayers":
        return "compiled residual connections only", Step(with_compiled_sublayer_connections(model), device, bf16)
    raise ValueError(f"unknown means {means!r}; one of {MEANS}")


def compare(recipe: Step, changed: Step, batches: list, warmup: int) -> tuple[float, float, float]:
    """(seconds of the changed step's warm-up, mean seconds per update of the recipe's step, of the changed step)."""
    start = time.perf_counter()
    for batch in batches[:warmup]:
        changed(batch)
    warmup_seconds = time.perf_counter() - start
    ours, theirs = [], []
    for i, batch in enumerate(batches[warmup:]):
        if i % 2 == 0:
            ours.append(recipe(batch))
            theirs.append(changed(batch))
        else:
            theirs.append(changed(batch))
            ours.append(recipe(batch))
    return warmup_seconds, statistics.fmean(ours), statistics.fmean(theirs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--means", nargs="+", choices=MEANS, default=list(MEANS), help="rows to run")
    parser.add_argument("--preset", default="small", help="small (the Multi30k CPU recipe's model), base or big")
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per side per batch (recipe: 1024)")
    parser.add_argument("--steps", type=int, default=80, help="timed updates of each of the two steps per row")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates of each step first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--bf16", choices=("auto", "no"), default="auto",
                        help="auto: the recipe's step (bf16 autocast where the device multiplies bf16 natively); "
                             "no: the float32 step")  # fmt: skip
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--cache-dir", default=str(REPO / "runs" / "benchmark_cache"))
    add_device_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = check_device(args.device)
    prepare_kernels(device)  # as train.py does, for both steps
    bf16 = has_native_bf16(device.type) and args.bf16 == "auto"
    skipped = [*(CPU_ONLY if device.type != "cpu" else ()), *(BF16_ONLY if not bf16 else ())]
    if bf16 or device.type != "cpu" or not modeling._HAS_ONEDNN_LINEAR:
        skipped.append("fp32-kernel")
    means = [m for m in args.means if m not in skipped]
    with tempfile.TemporaryDirectory() as tmp:
        config = model_config(args.preset, prepare_batches(args, Path(tmp)))
        batches = [{name: tensor.to(device) for name, tensor in batch.items()}
                   for batch in torch.load(Path(tmp) / "token.pt")]  # fmt: skip
    attention = attention_for(bf16, device)
    print(f"{args.preset} model (d_model {config.d_model}, {config.encoder_layers}+{config.decoder_layers} layers, "
          f"vocabulary {config.vocab_size}), the recipe's step: {'bf16 autocast' if bf16 else 'fp32'}, {attention} "
          f"attention; {args.warmup} untimed + {args.steps} timed updates of each step per row, alternating, on the "
          f"same Multi30k token batches of <= {args.max_tokens} tokens; {describe(device)}")
    print("| change | ms / update, changed | ms / update, the recipe's step | speed vs the recipe's step | warm-up s |")
    print("| --- | --- | --- | --- | --- |")
    for name in means:
        recipe = Step(build("ours", copy.deepcopy(config), attention).to(device).train(), device, bf16)
        for batch in batches[: args.warmup]:
            recipe(batch)
        label, changed = changed_step(name, config, device, bf16, attention)
        warmup, ours, theirs = compare(recipe, changed, batches, args.warmup)
        print(f"| {label} | {1000 * theirs:.0f} | {1000 * ours:.0f} | {ours / theirs:.2f}x | {warmup:.0f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
