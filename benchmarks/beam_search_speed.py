"""Beam search speed: our `generate` (the paper's beam search) vs MarianMTModel's (transformers' beam search).

Runs on `--device` (default: a CUDA GPU when one is present, else the CPU), named in the header. Each decoder's
time is its best of `--repeats`: this process's CPU time on a CPU, synchronised wall time on a GPU.

MarianMTModel gets exactly our random weights (`marian_with_the_same_weights`: same post-LN layers, ReLU, scaled
shared embeddings, the hidden dimension permuted for Marian's sines-then-cosines layout; checked on logits), so the
two compute the same function: d_model 256, 3 + 3 layers, 4 heads, d_ff 1024, shared vocabulary of 8000 (`--preset
base` or `big`: the paper's sizes, vocabulary `--vocab-size`). They
decode the same batch of random sources (~20 tokens) with beam 4, length penalty 0.6, in two scenarios:

* fixed: </s> is suppressed, every sentence runs exactly `--new-tokens` steps (the models and the loops);
* natural: `--eos-bias` makes </s> likelier; maximum length source length + 50 (ours: per sentence, the paper's
  rule; transformers': one `max_length`, the longest sentence's). With random weights every token costs about as
  much, so the bias either ends a search at once or not at all: at the default, no output ends with </s> and the
  rows compare the two length limits (a line printed under the table says how many ended). A trained model
  (`--model`, below) gives natural lengths.

Rows: ours with the paper's beam search (the default `generate`, its linear layers on packed weights on a CPU, kept
from call to call while the weights stay as they are); the same as a first call makes it, packing the weights anew
(`release_packed_weights` before each call; on a CPU); the same with torch's own product in the linear layers
(mkldnn off; on a CPU); the same with a copy of each source for each beam, as transformers hands `generate` the
encoder's output (ours before 2026-11-28; on a CPU); ours with `length_penalty_type="transformers"` (transformers'
loop on our model: must give MarianMT's output exactly); MarianMTModel with transformers' beam search,
`early_stopping=True` (stop at num_beams finished hypotheses; fewer steps than an exact search) and "never" (the exact
search, what ours does).

With `--model FOLDER --sources FILE` (one of our trained models, e.g. the Multi30k recipe's `averaged`, and source
sentences, e.g. test_2016_flickr.en) the weights and sources are real, and "natural" lengths are the model's own
(no eos bias); the first `--batch-size` lines are the batch.

`--compiled` adds ours with a static cache and a compiled decoding step (the batch stays whole: no finished
sentence leaves it; on a CPU the search's update is in the step's graph), the same with the search run uncompiled
after the compiled step (on a CPU; the way before 2026-11-28), and MarianMTModel asked for the same
(`cache_implementation="static"`, the same `compile_config`): transformers' beam search accepts both but compiles no
step, so its row shows what a Marian user gets from asking.

`--kernels` (CPU) adds a table of the decoder's linear layers alone, per weight shape: torch's product against
oneDNN's on a packed copy of the weight, and the packing.

On a CPU a row of ours with torch's SDPA kernel in the decoding steps too ("SDPA at every step"): on a CPU our model
computes a decoding step's attention (one query per row) as equation (1) written out instead, at 16 keys or more and
256 rows x keys or more (`modeling_vaswani_transformer._one_query_faster_eager`).
`--attention` (CPU) adds a table of the two alone at this run's decoding-step shapes.

`--dtype bfloat16` runs both models in bf16 (weights and activations); `--cudnn-attention off` keeps attention off
cuDNN's kernel (on a GPU, where PyTorch picks it for bf16 and cuDNN plans every new shape: the key length grows every
step).

`--split` adds a table of where the time of the fixed-length decoding goes, per step, for ours and MarianMTModel
(forward hooks, wall time): the output layer, the other linear layers, the rest of the model's forward pass, and the
search around it (our linear layers' time includes packing their weights, on a CPU, at their fourth use).
On a GPU every hook synchronises (else it would time the launch, not the work), which slows the decoding down.

Target (issue 15): ours >= 2x MarianMT's sentences/second at a fixed output length, and ahead at natural lengths.

    python benchmarks/beam_search_speed.py --batch-size 32 --repeats 3 --threads 1
    python benchmarks/beam_search_speed.py --preset base --vocab-size 37000 --batch-size 1 --threads 1  # WMT's size
    python benchmarks/beam_search_speed.py --model runs/multi30k_cpu/averaged \
        --sources ../shared/data/multi30k/test_2016_flickr.en --batch-size 16 --threads 1
"""

