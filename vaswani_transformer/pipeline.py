"""`pipeline("translation")` for the Transformer of "Attention Is All You Need", on transformers 5.

transformers 5 removed its `translation` pipeline (`pipeline("translation")` raises "The task translation has been
removed from transformers"). This module brings it back for our models in two ways:

(a) **Remote code.** An exported repository (see `vaswani_transformer.hub`) carries this file as `pipeline.py` and, in
    `config.json`, `custom_pipelines = {"translation": {"impl": "pipeline.TranslationPipeline", "pt":
    ["AutoModelForSeq2SeqLM"]}, ...}`. transformers' `pipeline()` resolves a task listed in the model's
    `custom_pipelines` before its removed-task check, so `pipeline("translation", model=repo_or_folder,
    trust_remote_code=True)` works where only transformers is installed. This file therefore imports only torch and
    transformers, and importing it changes nothing in transformers.

(b) **The installed package.** `register_translation_pipeline()` (called by `import vaswani_transformer`) is the one
    place where this project touches transformers (see its docstring): afterwards `pipeline("translation",
    model=...)` and `pipeline("translation_en_to_de", model=...)` work for our models without `trust_remote_code`,
    in any import order, and every other call of `pipeline()` behaves exactly as before.

The pipeline decodes with the model's generation config - for our models the paper's beam search (beam 4, GNMT length
penalty alpha 0.6, at most source length + 50 tokens) - so it returns exactly what `model.generate(**inputs)` followed
by `tokenizer.batch_decode(..., skip_special_tokens=True)` returns, batched (`batch_size=`) or not.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

import torch
import transformers.pipelines as pipelines_module
from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY
from transformers.utils import logging

from .generation import CUSTOM_GENERATION_FIELDS


logger = logging.get_logger(__name__)

MODEL_TYPE = "vaswani_transformer"
TRANSLATION_TASK_PATTERN = re.compile(r"translation(?:_(?P<src>[^_]+)_to_(?P<tgt>[^_]+))?")
# The task names under which `register_translation_pipeline` adds `TranslationPipeline` to transformers' registry
# ("vaswani-translation", "vaswani-translation_en_to_de", ...); "translation" stays a removed task for other models.
TASK_PREFIX = "vaswani-"
REGISTERED_TASK = f"{TASK_PREFIX}translation"


# ------------------------------------------------------------------------------------------- source lengths


def source_length_limit(config, max_source_length: int | None = None) -> int | None:
    """Most source tokens (`</s>` included) the model accepts: the smaller of `max_source_length` (a user limit) and,
    for learned positional embeddings, `config.max_position_embeddings`; None when there is no limit (sinusoids)."""
    limits = []
    if max_source_length is not None:
        if max_source_length < 1:
            raise ValueError(f"max_source_length must be at least 1 (the </s> token), got {max_source_length}.")
        limits.append(int(max_source_length))
    if getattr(config, "position_encoding", None) == "learned":
        limits.append(int(config.max_position_embeddings))
    return min(limits) if limits else None


def truncate_source(ids: list[int], limit: int | None, eos_token_id: int | None) -> list[int]:
    """`ids` cut to `limit` tokens, keeping the final `</s>` (the model learned that a source ends with it)."""
    if limit is None or len(ids) <= limit:
        return ids
    if eos_token_id is not None and ids and ids[-1] == eos_token_id:
        return ids[: limit - 1] + [eos_token_id]
    return ids[:limit]


def parse_translation_task(task: str | None) -> tuple[str | None, str | None] | None:
    """(src_lang, tgt_lang) for "translation" ((None, None)) or "translation_XX_to_YY"; None for any other task."""
    if not isinstance(task, str):
        return None
    match = TRANSLATION_TASK_PATTERN.fullmatch(task)
    return (match["src"], match["tgt"]) if match else None


def _warn_unchecked_pair(asked: str) -> None:
    """Once: a language asked for where the model records no pair cannot be checked (it translates as trained)."""
    logger.warning_once(
        f"This model records no language pair (`custom_pipelines` in its config.json), so {asked} cannot be checked: "
        "it translates the pair it was trained on, whatever is asked. A repository exported by vaswani_transformer.hub "
        "records it."
    )


def model_language_pair(config) -> tuple[str, str] | None:
    """The language pair an exported model records in its `custom_pipelines` ("translation_XX_to_YY"), if any."""
    for task in getattr(config, "custom_pipelines", None) or {}:
        pair = parse_translation_task(task)
        if pair and pair[0]:
            return pair
    return None


# ------------------------------------------------------------------------------------------------ pipeline


def _is_hf_dataset(inputs) -> bool:
    return type(inputs).__module__.startswith("datasets.") and hasattr(inputs, "column_names")


class _Rows(torch.utils.data.Dataset):
    """The rows of a `datasets.Dataset` as a torch Dataset (so the pipeline batches and streams them)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


