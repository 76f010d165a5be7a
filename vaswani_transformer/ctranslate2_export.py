"""Export our models to CTranslate2 and translate with the export.

`VaswaniTransformerConverter` is a `ctranslate2.converters.Converter`: it fills CTranslate2's own `TransformerSpec`
with our weights (post-LN layers, ReLU, embeddings scaled by sqrt(d_model) or not, our positional encodings as an
explicit table, the tied output projection, the shared vocabulary), and CTranslate2 quantizes and saves it. The
exported folder also holds our tokenizer, so one folder translates text. `translate_lines_ctranslate2` translates
lines with it as `translate.py` does with our model (same token batches, one output line per input line).

CTranslate2's beam search ranks finished hypotheses by log P / |Y|^alpha: transformers' rule, which our models use
with `length_penalty_type="transformers"`; the paper's GNMT penalty ((5 + |Y|) / 6)^alpha has no equivalent there.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import platform
import sys
from collections.abc import Iterable, Iterator, Sequence

import torch
from transformers import AutoConfig, AutoTokenizer

from . import cli
from .configuration_vaswani_transformer import VaswaniTransformerConfig
from .generation import TRANSFORMERS_DEFAULT_MAX_LENGTH, config_sets_a_length
from .modeling_vaswani_transformer import VaswaniTransformerForConditionalGeneration, cpuinfo_field
from .pipeline import source_length_limit
from .translate import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_WINDOW,
    decoding_options_given,
    recorded_input,
    stream_translations,
    translation_chunks,
)


try:  # an optional dependency: `pip install vaswani-transformer[ctranslate2]`
    import ctranslate2
    from ctranslate2.converters import utils as ct2_utils
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import common_spec, transformer_spec
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES
except ImportError:  # pragma: no cover - the error is raised where it is needed
    ctranslate2 = None
    Converter = object
    ACCEPTED_MODEL_TYPES = ()

logger = logging.getLogger(__name__)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16")
README_NAME = "README_ctranslate2.md"
MAX_POSITIONS_KEY = "max_positions"  # the position table's rows, in the export's config.json
_INSTALL_HINT = "CTranslate2 is not installed: pip install 'vaswani-transformer[ctranslate2]' (or ctranslate2)."


def _require_ctranslate2():
    if ctranslate2 is None:
        raise ImportError(_INSTALL_HINT)


def check_quantization(quantization: str | None) -> None:
    """Raise a ValueError naming the quantization when the installed CTranslate2 cannot store it."""
    _require_ctranslate2()
    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise ValueError(
            f"Quantization {quantization!r} is not supported by the installed CTranslate2 {ctranslate2.__version__} "
            f"(it accepts {', '.join(ACCEPTED_MODEL_TYPES)})."
        )


def load_our_model(model_name_or_path: str, revision: str | None = None):
    """(model, tokenizer) of one of our model folders or Hub ids; a ValueError naming the model type otherwise."""
    config = AutoConfig.from_pretrained(model_name_or_path, revision=revision)
    if not isinstance(config, VaswaniTransformerConfig):
        raise ValueError(
            f"{model_name_or_path} holds a {config.model_type!r} model, not a vaswani_transformer one: this exporter "
            "converts only our models (use `ct2-transformers-converter` for transformers' own architectures)."
        )
    model = VaswaniTransformerForConditionalGeneration.from_pretrained(
        model_name_or_path, revision=revision, dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, revision=revision)
    return model, tokenizer


def position_table(stack, num_positions: int) -> torch.Tensor:
    """The encodings an encoder or decoder adds at positions 0..num_positions-1 (any layout), shape (n, d_model)."""
    like = torch.zeros(1, dtype=torch.float32)
    return stack.embedding.embed_positions(num_positions, 0, like=like).detach()


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
    """Token strings by id, padded to the model's vocabulary size with tokens that never occur."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(tokens) > vocab_size:
        raise ValueError(f"The tokenizer has {len(tokens)} tokens but the model only {vocab_size} embeddings.")
    return tokens + [f"<unused{i}>" for i in range(vocab_size - len(tokens))]