import argparse
import time
import warnings

import torch
from device import add_device_argument, check_device, describe, now
from transformers import AutoTokenizer, CompileConfig, MarianConfig, MarianMTModel

from vaswani_transformer import (
    VaswaniTransformerConfig,
    VaswaniTransformerForConditionalGeneration,
    release_packed_weights,
)
from vaswani_transformer.trainer import skip_cudnn_attention
from vaswani_transformer import modeling_vaswani_transformer as modeling
from vaswani_transformer import generation
from vaswani_transformer.generation import SHARED_SOURCE_KERNELS


def sources(batch_size: int, length: int, vocab_size: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length - 5, length + 6, (batch_size,), generator=generator)
    ids = torch.zeros(batch_size, int(lengths.max()), dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        ids[row, : n - 1] = torch.randint(4, vocab_size, (n - 1,), generator=generator)
        ids[row, n - 1] = 2
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def marian_with_the_same_weights(ours: VaswaniTransformerForConditionalGeneration) -> MarianMTModel:
    """A MarianMTModel computing exactly our function: same post-LN layers, ReLU, scaled shared embeddings.

    Marian's sinusoids put all sines before all cosines where ours interleave them: the hidden dimension is permuted
    (a relabelling of coordinates that every linear layer, LayerNorm and residual connection commutes with).
    """
    config = ours.config
    d_model = config.d_model
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=config.vocab_size, d_model=d_model, encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers, encoder_attention_heads=config.num_heads,
            decoder_attention_heads=config.num_heads, encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff,
            activation_function="relu", scale_embedding=True, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
            forced_eos_token_id=None, max_position_embeddings=512,
        )
    ).eval()  # fmt: skip
    perm = torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])
    ours_state = ours.state_dict()
    state = {"model.shared.weight": ours_state["model.shared.weight"][:, perm]}

    def attention(target, source):
        for name in ("q_proj", "k_proj", "v_proj"):
            state[f"{target}.{name}.weight"] = ours_state[f"{source}.{name}.weight"][:, perm]
            state[f"{target}.{name}.bias"] = ours_state[f"{source}.{name}.bias"]
        state[f"{target}.out_proj.weight"] = ours_state[f"{source}.o_proj.weight"][perm]
        state[f"{target}.out_proj.bias"] = ours_state[f"{source}.o_proj.bias"][perm]

    def norm(target, source):
        state[f"{target}.weight"] = ours_state[f"{source}.layer_norm.weight"][perm]
        state[f"{target}.bias"] = ours_state[f"{source}.layer_norm.bias"][perm]

    def feed_forward(target, source):
        state[f"{target}.fc1.weight"] = ours_state[f"{source}.feed_forward.w1.weight"][:, perm]
        state[f"{target}.fc1.bias"] = ours_state[f"{source}.feed_forward.w1.bias"]
        state[f"{target}.fc2.weight"] = ours_state[f"{source}.feed_forward.w2.weight"][perm]
        state[f"{target}.fc2.bias"] = ours_state[f"{source}.feed_forward.w2.bias"][perm]

    for side in ("encoder", "decoder"):
        for i in range(getattr(config, f"{side}_layers")):
            target, source = f"model.{side}.layers.{i}", f"model.{side}.layers.{i}"
            attention(f"{target}.self_attn", f"{source}.self_attn")
            norm(f"{target}.self_attn_layer_norm", f"{source}.self_attn_residual")
            if side == "decoder":
                attention(f"{target}.encoder_attn", f"{source}.encoder_attn")
                norm(f"{target}.encoder_attn_layer_norm", f"{source}.encoder_attn_residual")
            feed_forward(target, source)
            norm(f"{target}.final_layer_norm", f"{source}.feed_forward_residual")
    missing, unexpected = marian.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all("embed_positions" in k or "embed_tokens" in k or k in ("lm_head.weight", "final_logits_bias")
               for k in missing), missing  # fmt: skip
    with torch.no_grad():  # the same function, checked on a random batch
        ids = torch.randint(3, config.vocab_size, (2, 7))
        expected = ours(input_ids=ids, decoder_input_ids=ids).logits
        torch.testing.assert_close(marian(input_ids=ids, decoder_input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)
    return marian


def timed(runs: dict, inputs, repeats: int, device: torch.device) -> dict:
    """Best time of each run. On a CPU this process's CPU time (other processes' load barely counts; with --threads 1
    it is the wall time of a quiet machine); on a GPU, whose work is asynchronous, wall time after synchronising. The
    runs take turns, so that what load remains hits all of them alike."""
    clock = time.process_time if device.type == "cpu" else lambda: now(device)
    for run in runs.values():
        run(**inputs)  # warm-up
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = clock()
            run(**inputs)
            best[name] = min(best[name], clock() - started)
    return best


def natural_ends_line(ours_out: torch.Tensor, marian_out: torch.Tensor, eos: int, trained: bool) -> str:
    """How many of each decoder's outputs end with </s>, and, where none does, that the "natural" rows then compare
    the two length limits (ours: each sentence's source + 50; transformers': the batch's longest + 50), not sentences
    ending at their own lengths: with random weights every token costs about as much, so --eos-bias either ends a
    search at once or not at all (found on 2026-11-29; the rows of earlier README tables were such rows)."""
    ended = [int((out == eos).any(-1).sum()) for out in (ours_out, marian_out)]
    line = (f"natural: outputs ending with </s>: ours {ended[0]} of {len(ours_out)}, MarianMTModel {ended[1]} of "
            f"{len(marian_out)}")
    if not any(ended):
        line += (" - every output ran to its length limit, so the natural rows compare length rules (ours: each "
                 "sentence's source + 50; transformers': the batch's longest + 50), not natural ends"
                 + ("" if trained else "; --model with --sources decodes a trained model's own lengths"))
    return line


def time_split(model, run, inputs, steps: int, repeats: int, device: torch.device) -> dict:
    """Milliseconds per decoding step in the output layer, the other linear layers, the rest of the forward pass and
    the rest of `generate`, from forward hooks on `model` (mean of `repeats` calls of `run`, after one warm-up; on a
    GPU every hook synchronises). Our model's linear layers are timed around `modeling.linear` instead: with a hook a
    layer runs as `layer(x)`, torch's product (`modeling._product_operands`)."""
    spent = dict.fromkeys(("output layer", "other linear layers", "forward", "generate"), 0.0)
    starts, handles = {}, []
    output_layer = model.get_output_embeddings()
    ours = isinstance(model, VaswaniTransformerForConditionalGeneration)

    def timer(module, name):
        handles.append(module.register_forward_pre_hook(lambda *_: starts.__setitem__(id(module), now(device))))
        handles.append(module.register_forward_hook(
            lambda *_: spent.__setitem__(name, spent[name] + now(device) - starts[id(module)])
        ))  # fmt: skip

    encoder = {id(module) for module in model.get_encoder().modules()}  # runs once per call, outside the steps

    def timed_linear(layer, x):
        if id(layer) in encoder:
            return product(layer, x)
        started = now(device)
        y = product(layer, x)
        name = "output layer" if layer is output_layer else "other linear layers"
        spent[name] += now(device) - started
        return y

    timer(model, "forward")
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not ours and id(module) not in encoder:
            timer(module, "output layer" if module is output_layer else "other linear layers")
    product = modeling.linear
    if ours:
        modeling.linear = timed_linear
    try:
        run(**inputs)
        spent.update(dict.fromkeys(spent, 0.0))
        started = now(device)
        for _ in range(repeats):
            run(**inputs)
        spent["generate"] = now(device) - started
    finally:
        modeling.linear = product
        for handle in handles:
            handle.remove()
    linear = spent["output layer"] + spent["other linear layers"]
    per_step = {
        "output layer": spent["output layer"], "other linear layers": spent["other linear layers"],
        "rest of the forward pass": spent["forward"] - linear, "encoder, search and the rest of generate":
        spent["generate"] - spent["forward"], "total": spent["generate"],
    }  # fmt: skip
    return {name: 1000 * value / (repeats * steps) for name, value in per_step.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source-length", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=30)
    parser.add_argument("--eos-bias", type=float, default=3.0, help="scenario 'natural': makes </s> likelier")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--preset", default=None,
                        help="random weights of a paper preset (base, big) instead of the Multi30k recipe's size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="one of our trained model folders instead of random weights")
    parser.add_argument("--sources", help="with --model: a file of source sentences (the first --batch-size lines)")
    parser.add_argument("--compiled", action="store_true",
                        help="add rows: ours with a static cache and the decoding step compiled (torch.compile, "
                             "inductor; the warm-up call compiles, not timed), and MarianMTModel asked for the "
                             "same")  # fmt: skip
    parser.add_argument("--kernels", action="store_true",
                        help="add a table of the decoder's linear layers alone: torch's product against oneDNN's on "
                             "a packed weight, and the packing, per weight shape (CPU)")  # fmt: skip
    parser.add_argument("--attention", action="store_true",
                        help="add a table of one decoding step's attention alone: torch's SDPA kernel against "
                             "equation (1) written out, as our model computes a single query on a CPU")  # fmt: skip
    parser.add_argument("--split", action="store_true",
                        help="add a table of where the time of a fixed-length decoding step goes (ours, MarianMT)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both models' weights and activations (default float32)")
    parser.add_argument("--cudnn-attention", choices=("default", "off"), default="default",
                        help="off: keep SDPA off cuDNN's attention kernel, as training on a GPU does "
                             "(trainer.skip_cudnn_attention); PyTorch picks it for bf16 on recent GPUs")  # fmt: skip
    add_device_argument(parser)
    args = parser.parse_args()
    if (args.model is None) != (args.sources is None):
        parser.error("--model and --sources go together")
    device = check_device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if args.model:
        ours = VaswaniTransformerForConditionalGeneration.from_pretrained(args.model).eval()
        with open(args.sources, encoding="utf-8") as lines:
            batch = [line.rstrip("\n") for _, line in zip(range(args.batch_size), lines)]
        encoded = AutoTokenizer.from_pretrained(args.model)(batch, padding=True, return_tensors="pt")
        inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        args.vocab_size, args.eos_bias, args.batch_size = ours.config.vocab_size, 0.0, len(batch)
    else:
        if args.preset:
            config = VaswaniTransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size, dropout=0.0)
        else:
            size = dict(d_model=256, encoder_layers=3, decoder_layers=3, num_heads=4, d_ff=1024)
            config = VaswaniTransformerConfig(vocab_size=args.vocab_size, dropout=0.0, **size)
        ours = VaswaniTransformerForConditionalGeneration(config).eval()
        inputs = sources(args.batch_size, args.source_length, args.vocab_size, args.seed)
    if args.eos_bias:
        with torch.no_grad():  # make </s> likelier, so that hypotheses end at various lengths
            eos = ours.lm_head.weight[2]
            ours.model.decoder.layers[-1].feed_forward_residual.layer_norm.bias.copy_(args.eos_bias * eos / eos.norm())
    marian = marian_with_the_same_weights(ours)  # built and checked on the CPU, then moved
    dtype = getattr(torch, args.dtype)
    ours, marian = ours.to(device, dtype), marian.to(device, dtype)
    if args.cudnn_attention == "off":
        skip_cudnn_attention()
    inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    longest = int(inputs["attention_mask"].sum(-1).max())
    scenarios = {
        "fixed": dict(max_new_tokens=args.new_tokens, suppress_tokens=[2]),
        "natural": {},
    }
    what = f"sources from {args.sources}, model {args.model}" if args.model else f"sources ~{args.source_length} tokens"
    c = ours.config
    what += f", d_model {c.d_model}, {c.encoder_layers}+{c.decoder_layers} layers, d_ff {c.d_ff}, {c.num_heads} heads"
    clock = "CPU time" if device.type == "cpu" else "wall time, synchronised"
    print(
        f"# {describe(device)}\n# batch {args.batch_size}, "
        f"{what}, beam {args.num_beams}, vocab "
        f"{args.vocab_size}, {args.threads} thread(s), best {clock} of {args.repeats}; fixed: {args.new_tokens} "
        f"steps, natural: eos bias {args.eos_bias}; {args.dtype}, cuDNN attention {args.cudnn_attention}\n"
    )
    compile_config = CompileConfig(fullgraph=True, dynamic=False)  # transformers' defaults otherwise
    compile_config._compile_all_devices = True  # transformers compiles on CPUs only when asked to
    units = ["CPU seconds", "sentences/CPU s"] if device.type == "cpu" else ["seconds", "sentences/s"]
    header = ["scenario", "decoder", *units, "vs MarianMT (True)"]
    rows = []
    for scenario, settings in scenarios.items():
        common = dict(num_beams=args.num_beams, length_penalty=0.6, **settings)
        # transformers' decoders take one max_length for the batch: the longest sentence's (source length + 50).
        hf_length = {} if "max_new_tokens" in settings else {"max_new_tokens": longest + 50}
        runs = {
            "ours, paper beam search": lambda **x: ours.generate(**x, **common),
            **({"ours, paper beam search, a first call (packing its weights)": lambda **x: first_call(
                ours, ours.generate, **x, **common
            )} if device.type == "cpu" else {}),
            **({"ours, paper beam search, torch's linear products": lambda **x: plain_products(
                ours.generate, **x, **common
            )} if device.type == "cpu" else {}),
            **({"ours, paper beam search, SDPA at every step": lambda **x: sdpa_every_step(
                ours, ours.generate, **x, **common
            )} if device.type == "cpu" else {}),
            **({"ours, paper beam search, a source copy per beam": lambda **x: source_copies(
                ours, ours.generate, **x, **common
            )} if device.type == "cpu" else {}),
            "ours, transformers' beam search": lambda **x: ours.generate(
                **x, **common, length_penalty_type="transformers"
            ),
            **({"ours, static cache, compiled step": lambda **x: ours.generate(
                **x, **common, cache_implementation="static", compile_config=compile_config
            )} if args.compiled else {}),
            **({"ours, static cache, compiled step, search uncompiled": lambda **x: search_uncompiled(
                ours.generate, **x, **common, cache_implementation="static", compile_config=compile_config
            )} if args.compiled and device.type == "cpu" else {}),
            "MarianMTModel, early_stopping=True": lambda **x: marian.generate(
                **x, **common, **hf_length, early_stopping=True
            ),
            "MarianMTModel, early_stopping='never'": lambda **x: marian.generate(
                **x, **common, **hf_length, early_stopping="never"
            ),
            # The same options for MarianMTModel: transformers' beam search takes them but compiles no step (only
            # its sampling and assisted decoding do), so this row shows what asking for them gives a Marian user.
            **({"MarianMTModel, static cache, compile_config": lambda **x: marian.generate(
                **x, **common, **hf_length, early_stopping=True, cache_implementation="static",
                compile_config=compile_config,
            )} if args.compiled else {}),
        }
        seconds = timed(runs, inputs, args.repeats, device)
        # Same weights, same loop: the comparison is of like with like.
        ours_hf, marian_hf = runs["ours, transformers' beam search"], runs["MarianMTModel, early_stopping=True"]
        same = torch.equal(ours_hf(**inputs), marian_hf(**inputs))
        print(f"{scenario}: ours with transformers' beam search == MarianMTModel's output: {same}")
        if scenario == "natural":
            ours_out, marian_out = runs["ours, paper beam search"](**inputs), marian_hf(**inputs)
            lengths = (ours_out[:, 1:] != 0).sum(-1).float()
            print(f"natural: paper beam search output lengths: mean {lengths.mean():.1f}, max {lengths.max():.0f}")
            print(natural_ends_line(ours_out, marian_out, ours.config.eos_token_id, args.model is not None))
        baseline = seconds["MarianMTModel, early_stopping=True"]
        for name, s in seconds.items():
            rows.append([scenario, name, f"{s:.3f}", f"{args.batch_size / s:.1f}", f"{baseline / s:.2f}x"])
    print_table(header, rows)
    if args.kernels and device.type == "cpu":
        step_rows = args.batch_size * args.num_beams
        print(f"\nkernels: the decoder's linear layers alone, {step_rows} rows (batch x beams), warm weights, "
              f"{args.threads} thread(s), median of 50 calls (packing: of 5)")
        print_table(["weight (out x in)", "layers", "torch's product ms", "oneDNN on W as stored ms",
                     "packed product ms", "speed-up (packed vs torch's)", "packing ms"],
                    kernel_rows(ours, step_rows))  # fmt: skip
    if args.attention and device.type == "cpu":
        step_rows = args.batch_size * args.num_beams
        print(f"\nattention at a decoding step alone: one query per row, {step_rows} rows (batch x beams), "
              f"{ours.config.num_heads} heads, {args.dtype}, {args.threads} thread(s), median of 50 calls")
        print_table(["keys (source or tokens so far)", "torch's SDPA ms", "equation (1) ms", "speed-up"],
                    attention_rows(ours, step_rows, longest, args.new_tokens, dtype))  # fmt: skip
    if args.split:
        fixed = dict(num_beams=args.num_beams, length_penalty=0.6, **scenarios["fixed"])
        split = {
            "ours, paper beam search": time_split(ours, lambda **x: ours.generate(**x, **fixed), inputs,
                                                  args.new_tokens, args.repeats, device),
            "MarianMTModel, early_stopping=True": time_split(marian, lambda **x: marian.generate(
                **x, **fixed, early_stopping=True), inputs, args.new_tokens, args.repeats, device),
        }  # fmt: skip
        synchronised = "" if device.type == "cpu" else ", synchronised in every hook: slower than running unhooked"
        print(f"\nfixed: ms per decoding step ({args.new_tokens} steps, forward hooks, wall time{synchronised}, "
              f"mean of {args.repeats})")
        parts = list(next(iter(split.values())))
        print_table(["decoder", *parts], [[name, *(f"{times[part]:.2f}" for part in parts)]
                                          for name, times in split.items()])  # fmt: skip


def median_ms(call, count: int) -> float:
    """The median wall time of `count` calls of `call` after one untimed call, in ms."""
    call()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * sorted(times)[count // 2]


def sdpa_every_step(model, generate, **kwargs):
    """`generate` with torch's SDPA kernel for every attention, a decoding step's single query included (registered
    under another name, so that `MultiHeadAttention` takes it as it comes)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("sdpa_every_step", sdpa_attention_forward)
    AttentionMaskInterface.register("sdpa_every_step", sdpa_mask)
    SHARED_SOURCE_KERNELS.add("sdpa_every_step")  # a sentence's beams still share its source, as in the default row
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa_every_step")
    try:
        return generate(**kwargs)
    finally:
        model.set_attn_implementation(before)


def attention_rows(model, rows: int, source_length: int, new_tokens: int, dtype: torch.dtype) -> list[list]:
    """One decoding step's attention (one query per row) over the source (cross-attention) and over half and all of
    the fixed scenario's tokens (self-attention): torch's SDPA kernel against `eager_attention_forward`."""
    from vaswani_transformer.modeling_vaswani_transformer import eager_attention_forward

    config = model.config
    attention = model.get_decoder().layers[0].self_attn

    table = []
    with torch.no_grad():
        for keys, what in ((source_length, "source"), (max(1, new_tokens // 2), "tokens"), (new_tokens, "tokens")):
            q = torch.randn(rows, config.num_heads, 1, config.head_dim_k, dtype=dtype)
            k = torch.randn(rows, config.num_heads, keys, config.head_dim_k, dtype=dtype)
            v = torch.randn(rows, config.num_heads, keys, config.head_dim_v, dtype=dtype)
            sdpa = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), 50)
            eager = median_ms(lambda: eager_attention_forward(attention, q, k, v, None, attention.scaling), 50)
            table.append([f"{keys} ({what})", f"{sdpa:.3f}", f"{eager:.3f}", f"{sdpa / eager:.2f}x"])
    return table


def kernel_rows(model, rows: int) -> list[list]:
    """Per distinct weight shape of the decoder's linear layers (the output layer included): torch's product, oneDNN's
    on W as stored (a layer's first uses in a `generate` call, where `modeling.linear` takes it) and on a packed
    copy, the packed one's speed-up and the packing itself, in ms (what `packed_cpu_weights` trades)."""
    from vaswani_transformer.modeling_vaswani_transformer import _pack_min_weights

    layers = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    layers.append(model.get_output_embeddings())
    shapes = {}
    for layer in layers:
        shapes.setdefault(tuple(layer.weight.shape), []).append(layer)
    table = []
    with torch.no_grad():
        for (out_features, in_features), same in shapes.items():
            weight, bias = same[0].weight, same[0].bias
            x = torch.randn(rows, in_features, dtype=weight.dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            plain = median_ms(lambda: torch.nn.functional.linear(x, weight, bias), 50)
            stored = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""), 50)
            fast = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""), 50)
            packing = median_ms(lambda: torch.ops.mkldnn._reorder_linear_weight(weight), 5)
            note = "" if weight.numel() >= _pack_min_weights(weight.dtype) else " (not packed: too small)"
            table.append([f"{out_features} x {in_features}{note}", len(same), f"{plain:.3f}", f"{stored:.3f}",
                          f"{fast:.3f}", f"{plain / fast:.2f}x", f"{packing:.2f}"])  # fmt: skip
    return table


