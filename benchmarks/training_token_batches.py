"""Training on real Multi30k batches: our model and recipe's step against HF MarianMTModel at the same configuration.

Issue 15, section 1 (a) and (b). Rows, each timed in its own process on a CPU (models alternating, `--rounds`
times), then ours against MarianMT on the token batches in one process per precision, alternating update by update:
the host this project measures on drifts by up to a third within an hour, more than separate processes can tell
apart.

* ours, token batches: our model on the recipe's `TokenBatchSampler` batches (at most `--max-tokens` tokens per side,
  padding included), our loss (`trainer.label_smoothed_cross_entropy`), fused Adam; bf16 autocast with the kernel
  `train.training_attention` picks (eager on a CPU), fp32 with SDPA;
* marian, token batches: `MarianMTModel` configured identically (ReLU, sinusoids, scaled and shared embeddings, tied
  output layer) on the *same* batches, transformers' `LabelSmoother` (what `Seq2SeqTrainer` uses for label smoothing
  0.1), fused Adam, the same kernel per precision (the faster one for Marian too: training_step_speed.py);
* marian, standard recipe: the same, on random batches of 64 sentences (run_translation.py's
  `per_device_train_batch_size 64`), so padded to the longest of 64 random sentences;
* with `--bf16-model`, ours as a bf16 model with float32 master weights (issue 15's "keep bf16 compute weights
  between steps"): weights and activations bf16 throughout, no autocast; the gradients are copied to float32 masters
  that fused Adam updates, and the updated weights copied back.

Runs on `--device` (default: a CUDA GPU when one is present, else the CPU), named in the table's header. On a GPU
the rows run in this process (a new one would spend longer starting CUDA than timing), the memory column is
PyTorch's peak of allocated GPU memory, reset per row, instead of the process's peak RSS, and both models' attention
skips cuDNN's kernel, as the training job does (`trainer.skip_cudnn_attention`: it plans every new batch shape).

Real target tokens/s counts non-padding target tokens. Model FLOPs are `flops.training_flops` of each batch's real
target tokens at its mean real lengths; MFU divides their rate by a matrix-product peak measured in this run.

    python benchmarks/training_token_batches.py                                        # small model, 1024 tokens
    python benchmarks/training_token_batches.py --preset base --max-tokens 2048 --steps 6 --warmup 2
    python benchmarks/training_token_batches.py --seen-shapes          # after the recipe's first epoch (see --help)

Needs ../shared/data/multi30k (relative to the repository root); trains (once, cached in `--cache-dir`) the recipe's
8k BPE vocabulary.
"""

import argparse
import contextlib
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from device import add_device_argument, check_device, describe, matmul_peaks, memory_label, now  # noqa: E402
from device import peak_memory_mib, reset_peak_memory  # noqa: E402

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration  # noqa: E402
from vaswani_transformer.flops import model_flops_utilization, training_flops  # noqa: E402
from vaswani_transformer.train import prepare_kernels  # noqa: E402
from vaswani_transformer.hardware import has_native_bf16  # noqa: E402
from vaswani_transformer.trainer import label_smoothed_cross_entropy  # noqa: E402

SMALL = dict(d_model=256, d_ff=1024, num_heads=4, encoder_layers=3, decoder_layers=3, dropout=0.05)  # the CPU recipe


def recipe_precision(precisions: list[str], native: bool) -> tuple[str, str]:
    """The precision of ours to set against MarianMT's standard recipe, and how to name it: the one the CPU recipe
    trains in on this device (`bf16_where_native`: bf16 where the device has native bf16, else fp32) when it was
    timed; otherwise fp32, saying that the recipe's bf16 was not timed (`--bf16 no`)."""
    recipe = "bf16" if native else "fp32"
    if recipe in precisions:
        return recipe, f"as the CPU recipe trains here ({recipe})"
    return "fp32", "in fp32 (the CPU recipe trains in bf16 here, not timed: --bf16 no)"


def model_config(preset: str, tokenizer_fields: dict) -> VaswaniTransformerConfig:
    """The Multi30k CPU recipe's small model ("small") or a paper preset, over the benchmark's vocabulary."""
    fields = SMALL if preset == "small" else {}
    return VaswaniTransformerConfig.from_preset("base" if preset == "small" else preset, **tokenizer_fields, **fields)