def _linear(spec, module: torch.nn.Linear):
    spec.weight = module.weight.detach()
    if module.bias is not None:
        spec.bias = module.bias.detach()


def _layer_norm(spec, module: torch.nn.LayerNorm):
    spec.gamma, spec.beta = module.weight.detach(), module.bias.detach()


def _attention(spec, attention, self_attention: bool):
    """CTranslate2 fuses Q, K, V in self-attention and K, V in encoder-decoder attention."""
    split = [common_spec.LinearSpec() for _ in range(3)]
    for part, module in zip(split, (attention.q_proj, attention.k_proj, attention.v_proj)):
        _linear(part, module)
    if self_attention:
        ct2_utils.fuse_linear(spec.linear[0], split)
    else:
        ct2_utils.fuse_linear(spec.linear[0], split[:1])
        ct2_utils.fuse_linear(spec.linear[1], split[1:])
    _linear(spec.linear[-1], attention.o_proj)


def _stack(spec, stack, max_positions: int):
    embedding = stack.embedding
    spec.scale_embeddings = float(embedding.scale)
    spec.position_encodings.encodings = position_table(stack, max_positions)
    (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = (
        embedding.embed_tokens.weight.detach()
    )
    for layer_spec, layer in zip(spec.layer, stack.layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_residual.layer_norm)
        if hasattr(layer, "encoder_attn"):
            _attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
            _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_residual.layer_norm)
        _linear(layer_spec.ffn.linear_0, layer.feed_forward.w1)
        _linear(layer_spec.ffn.linear_1, layer.feed_forward.w2)
        _layer_norm(layer_spec.ffn.layer_norm, layer.feed_forward_residual.layer_norm)