def source_copies(model, generate, **kwargs):
    """`generate` with a copy of each source for each beam, as transformers hands it over (and as ours ran before
    2026-11-28): the model's kernel taken out of `SHARED_SOURCE_KERNELS` for the call."""
    kernel = model.config._attn_implementation
    shared = kernel in SHARED_SOURCE_KERNELS
    SHARED_SOURCE_KERNELS.discard(kernel)
    try:
        return generate(**kwargs)
    finally:
        if shared:
            SHARED_SOURCE_KERNELS.add(kernel)


def search_uncompiled(generate, **kwargs):
    """`generate` with the search's update run uncompiled after a compiled step (`generation._SEARCH_COMPILES`)."""
    generation._SEARCH_COMPILES = False
    try:
        return generate(**kwargs)
    finally:
        generation._SEARCH_COMPILES = True


def first_call(model, generate, **kwargs):
    """`generate` as a model's first call makes it: without the packed weights that earlier calls keep
    (`packed_cpu_weights`), so it packs them anew; the kept ones are put back after it, for the other rows."""
    kept = {layer: modeling._KEPT_PACKS[layer] for layer in model.modules() if layer in modeling._KEPT_PACKS}
    release_packed_weights(model)
    try:
        return generate(**kwargs)
    finally:
        modeling._KEPT_PACKS.update(kept)


def plain_products(generate, **kwargs):
    """`generate` with torch's own product in every linear layer (mkldnn off): no packed weights."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about TF32 on Intel GPUs whenever the flags change
        with torch.backends.mkldnn.flags(enabled=False):
            return generate(**kwargs)


def print_table(header: list, rows: list):
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))

if __name__ == "__main__":
    main()
