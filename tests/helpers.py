"""Test-only helpers shared by the test modules: the tiny random models the tests build, and tiny saved
translation models (a trained tokenizer + a random model) for the pipeline, translate and hub tests."""

import textwrap
from pathlib import Path

import torch

from vaswani_transformer import VaswaniTransformerConfig, VaswaniTransformerForConditionalGeneration
from vaswani_transformer.tokenization import config_kwargs_from_tokenizer, train_tokenizer


def _cpuinfo_values(field: str) -> list[str]:
    """The values of a /proc/cpuinfo field, one per CPU, as Linux lists them (independent of torch's probes and of
    the package's own reading); empty elsewhere."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.split(":", 1)[0].strip() == field]


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo; empty elsewhere."""
    return {flag for value in _cpuinfo_values("flags") for flag in value.split()}


def cpu_vendor() -> str:
    """The CPU's vendor as Linux lists it in /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"); empty elsewhere."""
    return next(iter(_cpuinfo_values("vendor_id")), "")


# The flags under which a CPU multiplies each half precision in hardware (Linux's names for the CPUID bits).
NATIVE_FLAGS = {torch.bfloat16: {"avx512_bf16", "amx_bf16"}, torch.float16: {"avx512_fp16", "amx_fp16"}}


def multiplies_by_flags(dtype: torch.dtype) -> bool:
    """Whether the CPU's flags list an instruction set that multiplies `dtype` (every CPU multiplies float32)."""
    return dtype not in NATIVE_FLAGS or bool(cpu_flags() & NATIVE_FLAGS[dtype])


def tiny_config(**overrides) -> VaswaniTransformerConfig:
    """A 2+2-layer model of width 32 (4 heads, d_ff 64, vocabulary 50, no dropout); `overrides` change any field."""
    fields = dict(vocab_size=50, d_model=32, encoder_layers=2, decoder_layers=2, num_heads=4, d_ff=64, dropout=0.0)
    return VaswaniTransformerConfig(**{**fields, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VaswaniTransformerForConditionalGeneration:
    """A random `tiny_config(**overrides)` model from seed `seed`, in eval mode."""
    torch.manual_seed(seed)
    return VaswaniTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


CORPUS = [
    "A man is riding a bicycle down the street.", "Ein Mann fährt mit dem Fahrrad die Straße entlang.",
    "Two dogs play in the snow.", "Zwei Hunde spielen im Schnee.", "A small house near the river.",
    "Ein kleines Haus am Fluss.", "Grüße aus Köln, schöne Straße!", "The cat sleeps on the warm sofa.",
]  # fmt: skip
SOURCES = [
    "A man is riding a bicycle.", "Two dogs play in the snow near the small house by the river.", "Grüße aus Köln",
    "x", "The cat sleeps.", "Zwei Hunde spielen im Schnee und ein Mann fährt Fahrrad die Straße entlang.",
]  # fmt: skip


# The start of a Python program (`python -c`) that reads glibc's allocator statistics: `libc.mallinfo2()`'s
# `hblkhd` is the memory in blocks mapped on their own (returned to the OS when freed). Prints null and exits where
# the C library has no mallinfo2 (not glibc).
MALLINFO_PRELUDE = """
import ctypes, ctypes.util, json, sys
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
if not hasattr(libc, "mallinfo2"):
    print(json.dumps(None)); sys.exit()
libc.mallinfo2.restype = MallInfo2
"""


# Subprocesses (CLIs, Pythons without the package) are told the same through the environment.
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def tiny_tokenizer():
    return train_tokenizer(CORPUS * 3, vocab_size=320, show_progress=False)


def tiny_translation_model(tokenizer, seed: int = 1, **overrides):
    """A random 1-layer model whose outputs differ from sentence to sentence (large embeddings, no dropout)."""
    fields = dict(encoder_layers=1, decoder_layers=1, num_heads=2, scale_embedding=False, init_std=1.0)
    return tiny_model(seed, **{**fields, **config_kwargs_from_tokenizer(tokenizer), **overrides})


# The paper's decoding (beam 4, GNMT penalty 0.6) with a short length rule: a random model never ends a sentence, and
# source length + 50 steps of beam search per sentence would make the tests slow.
TEST_MAX_LEN_A, TEST_MAX_LEN_B = 0, 10


def save_tiny_model(folder, seed: int = 1, **overrides):
    """(model, tokenizer) after saving both to `folder` with `save_pretrained` (generation: max_len_a=0,
    max_len_b=10, otherwise the paper's)."""
    tokenizer = tiny_tokenizer()
    model = tiny_translation_model(tokenizer, seed=seed, **overrides)
    model.generation_config.max_len_a, model.generation_config.max_len_b = TEST_MAX_LEN_A, TEST_MAX_LEN_B
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def generate_texts(model, tokenizer, sources, **generate_kwargs) -> list[str]:
    """The reference: one padded batch through `model.generate`, then `batch_decode(skip_special_tokens=True)`."""
    inputs = tokenizer(list(sources), return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(output, skip_special_tokens=True)


def generate_one_by_one(model, tokenizer, sources, **generate_kwargs) -> list[str]:
    return [generate_texts(model, tokenizer, [s], **generate_kwargs)[0] for s in sources]


# Python source for `python -c`: runs each [label, module, argv] of the JSON list in sys.argv[1] as
# `importlib.import_module(module).main(argv)`, all in this one process (the command lines' own functions at the cost
# of one interpreter start), and prints `CASE [label, exit status or the exception, stderr]` for each.
RUN_MAINS = textwrap.dedent(
    """
    import contextlib, importlib, io, json, sys
    for label, module, argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                code = importlib.import_module(module).main(argv)
        except SystemExit as exit:
            code = exit.code
        except BaseException as error:
            import traceback
            code, err = repr(error), io.StringIO(err.getvalue() + traceback.format_exc())
        print("CASE " + json.dumps([label, code, err.getvalue()]), flush=True)
    """
)


def case_answers(stdout: str) -> dict:
    """{label: (exit status or exception, stderr)} from the `CASE` lines `RUN_MAINS` printed."""
    import json

    return {label: (code, err) for label, code, err in (json.loads(l[5:]) for l in stdout.splitlines() if l.startswith("CASE ["))}