class TranslationPipeline(Pipeline):
    """Translate text with a sequence-to-sequence model (`model.generate` + `tokenizer.batch_decode`).

    Call with a string, a list of strings, a `datasets.Dataset` (rows in the `{"translation": {lang: text}}` form,
    read with the task's source language, or with one text column) or a `KeyDataset`. Returns, per input, a list
    of `num_return_sequences` dicts `{"translation_text": ...}`; for a list of strings with one return sequence
    each, the dict itself per input, and for a string a one-element list of it (as transformers 4's translation
    pipeline did).

    Parameters (at construction or per call): `max_source_length` (truncate longer sources, keeping `</s>`, with a
    warning; learned-position models are always limited to `max_position_embeddings`), `strict` (raise instead of
    truncating), `src_lang`/`tgt_lang` (default: from the task name "translation_XX_to_YY"; one that differs from the
    model's recorded pair, or the task's, is an error), transformers 4's
    `return_tensors`, `return_text` and `clean_up_tokenization_spaces` (its `truncation` is an error naming
    `max_source_length`), and any generation
    parameter (`num_beams`, `length_penalty`, `length_penalty_type`, `max_len_a`, `max_len_b`, `max_new_tokens`,
    `num_return_sequences`, ...), which `generate` receives on top of the model's generation config.

    An empty or whitespace-only source translates to "" and, with `return_tensors`, to the ids `[pad]` per returned
    sequence, in any batch (it is not sent through the model's output).
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False
    _load_tokenizer = True

    # `hardware.warn_if_emulated`, set by the package: this file is also copied for remote code, where it may import
    # only torch, transformers and its sibling files (hardware.py is not one), so a remote-code pipeline does not warn.
    precision_check = None

    # Generation fields of our models that `GenerationConfig()` does not know (so the base class does not collect them).
    _CUSTOM_GENERATION_FIELDS = CUSTOM_GENERATION_FIELDS

    def __init__(self, *args, task: str = "", **kwargs):
        if task.startswith(TASK_PREFIX) and parse_translation_task(task[len(TASK_PREFIX) :]) is not None:
            task = task[len(TASK_PREFIX) :]  # the registered "vaswani-translation..." is the user's "translation..."
        super().__init__(*args, task=task, **kwargs)
        if self.tokenizer is None:
            raise ValueError("TranslationPipeline needs a tokenizer (none was given or found next to the model).")
        if not getattr(self.model.config, "is_encoder_decoder", False):
            raise ValueError(
                f"TranslationPipeline needs an encoder-decoder model; got {type(self.model).__name__}. "
                "For decoder-only chat models use the `text-generation` pipeline."
            )
        if self.precision_check is not None:
            remedy = "load it in float32 (pipeline(..., dtype=torch.float32))"
            self.precision_check(self.model, "The pipeline's model", remedy)
        pair, recorded = parse_translation_task(self.task), model_language_pair(self.model.config)
        if pair is not None and pair[0] is not None and recorded is not None and tuple(pair) != recorded:
            raise ValueError(
                f"Task {self.task!r} asks for {pair[0]}->{pair[1]}, but this model translates "
                f"{recorded[0]}->{recorded[1]} (use 'translation' or 'translation_{recorded[0]}_to_{recorded[1]}')."
            )
        if pair is not None and pair[0] is not None and recorded is None:
            _warn_unchecked_pair(f"task {self.task!r}")

    def _sanitize_parameters(
        self, max_source_length=None, strict=None, src_lang=None, tgt_lang=None, return_tensors=None,
        return_text=None, clean_up_tokenization_spaces=None, truncation=None, **kwargs,
    ):  # fmt: skip
        if truncation is not None:  # transformers 4's tokenizer flag; here the rule has its own parameters
            raise ValueError(
                f"truncation={truncation!r}: this pipeline cuts longer sources with max_source_length=N (tokens, "
                "keeping </s>, with a warning naming the source) or refuses them with strict=True."
            )
        if return_text is False and not return_tensors:
            raise ValueError("return_text=False without return_tensors=True leaves nothing to return.")
        preprocess_params = {}
        if max_source_length is not None:
            preprocess_params["max_source_length"] = max_source_length
        if strict is not None:
            preprocess_params["strict"] = strict
        task_pair = parse_translation_task(self.task) or (None, None)
        known = model_language_pair(self.model.config) or task_pair  # what this model translates, where known
        for name, given, expected in (("src_lang", src_lang, known[0]), ("tgt_lang", tgt_lang, known[1])):
            if given is not None and expected is not None and given != expected:  # one pair per model: not ignored
                raise ValueError(f"{name}={given!r}, but this model translates {known[0]}->{known[1]}.")
            if given is not None and expected is None:
                _warn_unchecked_pair(f"{name}={given!r}")
        src_lang = src_lang or known[0]  # (a `{"translation": {...}}` row's source text)
        if src_lang is not None:
            preprocess_params["src_lang"] = src_lang
        forward_params = dict(kwargs)
        postprocess_params = {}
        for name, value in (("return_tensors", return_tensors), ("return_text", return_text),
                            ("clean_up_tokenization_spaces", clean_up_tokenization_spaces)):  # fmt: skip
            if value is not None:
                postprocess_params[name] = value
        return preprocess_params, forward_params, postprocess_params

    def __call__(self, inputs, *args, **kwargs):
        if _is_hf_dataset(inputs):  # a `datasets.Dataset`: stream its rows like a torch Dataset; an iterable one as
            inputs = _Rows(inputs) if hasattr(inputs, "__len__") else iter(inputs)  # a generator
        # The model's packed weights (`packed_cpu_weights`, from its own modeling file: remote code has its own) kept
        # for all batches of one call, where the model does not change; a lazy result packs per batch, as before.
        packed = getattr(sys.modules.get(type(self.model).__module__), "packed_cpu_weights", None)
        with packed() if packed is not None else contextlib.nullcontext():
            result = super().__call__(inputs, *args, **kwargs)
        if isinstance(inputs, list) and all(isinstance(x, str) for x in inputs) and all(len(r) == 1 for r in result):
            return [r[0] for r in result]
        return result

    def _text_of(self, inputs, src_lang):
        if isinstance(inputs, str):
            return inputs
        if isinstance(inputs, dict):
            if "translation" in inputs and isinstance(inputs["translation"], dict):
                pair = inputs["translation"]
                if src_lang is None or src_lang not in pair:
                    raise ValueError(
                        f"A translation example with languages {sorted(pair)} needs the source language: use the task "
                        "'translation_XX_to_YY' or pass src_lang=..."
                    )
                return pair[src_lang]
            texts = [v for v in inputs.values() if isinstance(v, str)]
            if len(texts) == 1:
                return texts[0]
            raise ValueError(
                f"Cannot tell which field of {sorted(inputs)} is the source text; pass a KeyDataset(dataset, column) "
                "or rows in the {'translation': {lang: text}} form."
            )
        raise TypeError(f"TranslationPipeline translates strings; got {type(inputs).__name__}.")

    def preprocess(self, inputs, max_source_length=None, strict=False, src_lang=None):
        text = self._text_of(inputs, src_lang)
        empty = not text.strip()
        ids = self.tokenizer(text if not empty else "", add_special_tokens=True)["input_ids"]
        limit = source_length_limit(self.model.config, max_source_length)
        if limit is not None and len(ids) > limit:
            where = f"a source of {len(ids)} tokens (starting {text[:40]!r})"
            if strict:
                raise ValueError(f"{where} is longer than the limit of {limit} tokens (strict mode).")
            logger.warning(f"Truncating {where} to {limit} tokens.")
            ids = truncate_source(ids, limit, self.tokenizer.eos_token_id)
        return {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "is_empty": torch.tensor([empty]),
        }

    def _forward(self, model_inputs, **generate_kwargs):
        is_empty = model_inputs.pop("is_empty")
        batch_size = model_inputs["input_ids"].shape[0]
        custom = {k: generate_kwargs.pop(k) for k in self._CUSTOM_GENERATION_FIELDS if k in generate_kwargs}
        generate_kwargs = {**self._prepare_generate_kwargs(generate_kwargs), **custom}
        if bool(is_empty.all()):
            output_ids = self._empty_output_ids(batch_size * self._num_return_sequences(generate_kwargs))
        else:
            # The tokenizer lets generate read stop strings (`stop_strings=...`, or in a generation config).
            output_ids = self.model.generate(**model_inputs, **{"tokenizer": self.tokenizer, **generate_kwargs})
        if not isinstance(output_ids, torch.Tensor):  # return_dict_in_generate (given, or saved in the config)
            output_ids = output_ids.sequences
        output_ids = output_ids.reshape(batch_size, -1, output_ids.shape[-1])
        return {"output_ids": output_ids, "is_empty": is_empty}

    def _num_return_sequences(self, generate_kwargs) -> int:
        """How many sequences `generate` returns per source: the call's, else its generation config's, else 1."""
        config = generate_kwargs.get("generation_config") or self.model.generation_config
        return generate_kwargs.get("num_return_sequences") or getattr(config, "num_return_sequences", None) or 1

    def _empty_output_ids(self, num_sequences: int) -> torch.Tensor:
        """The token ids returned for an empty source: `[pad]` per sequence, whatever batch the source shares."""
        return torch.full((num_sequences, 1), self.tokenizer.pad_token_id, dtype=torch.long)

    def postprocess(self, model_outputs, return_tensors=False, return_text=None, clean_up_tokenization_spaces=None):
        """Per returned sequence `{"translation_text": ...}`, or with `return_tensors` `{"translation_token_ids":
        ...}` (both with `return_text=True` too, as in transformers 4); `clean_up_tokenization_spaces` as in
        `tokenizer.decode` (default: the tokenizer's)."""
        output_ids = model_outputs["output_ids"][0]
        empty = bool(model_outputs["is_empty"].reshape(-1)[0])
        if empty:  # in a batch with other sources the model's ids for its padded row are no answer
            output_ids = self._empty_output_ids(len(output_ids))
        results = [{"translation_token_ids": ids} if return_tensors else {} for ids in output_ids]
        with_text = not return_tensors if return_text is None else return_text
        if with_text:
            decode = {}
            if clean_up_tokenization_spaces is not None:
                decode["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
            texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=True, **decode)
            for result, text in zip(results, texts):
                result["translation_text"] = "" if empty else text
        return results


# ------------------------------------------------------------------- registration with transformers' pipeline()


def _is_transformers_pipeline_call(frame) -> bool:
    """Whether `frame` runs transformers' own `pipeline()` function (defined in `transformers.pipelines`)."""
    return frame is not None and frame.f_code.co_name == "pipeline" and (
        frame.f_globals.get("__name__") == "transformers.pipelines"
    )


def _is_vaswani_model(model, config) -> bool:
    """Whether a `pipeline()` call's `config` (already loaded when `model` is a name or folder) or model object is
    one of ours. Only objects are inspected: nothing is read from disk or the Hub."""
    for candidate in (config, getattr(model, "config", None)):
        if candidate is not None and not isinstance(candidate, (str, os.PathLike)):
            return getattr(candidate, "model_type", None) == MODEL_TYPE
    return False


def _registered_task(task: str) -> str:
    """The registry task of our pipeline for "translation" or "translation_XX_to_YY" (registered on first use)."""
    name = f"{TASK_PREFIX}{task}"
    if name not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline(
            name, pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )
    return name


def _translation_task_resolver(original):
    """transformers' `_resolve_deprecated_task`, except that a translation task of a `pipeline()` call whose model
    is ours resolves to our registered task instead of raising "has been removed"."""

    @functools.wraps(original)
    def resolve_task(task):
        if parse_translation_task(task) is not None:
            caller = sys._getframe(1)
            if _is_transformers_pipeline_call(caller):
                arguments = caller.f_locals  # read only: the call's `model` and `config` at this point
                if _is_vaswani_model(arguments.get("model"), arguments.get("config")):
                    return _registered_task(task)
        return original(task)

    resolve_task.__vaswani_wrapped__ = original
    return resolve_task


def register_translation_pipeline() -> None:
    """Make `pipeline("translation"|"translation_XX_to_YY", model=<one of our models>)` work (idempotent), whether
    `pipeline` was imported from transformers before or after this package.

    This is the one place where the project touches transformers, and it changes nothing for other models.
    transformers 5's `pipeline()` refuses removed tasks such as "translation" by calling the module-level function
    `transformers.pipelines._resolve_deprecated_task(task)`, looked up at each call (so also from a `pipeline`
    name imported earlier). That function is replaced by a wrapper: when the task is a translation task and the
    calling `pipeline()` has one of our models (its loaded `config`, or a model object), the task resolves to
    "vaswani-translation" (or "vaswani-translation_XX_to_YY"), a task registered for `TranslationPipeline` with
    `PIPELINE_REGISTRY.register_pipeline`; the pipeline's `task` is then "translation" (or the pair) again. Every
    other call goes to transformers' function unchanged, with the same result or error.

    A folder or repository with `custom_pipelines` in its `config.json` (exported with `vaswani_transformer.hub`,
    or a training run's output folder) is resolved by transformers before this check: it runs the folder's own
    `pipeline.py` and asks for `trust_remote_code=True`, with or without this package.
    """
    _registered_task("translation")
    current = pipelines_module._resolve_deprecated_task
    if getattr(current, "__vaswani_wrapped__", None) is None:
        pipelines_module._resolve_deprecated_task = _translation_task_resolver(current)


__all__ = [
    "TranslationPipeline",
    "model_language_pair",
    "parse_translation_task",
    "register_translation_pipeline",
    "source_length_limit",
    "truncate_source",
]