def transformer_spec_of(model: VaswaniTransformerForConditionalGeneration, tokenizer, max_positions: int | None = None):
    """CTranslate2's `TransformerSpec` holding our model: post-LN, ReLU, our position table, tied projection."""
    _require_ctranslate2()
    config = model.config
    if config.head_dim_k != config.head_dim_v:
        raise ValueError(
            f"CTranslate2 needs d_k == d_v; this model has d_k={config.head_dim_k}, d_v={config.head_dim_v}."
        )
    start = model.generation_config.decoder_start_token_id
    start = start if start is not None else config.decoder_start_token_id
    # as our `generate` takes them: the generation config's, else the model config's (all of them at translation)
    ends = end_token_ids(model.generation_config.to_dict(), config)
    needed = {"the tokenizer's unk token": tokenizer.unk_token, "bos_token_id": config.bos_token_id,
              "decoder_start_token_id": start, "eos_token_id": ends or None}  # fmt: skip
    if missing := [name for name, value in needed.items() if value is None]:
        raise ValueError(f"CTranslate2's model config needs {', '.join(missing)}; this model has none.")
    if config.position_encoding == "learned":
        max_positions = min(max_positions or config.max_position_embeddings, config.max_position_embeddings)
    max_positions = max_positions or config.max_position_embeddings
    head_dim = config.head_dim_k
    encoder = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.num_heads, pre_norm=False, activation=common_spec.Activation.RELU,
        head_dim=head_dim,
    )  # fmt: skip
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.num_heads, pre_norm=False, activation=common_spec.Activation.RELU,
        head_dim=head_dim,
    )  # fmt: skip
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    _stack(spec.encoder, model.model.encoder, max_positions)
    _stack(spec.decoder, model.model.decoder, max_positions)
    _linear(spec.decoder.projection, model.lm_head)

    spec.config.layer_norm_epsilon = model.model.encoder.layers[0].self_attn_residual.layer_norm.eps
    # Not read by CTranslate2 (it fails on a longer input without naming it): `translate_lines_ctranslate2` reads it.
    spec.config.add_attribute(MAX_POSITIONS_KEY, max_positions)
    ids = tokenizer.convert_ids_to_tokens
    spec.config.unk_token = tokenizer.unk_token
    spec.config.bos_token = ids(config.bos_token_id)
    spec.config.eos_token = ids(ends[0])
    spec.config.decoder_start_token = ids(start)
    tokens = vocabulary(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def end_token_ids(generation: dict, config=None) -> list[int]:
    """The ids that end a translation: the generation config's `eos_token_id` (one or a list), else the model
    config's."""
    eos = generation.get("eos_token_id")
    eos = eos if eos is not None else getattr(config, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else list(eos or [])


# Generation-config fields our `generate` applies and CTranslate2's `translate_batch` does not (or not as ours: its
# `no_repeat_ngram_size` and `suppress_sequences` gave other tokens), each with the value that changes nothing.
CTRANSLATE2_IGNORES = {
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "suppress_tokens": None, "begin_suppress_tokens": None, "bad_words_ids": None,
    "sequence_bias": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "force_words_ids": None, "constraints": None, "guidance_scale": None,
}  # fmt: skip


def fields_ctranslate2_ignores(generation: dict) -> list[str]:
    """`name=value` of each field of a generation config (a dict) that would change our engine's translations and
    that the CTranslate2 engine cannot apply."""
    return [f"{name}={generation[name]!r}" for name, neutral in CTRANSLATE2_IGNORES.items()
            if generation.get(name) not in (None, neutral, [], {})]  # fmt: skip


class VaswaniTransformerConverter(Converter):
    """CTranslate2 converter of our model folders (local or Hub id); `convert(output_dir, quantization=...)`."""

    def __init__(self, model_name_or_path: str, revision: str | None = None, max_positions: int | None = None):
        _require_ctranslate2()
        self.model_name_or_path = model_name_or_path
        self.revision = revision
        self.max_positions = max_positions
        self.tokenizer = None
        self.generation_config = None
        self.exported_positions = None  # the table's rows, once converted

    def _load(self):
        model, self.tokenizer = load_our_model(self.model_name_or_path, self.revision)
        self.generation_config = model.generation_config
        with torch.no_grad():
            spec = transformer_spec_of(model, self.tokenizer, self.max_positions)
        self.exported_positions = getattr(spec.config, MAX_POSITIONS_KEY)
        return spec


def export_ctranslate2(
    model_name_or_path: str,
    output_dir: str,
    quantization: str | None = None,
    force: bool = False,
    revision: str | None = None,
    max_positions: int | None = None,
) -> str:
    """Convert one of our models into a CTranslate2 model folder that also holds the tokenizer; returns the folder."""
    check_quantization(quantization)
    converter = VaswaniTransformerConverter(model_name_or_path, revision=revision, max_positions=max_positions)
    output_dir = converter.convert(output_dir, quantization=quantization, force=force)
    converter.tokenizer.save_pretrained(output_dir)
    # Decoding defaults (beam size, alpha, length rule) for `translate.py --engine ctranslate2`.
    converter.generation_config.save_pretrained(output_dir)
    defaults = _folder_defaults(output_dir)
    ignored = fields_ctranslate2_ignores(defaults)
    if ignored:
        logger.warning("%s: the generation config sets %s, which CTranslate2 cannot apply as our generate does: "
                       "vaswani-translate --engine ctranslate2 refuses this folder until they are removed from its "
                       "generation_config.json.", output_dir, ", ".join(ignored))  # fmt: skip
    with open(os.path.join(output_dir, README_NAME), "w", encoding="utf-8") as f:
        decoding = decoding_options({k: v for k, v in defaults.items() if k not in CTRANSLATE2_IGNORES})
        decoding["end_tokens"] = converter.tokenizer.convert_ids_to_tokens(decoding.get("eos_token_ids", []))
        f.write(_readme(model_name_or_path, quantization, converter.exported_positions, decoding))
    return output_dir


INT8_README_NOTE = """
int8 weights on an x86 CPU without VNNI (an AMD EPYC of the Zen 2/3 generations, say): CTranslate2 multiplies them with
oneDNN there (MKL on Intel CPUs), whose int8 products without VNNI saturate, and the translations suffer. Start the
process with `CT2_USE_MKL=1` (read when ctranslate2 is imported) or use a float32 export; `load_translator` warns where
this holds.
"""


def _readme(source: str, quantization: str | None, max_positions: int, decoding: dict) -> str:
    beams, alpha, a, b = (decoding[k] for k in ("num_beams", "length_penalty", "max_len_a", "max_len_b"))
    least, ends = decoding.get("min_new_tokens", 0), decoding.get("end_tokens")
    int8_note = INT8_README_NOTE if (quantization or "").startswith("int8") else ""
    return f"""# CTranslate2 export of {source}

Converted by `vaswani-export-ctranslate2` (weights: {quantization or "as saved"}). The folder holds the tokenizer too:

```python
import ctranslate2
from transformers import AutoTokenizer

folder = "path/to/this/folder"
translator = ctranslate2.Translator(folder, device="cpu", compute_type="default")
tokenizer = AutoTokenizer.from_pretrained(folder)
sources = [tokenizer.convert_ids_to_tokens(tokenizer(line).input_ids) for line in ["A man rides a bike."]]
# the exported generation config's decoding; a sentence's limit is int({a} * its length + {b}) (one per call)
limit = max(int({a} * len(source) + {b}) for source in sources)
results = translator.translate_batch(sources, beam_size={beams}, length_penalty={alpha if beams > 1 else 0.0},
                                     max_decoding_length=min(limit, {max_positions}), min_decoding_length={least},
                                     end_token={ends}, return_end_token=True)  # |Y| counts </s>, as in transformers
print([tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True) for r in results])
```

With `vaswani_transformer` installed: `translator, tokenizer, defaults = load_translator(folder)` and
`translate_lines_ctranslate2(translator, tokenizer, lines, **decoding_options(defaults))` (both in
`vaswani_transformer.ctranslate2_export`) decode with these settings, each sentence at its own limit.

The length penalty is CTranslate2's log P / |Y|^alpha (the paper used the GNMT penalty ((5 + |Y|) / 6)^alpha), so beam
search gives what `model.generate(..., length_penalty_type="transformers")` gives, not the paper's rule.
Or: `vaswani-translate --engine ctranslate2 --model_name_or_path path/to/this/folder`, and to score it on a test set as
the original model is scored: `vaswani-evaluate --engine ctranslate2 --model_name_or_path path/to/this/folder --source
test.src --reference test.tgt --target_lang <code>`.

The position table holds {max_positions} positions (`max_positions` in config.json): CTranslate2 fails on a longer source
or output, so keep `max_decoding_length` at most {max_positions}; `vaswani-translate` cuts longer sources with a warning.
{int8_note}"""


def _folder_defaults(model_dir: str) -> dict:
    """The exported generation config's fields, and `max_positions`: the position table's rows (the longest source,
    and the most tokens decoding may generate; absent from folders exported before it was recorded)."""
    defaults = {}
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            defaults = json.load(f)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        max_positions = json.load(f).get(MAX_POSITIONS_KEY)
    return {**defaults, **({MAX_POSITIONS_KEY: max_positions} if max_positions else {})}


# CTranslate2 multiplies int8 matrices with oneDNN on x86 CPUs that are not Intel's (MKL on Intel's, or wherever
# CT2_USE_MKL is 1/true), and oneDNN's u8 x s8 products without VNNI add pairs in 16 bits, which saturate (oneDNN's
# documented int8 caveat): on a tiny trained model the log-probabilities move 0.2 nats on average instead of 0.013.
_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
_ONEDNN_ISAS_WITHOUT_VNNI = frozenset({"SSE41", "AVX", "AVX2", "AVX512_CORE"})  # ONEDNN_MAX_CPU_ISA values
INT8_SATURATION_WARNING = (
    "CTranslate2 runs this model in %s with oneDNN's int8 products on a CPU without VNNI, where they saturate: "
    "translations differ from float32's far more than int8 should (log-probabilities ~0.2 nats off on average, "
    "measured). Start the process with CT2_USE_MKL=1 (Intel MKL's int8 products, exact but slower here), or use a "
    "float32 export (or load_translator(..., compute_type='float32'))."
)


def int8_products_saturate(compute_type: str, device: str = "cpu", vendor: str | None = None,
                           flags: set[str] | None = None, environ=None, machine: str | None = None) -> bool:  # fmt: skip
    """Whether CTranslate2's products for a model of `compute_type` (a Translator's resolved `compute_type`) on
    `device` go through oneDNN's int8 kernels on a CPU (or an ONEDNN_MAX_CPU_ISA) without VNNI, which saturate.
    The CPU's vendor and flags (/proc/cpuinfo), the environment and the machine type are this process's unless given."""
    environ = os.environ if environ is None else environ
    machine = platform.machine() if machine is None else machine
    if device != "cpu" or not compute_type.startswith("int8") or machine.lower() not in ("x86_64", "amd64"):
        return False
    vendor = cpuinfo_field("vendor_id") if vendor is None else vendor
    use_mkl = environ.get("CT2_USE_MKL", "")
    if (use_mkl in ("1", "true", "TRUE")) if use_mkl else vendor == "GenuineIntel":  # CTranslate2's own test
        return False  # MKL's int8 products
    flags = set(cpuinfo_field("flags").split()) if flags is None else flags
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return not (flags & _VNNI_FLAGS) or cap in _ONEDNN_ISAS_WITHOUT_VNNI


def load_translator(model_dir: str, device: str = "cpu", compute_type: str = "default", inter_threads: int = 1,
                    intra_threads: int = 0):  # fmt: skip
    """(ctranslate2.Translator, tokenizer, defaults) of an exported folder: defaults holds its generation config's
    fields and `max_positions` (pass it on to `translate_lines_ctranslate2`). Warns where the int8 products would
    saturate (:func:`int8_products_saturate`)."""
    _require_ctranslate2()
    if not os.path.exists(os.path.join(model_dir, "model.bin")):
        raise ValueError(f"{model_dir} is not a CTranslate2 model folder (no model.bin): export one first.")
    translator = ctranslate2.Translator(
        model_dir, device=device, compute_type=compute_type, inter_threads=inter_threads, intra_threads=intra_threads
    )
    if int8_products_saturate(translator.compute_type, translator.device):
        logger.warning(INT8_SATURATION_WARNING, translator.compute_type)
    return translator, AutoTokenizer.from_pretrained(model_dir), _folder_defaults(model_dir)


def translate_tokens(
    translator,
    sources: Sequence[Sequence[str]],
    num_beams: int = 4,
    length_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    num_hypotheses: int = 1,
    eos_token: str = "</s>",
    max_positions: int | None = None,
    min_new_tokens: int = 0,
    end_tokens: Sequence[str] | None = None,
) -> list[list[list[str]]]:
    """Hypotheses (tokens, `</s>` excluded) of each source token list, each sentence with its own length limit.

    A sentence may produce `max_len_a * length + max_len_b` tokens, at most `max_positions` (the exported position
    table's rows, as our `generate` caps learned positions), with a warning where that cap binds. CTranslate2 takes
    one limit per call, so sentences of equal limits are translated together: a line's translation does not depend
    on the other lines of its batch. `</s>` is counted in |Y| (`return_end_token`), as transformers counts it; and it
    may come first unless `min_new_tokens` (`min_decoding_length`) asks for more. `end_tokens` (default `eos_token`)
    end a translation; a hypothesis keeps the one that ended it unless it is `eos_token`, as our `generate` keeps it
    in its output. A source longer than `max_positions` is a ValueError naming its length
    (`translate_lines_ctranslate2` truncates first).
    """
    if not sources:
        return []
    longest = max(len(s) for s in sources)
    if max_positions is not None and longest > max_positions:
        raise ValueError(f"A source of {longest} tokens is longer than the export's position table "
                         f"({max_positions} positions): truncate it, or export with a larger --max_positions.")
    groups: dict[int, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(int(len(source) * (max_len_a or 0) + max_len_b), []).append(i)
    hypotheses: list = [None] * len(sources)
    ends = list(end_tokens) if end_tokens else [eos_token]
    for limit, members in groups.items():
        if max_positions is not None and limit > max_positions:
            logger.warning("Decoding limited to %d tokens (the export's position table) instead of %d.",
                           max_positions, limit)  # fmt: skip
            limit = max_positions
        try:
            results = translator.translate_batch(
                [list(sources[i]) for i in members],
                beam_size=num_beams,
                length_penalty=length_penalty if num_beams > 1 else 0.0,
                num_hypotheses=num_hypotheses,
                max_decoding_length=limit,
                min_decoding_length=min_new_tokens,
                max_input_length=0,
                end_token=ends,
                return_end_token=True,
            )
        except RuntimeError as error:  # a folder exported before its table's size was recorded: no max_positions
            if "position encodings" not in str(error):
                raise
            raise ValueError(f"{error}: a source ({longest} tokens) or its translation (up to {limit}) is longer "
                             "than the export's position table; export the model again (vaswani-export-ctranslate2 "
                             "records the table's size, and translating then cuts longer sources) or shorten the "
                             "input.") from error  # fmt: skip
        for i, result in zip(members, results):
            hypotheses[i] = [h[:-1] if h[-1:] == [eos_token] else h for h in result.hypotheses]
    return hypotheses


def iter_translation_chunks_ctranslate2(
    translator,
    tokenizer,
    lines: Iterable[str],
    *,
    num_beams: int = 4,
    length_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    max_source_length: int | None = None,
    max_positions: int | None = None,
    min_new_tokens: int = 0,
    eos_token_ids: Sequence[int] | None = None,
    **batching,
) -> Iterator[list[str]]:
    """`translate.translation_chunks` with CTranslate2 as the engine (`translate_tokens`): the translations of `lines`
    in input order, in lists, as each token batch finishes. `eos_token_ids`: the ids that end a translation (default
    the tokenizer's `</s>`). `batching`: `translate.CHUNKING_KEYWORDS`."""
    max_source_length = source_length_limit(None, max_source_length)  # at least 1, as our engine's (no config)
    if max_positions is not None:
        max_source_length = min(max_source_length if max_source_length is not None else max_positions, max_positions)

    ends = tokenizer.convert_ids_to_tokens(list(eos_token_ids)) if eos_token_ids else None

    def translate_batch(sources: list[list[int]]) -> list[str]:
        hypotheses = translate_tokens(translator, [tokenizer.convert_ids_to_tokens(ids) for ids in sources],
                                      num_beams, length_penalty, max_len_a, max_len_b,
                                      eos_token=tokenizer.eos_token, max_positions=max_positions,
                                      min_new_tokens=min_new_tokens, end_tokens=ends)  # fmt: skip
        ids = [tokenizer.convert_tokens_to_ids(hyps[0]) for hyps in hypotheses]
        return tokenizer.batch_decode(ids, skip_special_tokens=True)

    yield from translation_chunks(translate_batch, tokenizer, lines, limit=max_source_length, **batching)


def translate_lines_ctranslate2(
    translator,
    tokenizer,
    lines: Iterable[str],
    max_tokens: int = DEFAULT_MAX_TOKENS,
    num_beams: int = 4,
    length_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    max_source_length: int | None = None,
    strict: bool = False,
    source_name: str = "line",
    max_positions: int | None = None,
    window: int | None = DEFAULT_WINDOW,
    show_progress: bool | None = None,
    min_new_tokens: int = 0,
    eos_token_ids: Sequence[int] | None = None,
) -> list[str]:
    """One translation per line, as `translate.translate_lines` does with our model: an empty or whitespace-only line
    gives "", windows of `window` lines sorted into batches of at most `max_tokens` source tokens (padding included),
    longer sources cut to `max_source_length` tokens (keeping `</s>`) with a warning naming the line, or refused with
    `strict`. `max_positions` (`load_translator`'s defaults) is the export's position table: a lower source limit,
    and the most tokens decoding may generate (as learned positions limit our own `translate_lines`).
    `min_new_tokens` and `eos_token_ids` (`decoding_options` takes them from the folder's generation config): the
    fewest tokens before the end, and the ids that end a translation (default the tokenizer's `</s>`)."""
    lines = list(lines)
    chunks = iter_translation_chunks_ctranslate2(
        translator, tokenizer, lines, num_beams=num_beams, length_penalty=length_penalty, max_len_a=max_len_a,
        max_len_b=max_len_b, max_source_length=max_source_length, max_positions=max_positions, window=window,
        max_tokens=max_tokens, strict=strict, show_progress=show_progress, total=len(lines), source_name=source_name,
        min_new_tokens=min_new_tokens, eos_token_ids=eos_token_ids,
    )  # fmt: skip
    return [text for chunk in chunks for text in chunk]


def length_rule(defaults: dict, max_len_a: float | None = None, max_len_b: float | None = None) -> tuple:
    """(max_len_a, max_len_b) of a translation with an exported folder, chosen as our `generate` chooses: the rule
    (given here, else saved), unless a length is saved in the generation config and no rule is given here
    (`max_new_tokens`, or `max_length` less the start token; transformers' default 20 does not count) or the rule's
    `max_len_b` is None (then `max_length` less the start token, or with none saved 20 new tokens)."""
    a = max_len_a if max_len_a is not None else defaults.get("max_len_a", 1)
    b = max_len_b if max_len_b is not None else defaults.get("max_len_b", 50)
    if b is not None and (max_len_a is not None or max_len_b is not None or not config_sets_a_length(defaults)):
        return a or 0, b
    if defaults.get("max_new_tokens") is not None:
        return 0, defaults["max_new_tokens"]
    # a saved max_length counts the start token; with none, transformers generates its default number of new tokens
    saved_max_length = defaults.get("max_length")
    return 0, saved_max_length - 1 if saved_max_length is not None else TRANSFORMERS_DEFAULT_MAX_LENGTH


def decoding_options(defaults: dict, **given) -> dict:
    """Keyword arguments for `translate_lines_ctranslate2`: `given` (None: not given) over the exported folder's
    `defaults` (`load_translator`'s: its generation config's beam size, alpha, length, least length (`min_new_tokens`,
    or `min_length` less the start token) and end tokens, and `max_positions`). A ValueError names the generation
    config's fields CTranslate2 cannot apply (`fields_ctranslate2_ignores`), which would change the translations."""
    ignored = fields_ctranslate2_ignores(defaults)
    if ignored:
        raise ValueError(f"The export's generation_config.json sets {', '.join(ignored)}: our generate applies it, "
                         "CTranslate2 cannot, so its translations would differ. Translate with our engine (the model "
                         "folder), or remove the field from the export's generation_config.json.")  # fmt: skip
    options = dict(given)
    least = max(defaults.get("min_new_tokens") or 0, (defaults.get("min_length") or 0) - 1)  # min_length has the start
    if options.get("min_new_tokens") is None and least > 0:
        options["min_new_tokens"] = least
    if options.get("eos_token_ids") is None and end_token_ids(defaults):
        options["eos_token_ids"] = end_token_ids(defaults)
    if (options.get("min_new_tokens") or 0) > 0 and (options.get("num_beams") or defaults.get("num_beams") or 1) > 1:
        logger.warning("min_new_tokens=%d with beam search: CTranslate2 renormalises the log-probabilities after "
                       "forbidding the end token, our generate (as transformers and fairseq) does not, so the beams "
                       "are ranked otherwise where the end is likely early and translations can differ.",
                       options["min_new_tokens"])  # fmt: skip
    options["max_len_a"], options["max_len_b"] = length_rule(defaults, given.get("max_len_a"), given.get("max_len_b"))
    for name in ("num_beams", "length_penalty", MAX_POSITIONS_KEY):
        if options.get(name) is None and defaults.get(name) is not None:
            options[name] = defaults[name]
    return {k: v for k, v in options.items() if v is not None}


def translate_file_ctranslate2(
    model_dir: str,
    input_path: str | None = None,
    output_path: str | None = None,
    device: str | None = None,
    *,
    resume: bool = False,
    **kwargs,
) -> int:
    """`translate --engine ctranslate2`: `translate.translate_file` with an exported folder, streaming in windows,
    `resume` included (its run record names the folder, its compute type and the decoding); decoding defaults from
    the folder's generation config; returns the number of lines written (= read)."""
    translator, tokenizer, defaults = load_translator(model_dir, device=device or "cpu")
    kwargs = decoding_options(defaults, **kwargs)
    record = {
        "engine": "ctranslate2",
        "model": os.path.abspath(model_dir),
        "compute_type": translator.compute_type,
        "input": recorded_input(input_path),
        "decoding": decoding_options_given(kwargs),
    }

    def chunks(lines: Iterable[str], **where) -> Iterator[list[str]]:
        return iter_translation_chunks_ctranslate2(translator, tokenizer, lines, **where, **kwargs)

    return stream_translations(chunks, record, input_path, output_path, resume=resume)


def evaluate_ctranslate2(
    model_dir: str,
    sources=None,
    references=None,
    *,
    dataset=None,
    source_lang: str = "",
    target_lang: str = "",
    decoding: dict | None = None,
    tokenize: str | None = None,
    output_json=None,
    hypotheses_file=None,
    device: str | None = None,
) -> dict:
    """`evaluation.evaluate_model` with an exported folder: translate a test set with CTranslate2
    (`translate_lines_ctranslate2`, the folder's decoding defaults under `decoding`'s keywords) and score it. The
    report has `engine` "ctranslate2" and the translator's `compute_type` where our engine's has `model_dtype`; its
    `decoding` says `length_penalty_type` "transformers", CTranslate2's rule. `device`: CTranslate2's (default cpu)."""
    # (`evaluate` loads only here)
    from .evaluation import check_report_destination, decoding_settings, read_test_set, report_translations

    test_set = read_test_set(sources, references, dataset=dataset, source_lang=source_lang, target_lang=target_lang)
    check_report_destination(output_json)  # before translating
    accepted = [name for name in inspect.signature(translate_lines_ctranslate2).parameters][3:]
    if unknown := sorted(set(decoding or {}) - set(accepted)):
        raise ValueError(f"Decoding option(s) {', '.join(unknown)} are not options of the ctranslate2 engine; it "
                         f"takes {', '.join(accepted)}.")  # fmt: skip
    translator, tokenizer, defaults = load_translator(model_dir, device=device or "cpu")
    options = decoding_options(defaults, **(decoding or {}))
    named = {"source_name": test_set.source_file} if test_set.source_file else {}  # (a cut source's warning)
    hypotheses = translate_lines_ctranslate2(translator, tokenizer, test_set.sources, **{**named, **options})
    settings = {**decoding_settings(translate_lines_ctranslate2, options), "length_penalty_type": "transformers"}
    return report_translations(
        hypotheses, test_set, model=str(model_dir), decoding=settings, source_lang=source_lang,
        target_lang=target_lang, tokenize=tokenize, output_json=output_json, hypotheses_file=hypotheses_file,
        engine="ctranslate2", compute_type=translator.compute_type,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(
        description="Convert one of our models (folder or Hub id) into a CTranslate2 model folder with its tokenizer. "
        "Options: the first spelling is canonical (run_translation.py's), the dashed one an alias.",
    )
    parser.add_argument("--model_name_or_path", "--model", required=True, help="our model folder or Hub id")
    parser.add_argument("--output_dir", "--output-dir", required=True, help="the CTranslate2 model folder to write")
    parser.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                        help="weight type of the export (default: as saved, float32)")  # fmt: skip
    parser.add_argument("--revision", default=None, help="Hub revision of --model")
    parser.add_argument("--max_positions", "--max-positions", type=cli.positive_int, default=None,
                        help="rows of the exported position table (default: max_position_embeddings)")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="overwrite --output_dir if it exists")
    args = parser.parse_args(argv)
    try:
        output = export_ctranslate2(
            args.model_name_or_path, args.output_dir, args.quantization, args.force, args.revision, args.max_positions
        )
    except (ValueError, RuntimeError, ImportError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"CTranslate2 model written to {output}")
    return 0


__all__ = [
    "VaswaniTransformerConverter",
    "decoding_options",
    "evaluate_ctranslate2",
    "export_ctranslate2",
    "iter_translation_chunks_ctranslate2",
    "load_translator",
    "translate_file_ctranslate2",
    "translate_lines_ctranslate2",
    "translate_tokens",
    "transformer_spec_of",
]


if __name__ == "__main__":  # python -m vaswani_transformer.ctranslate2_export, as the console script
    sys.exit(main())