def prepare_batches(args, folder: Path) -> dict:
    """Tokenise Multi30k train once; save the first token batches and random 64-sentence batches to `folder`."""
    from vaswani_transformer.data import TokenBatchSampler, TranslationDataCollator, load_parallel_dataset
    from vaswani_transformer.data import iter_parallel_texts, tokenize_parallel_dataset
    from vaswani_transformer.tokenization import config_kwargs_from_tokenizer, train_tokenizer
    from transformers import AutoTokenizer

    raw = load_parallel_dataset(train_file=str(args.data / "train"), source_lang="en", target_lang="de")
    cache = Path(args.cache_dir) / "tokenizer"
    if (cache / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(cache)
    else:
        texts = iter_parallel_texts(raw, "en", "de", split="train")
        tokenizer = train_tokenizer(texts, vocab_size=8000, length=2 * len(raw["train"]), output_dir=cache)
    tokenized, _ = tokenize_parallel_dataset(raw, tokenizer, "en", "de", max_source_tokens=args.max_tokens,
                                             max_target_tokens=args.max_tokens)  # fmt: skip
    train = tokenized["train"]
    collate = TranslationDataCollator(tokenizer)
    count = args.warmup + args.steps
    token_batches = list(TokenBatchSampler.from_dataset(train, args.max_tokens, seed=1))[:count]
    order = np.random.default_rng(1).permutation(len(train))
    sentence_batches = [order[i * 64 : (i + 1) * 64].tolist() for i in range(count)]
    for name, batches in (("token", token_batches), ("sentences64", sentence_batches)):
        torch.save([collate([train[i] for i in batch]) for batch in batches], folder / f"{name}.pt")
    return config_kwargs_from_tokenizer(tokenizer)


def build(kind: str, config: VaswaniTransformerConfig, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "ours":
        config._attn_implementation = attention
        return VaswaniTransformerForConditionalGeneration(config)
    from transformers import MarianConfig, MarianMTModel

    marian = MarianConfig(
        vocab_size=config.vocab_size, d_model=config.d_model, encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers, encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads, encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff,
        activation_function="relu", scale_embedding=True, dropout=config.dropout, attention_dropout=0.0,
        activation_dropout=0.0, max_position_embeddings=1024, pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
    )  # fmt: skip
    marian._attn_implementation = attention
    return MarianMTModel(marian)


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, masters: list | None) -> None:
    """One Adam update; with float32 `masters` of a bf16 model, their gradients in and the updated weights out."""
    if masters is not None:
        for master, parameter in zip(masters, model.parameters()):
            master.grad, parameter.grad = parameter.grad.float(), None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if masters is not None:
        with torch.no_grad():
            torch._foreach_copy_(list(model.parameters()), masters)


def make_step(kind: str, config: VaswaniTransformerConfig, precision: str, device: torch.device):
    """`step(batch)` trains `kind` ("ours" or "marian") for one update of `precision` ("fp32", "bf16"
    autocast or "bf16-model") as its row describes; returns (seconds, real target tokens, model FLOPs)."""
    from transformers.models.marian.modeling_marian import shift_tokens_right
    from transformers.trainer_pt_utils import LabelSmoother

    bf16 = precision == "bf16"
    attention = attention_for(bf16 or precision == "bf16-model", device)
    model = build(kind, copy.deepcopy(config), attention).to(device).train()
    masters = None
    if precision == "bf16-model":
        model = model.to(torch.bfloat16)
        masters = [p.detach().float() for p in model.parameters()]
    optimizer = torch.optim.Adam(masters or model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    smoother = LabelSmoother(epsilon=0.1)

    def step(batch: dict) -> tuple[float, int, float]:
        labels = batch["labels"]
        if kind == "marian":  # transformers' collator gives Marian its decoder inputs
            decoder_inputs = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
        start = now(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if kind == "ours":
                decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           decoder_input_ids=decoder_inputs).logits  # fmt: skip
        real = labels != -100
        if kind == "ours":
            loss = label_smoothed_cross_entropy(logits.flatten(0, 1), labels.flatten(), 0.1, 1 / real.sum())
        else:
            loss = smoother({"logits": logits}, labels)
        loss.backward()
        optimizer_step(model, optimizer, masters)
        seconds = now(device) - start
        target_tokens = int(real.sum())
        source_length = float(batch["attention_mask"].sum()) / len(labels)
        return seconds, target_tokens, training_flops(config, target_tokens, source_length, target_tokens / len(labels))

    return step


def child(args) -> dict:
    """Time one (model, batches, precision) setting, or with kind "alternate" ours and MarianMT alternating update by
    update on the token batches (on a CPU in a fresh process, whose peak RSS is the setting's own)."""
    kind, batches_name, precision = args.child.split(",")
    device = check_device(args.device)
    prepare_kernels(device)  # as train.py does, for both models
    reset_peak_memory(device)  # on a GPU rows share this process; on a CPU this is a fresh one
    batches = [{name: tensor.to(device) for name, tensor in batch.items()}
               for batch in torch.load(Path(args.batches_dir) / f"{batches_name}.pt")]  # fmt: skip
    config = model_config(args.preset, json.loads(args.tokenizer_fields))
    if kind == "alternate":
        return alternate(config, precision, device, batches, args.warmup, args.seen_shapes)
    step = make_step(kind, config, precision, device)
    if args.seen_shapes:  # an untimed first pass over the same batches: their shapes' kernels are compiled and kept
        for batch in batches:
            step(batch)
    seconds, tokens, flops = 0.0, 0, 0.0
    profiler = None
    if args.profile and device.type == "cuda":
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        profiler = torch.profiler.profile(activities=activities)
    elif args.profile:
        profiler = OperatorTimes()
    with contextlib.ExitStack() as profiling:  # the profiler, from the first timed update to the last
        for index, batch in enumerate(batches):
            if profiler is not None and index == args.warmup:
                profiling.enter_context(profiler)
            spent, target_tokens, batch_flops = step(batch)
            if index >= args.warmup:  # warm-up steps are not timed
                seconds, tokens, flops = seconds + spent, tokens + target_tokens, flops + batch_flops
    peak_memory = peak_memory_mib(device)  # a fresh process: the peak of this setting alone
    steps = len(batches) - args.warmup
    shares = None
    if profiler is not None:
        shares = profile_shares(profiler.seconds if isinstance(profiler, OperatorTimes) else kernel_times(profiler))
    return {"ms": 1000 * seconds / steps, "tok_s": tokens / seconds, "flop_s": flops / seconds, "memory": peak_memory,
            "attention": attention_for(precision != "fp32", device), "profile": shares}


def alternate(config, precision: str, device: torch.device, batches: list, warmup: int, seen_shapes: bool) -> dict:
    """Ours and MarianMT in one process, alternating update by update on the same batches (ours first on even
    updates, Marian first on odd ones), so that the host's drift hits both alike: mean ms / update of each."""
    steps = {kind: make_step(kind, config, precision, device) for kind in ("ours", "marian")}
    for batch in batches if seen_shapes else batches[:warmup]:
        for step in steps.values():
            step(batch)
    seconds = dict.fromkeys(steps, 0.0)
    for index, batch in enumerate(batches[warmup:]):
        for kind in ("ours", "marian") if index % 2 == 0 else ("marian", "ours"):
            seconds[kind] += steps[kind](batch)[0]
    return {kind: 1000 * spent / (len(batches) - warmup) for kind, spent in seconds.items()}


# Where the time of a training step goes: torch ops (self CPU time) by what they do.
PROFILE_GROUPS = {
    # (our float32 linear layers multiply through oneDNN on AMD CPUs with AVX-512: "Training" in the README)
    "matrix products (mm, addmm, bmm, oneDNN's linear)": ("aten::mm", "aten::addmm", "aten::bmm",
                                                          "mkldnn::_linear_pointwise"),
    "dropout masks (random numbers)": ("aten::bernoulli_", "aten::random_"),
    "loss over the vocabulary (log-softmax, exp)": ("aten::_log_softmax", "aten::_log_softmax_backward_data",
                                                    "aten::exp_", "aten::logsumexp", "aten::nll_loss_forward",
                                                    "aten::nll_loss_backward"),  # fmt: skip
    "precision casts (bf16 <-> fp32)": ("aten::copy_", "aten::_to_copy"),
    "attention softmax": ("aten::_softmax", "aten::_softmax_backward_data"),
    "layer norm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "optimizer (fused Adam)": ("aten::_fused_adam_", "aten::_fused_adamw_"),
}


class OperatorTimes(TorchDispatchMode):
    """Within the block, the wall time of every operator torch runs (forward, autograd's backward, the optimizer),
    summed per operator name as torch.profiler names them ("aten::mm"): `seconds`. Each call is timed as a whole,
    the operators it calls inside included, once. On a CPU, where a training step runs thousands of small operators,
    torch.profiler's own cost lands in each operator's time (a cast's nested copy, empty and as_strided each a
    record) and inflates the small ones' share; this costs a Python call around each operator, outside its timer."""

    def __init__(self):
        super().__init__()
        self.seconds: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        result = func(*args, **(kwargs or {}))
        spent = time.perf_counter() - start
        name = func._schema.name
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        return result


def kernel_times(profiler: torch.profiler.profile) -> dict[str, float]:
    """GPU kernel time per operator name of a profiled run (the operators' rows: their device time is that of the
    kernels they launched; the kernels' own rows would count twice)."""
    events = [e for e in profiler.key_averages() if e.device_type == torch.autograd.DeviceType.CPU]
    return {e.key: e.self_device_time_total / 1e6 for e in events}


def profile_shares(seconds: dict[str, float]) -> dict[str, float]:
    """Share of the time per `PROFILE_GROUPS` entry, from time per operator name, the rest as elementwise and
    other ops."""
    total = sum(seconds.values())
    shares = {group: sum(seconds.get(name, 0.0) for name in names) / total for group, names in PROFILE_GROUPS.items()}
    shares["elementwise and other ops (adds, masks, ReLU, ...)"] = 1.0 - sum(shares.values())
    return shares


def attention_for(bf16: bool, device: torch.device) -> str:
    """The kernel the training job picks (`train.training_attention`), SDPA where it picks the model's default."""
    from vaswani_transformer.train import training_attention

    training_args = SimpleNamespace(bf16=bf16, device=device)
    return training_attention(SimpleNamespace(attn_implementation=None), training_args) or "sdpa"


def run_child(args, folder: Path, tokenizer_fields: dict, setting: str, profile: bool = False) -> dict:
    """`child` of one setting: in a new Python process on a CPU; in this one on a GPU, where a process costs more
    than a setting's updates (CUDA's start) and peak memory is PyTorch's, reset per setting."""
    if check_device(args.device).type == "cuda":
        own = copy.copy(args)
        own.child, own.profile, own.batches_dir, own.tokenizer_fields = setting, profile, folder, json.dumps(
            tokenizer_fields)
        return child(own)
    options = ["--preset", args.preset, "--max-tokens", args.max_tokens, "--steps", args.steps, "--warmup", args.warmup,
               *(["--profile"] if profile else []), *(["--seen-shapes"] if args.seen_shapes else []),
               "--threads", torch.get_num_threads(), "--batches-dir", folder,
               "--tokenizer-fields", json.dumps(tokenizer_fields), "--device", args.device,
               "--child", setting]  # fmt: skip
    done = subprocess.run([sys.executable, __file__, *map(str, options)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {setting} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def results_median(results: dict, key: tuple) -> dict:
    """The run of a setting with the median real tokens/s; of an even number, the slower middle one (its other
    figures come with it: a run, not a mean of two). It took the faster one: with 2 rounds, the best."""
    runs = sorted(results[key], key=lambda run: run["tok_s"])
    return runs[(len(runs) - 1) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", help="small (the Multi30k CPU recipe's model), base or big")
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per side per batch (recipe: 1024)")
    parser.add_argument("--steps", type=int, default=30, help="timed updates per setting")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates first")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each setting runs (median shown; of an even number, the slower middle run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto",
                        help="also time bf16 autocast; auto: where the CPU multiplies bf16 in hardware")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--cache-dir", default=str(REPO / "runs" / "benchmark_cache"))
    parser.add_argument("--seen-shapes", action="store_true",
                        help="train on every batch once, untimed, before the warm-up and timed updates: the steady "
                             "state of a recipe after its first epoch, whose batch shapes oneDNN has compiled kernels "
                             "for (bf16 on a CPU; a 30-update run otherwise times their compilation as well)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one more run of each token-batch row and print where the time goes")
    parser.add_argument("--bf16-model", action="store_true",
                        help="with bf16: also ours as a bf16 model with float32 master weights (no autocast)")
    add_device_argument(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batches-dir", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-fields", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        return print(json.dumps(child(args)))
    device = check_device(args.device)
    with_bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and has_native_bf16(device.type))
    precisions = ["fp32"] + (["bf16"] if with_bf16 else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer_fields = prepare_batches(args, folder)
        config = model_config(args.preset, tokenizer_fields)
        size, peak = matmul_peaks(precisions, device)
        print(f"{args.preset} model (d_model {config.d_model}, d_ff {config.d_ff}, h {config.num_heads}, "
              f"{config.encoder_layers}+{config.decoder_layers} layers, vocabulary {config.vocab_size}), Multi30k "
              f"train batches: token batches of <= {args.max_tokens} tokens per side, or random 64 sentences; "
              f"{'an untimed pass over the batches, then ' if args.seen_shapes else ''}"
              f"{args.warmup} untimed + {args.steps} timed updates, median of {args.rounds} runs; {describe(device)}, "
              f"native bf16 {has_native_bf16(device.type)}; measured {size}^3 matmul peak "
              + ", ".join(f"{p} {peak[p] / 1e9:.0f} GFLOP/s" for p in precisions))
        settings = [("marian", "token"), ("ours", "token"), ("marian", "sentences64")]
        results: dict[tuple, list[dict]] = {}
        keys = [(kind, batches, precision) for precision in precisions for kind, batches in settings]
        if args.bf16_model and with_bf16:
            keys.append(("ours", "token", "bf16-model"))
        for _ in range(args.rounds):
            for key in keys:
                results.setdefault(key, []).append(run_child(args, folder, tokenizer_fields, ",".join(key)))
        alternating = {precision: run_child(args, folder, tokenizer_fields, f"alternate,token,{precision}")
                       for precision in precisions}  # fmt: skip
        profiles = {}  # a separate run: the profiler's own cost stays out of the timings above
        if args.profile:
            for precision in precisions:
                for kind in ("marian", "ours"):
                    setting = f"{kind},token,{precision}"
                    profiles[(kind, precision)] = run_child(args, folder, tokenizer_fields, setting, True)["profile"]
    print("| model | batches | precision | attention | ms / update | real target tokens / s | ours vs this row "
          f"| GFLOP/s | MFU | {memory_label(device)} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    names = {"fp32": "fp32", "bf16": "bf16 autocast", "bf16-model": "bf16 model, fp32 master weights"}
    for precision in precisions:
        ours = results_median(results, ("ours", "token", precision))["tok_s"]
        rows = [(kind, batches, precision) for kind, batches in settings]
        if precision == "bf16" and ("ours", "token", "bf16-model") in results:
            rows.append(("ours", "token", "bf16-model"))
        for kind, batches, variant in rows:
            row = results_median(results, (kind, batches, variant))
            label = "token batches" if batches == "token" else "64 random sentences"
            print(f"| {kind} | {label} | {names[variant]} | {row['attention']} "
                  f"| {row['ms']:.0f} | {row['tok_s']:,.0f} | {ours / row['tok_s']:.2f}x | {row['flop_s'] / 1e9:.0f} "
                  f"| {model_flops_utilization(row['flop_s'], 1.0, peak[precision]):.0%} | {row['memory']:,.0f} |")
    print(f"\nOurs and MarianMT on the same token batches in one process, alternating update by update ({args.warmup} "
          f"untimed + {args.steps} timed updates each; the host's drift hits both alike):")
    print("| precision | ours ms / update | marian ms / update | ours vs marian |")
    print("| --- | --- | --- | --- |")
    for precision, row in alternating.items():
        print(f"| {names[precision]} | {row['ours']:.0f} | {row['marian']:.0f} | {row['marian'] / row['ours']:.2f}x |")
    recipe, how = recipe_precision(precisions, has_native_bf16(device.type))
    ours = results_median(results, ("ours", "token", recipe))
    standard = results_median(results, ("marian", "sentences64", "fp32"))
    print(f"\nOurs {how} against MarianMT's standard recipe (random 64-sentence "
          f"batches, fp32: transformers' default): {ours['tok_s'] / standard['tok_s']:.2f}x real target tokens / s")
    if profiles:
        kind_of_time = "GPU kernel time, torch.profiler" if device.type == "cuda" else "operators' wall time"
        print(f"\nWhere the time of a step goes (token batches; share of the {kind_of_time}):")
        columns = list(profiles)
        print("| ops | " + " | ".join(f"{kind}, {precision}" for kind, precision in columns) + " |")
        print("| --- |" + " --- |" * len(columns))
        for group in next(iter(profiles.values())):
            print(f"| {group} | " + " | ".join(f"{profiles[c][group]:.0%}" for c in columns) + " |")


if __name__ == "__main__":
    main()
