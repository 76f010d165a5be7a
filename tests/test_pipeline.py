"""pipeline("translation"): equal to generate + decode, with the package (registration) and without it (remote code)."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import transformers
from transformers import MarianConfig, MarianMTModel

import vaswani_transformer  # noqa: F401  (registers the model classes)
from vaswani_transformer import modeling_vaswani_transformer as modeling
from vaswani_transformer.hub import export_repository
from vaswani_transformer.pipeline import (
    REGISTERED_TASK,
    TranslationPipeline,
    parse_translation_task,
    register_translation_pipeline,
    source_length_limit,
    truncate_source,
)

from helpers import (
    SINGLE_THREAD_ENV,
    SOURCES,
    TEST_MAX_LEN_B,
    cpu_flags,
    generate_one_by_one,
    generate_texts,
    multiplies_by_flags,
    save_tiny_model,
    tiny_tokenizer,
    tiny_translation_model,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = save_tiny_model(folder)
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def exported(tmp_path_factory, saved):
    folder, model, tokenizer = saved
    out = tmp_path_factory.mktemp("export") / "repo"
    export_repository(folder, out, source_lang="en", target_lang="de")
    return out


@pytest.fixture(scope="module")
def translation_pipeline():
    register_translation_pipeline()  # what `import vaswani_transformer` does once the package calls it
    return transformers.pipeline


def texts(outputs):
    return [o["translation_text"] for o in outputs]


def test_pipeline_equals_generate_batched_and_single(saved, translation_pipeline):
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=str(folder))
    assert isinstance(pipe, TranslationPipeline) and pipe.task == "translation"
    expected = generate_texts(model, tokenizer, SOURCES)
    assert len(set(expected)) > 1, "the fixture model should not translate every sentence alike"
    assert expected == generate_one_by_one(model, tokenizer, SOURCES)  # the paper's beam search is batch-invariant
    assert texts(pipe(SOURCES, batch_size=4)) == expected
    assert texts(pipe(SOURCES)) == expected
    assert pipe(SOURCES[0]) == [{"translation_text": expected[0]}]
    # The decoding is the paper's (from the saved generation config), not transformers' defaults.
    assert pipe.model.generation_config.num_beams == 4 and pipe.model.generation_config.length_penalty == 0.6
    greedy = generate_texts(model, tokenizer, SOURCES, num_beams=1, max_len_b=7)
    assert texts(pipe(SOURCES, batch_size=3, num_beams=1, max_len_b=7)) == greedy
    pipe_greedy = translation_pipeline("translation", model=str(folder), num_beams=1, max_len_b=7)
    assert texts(pipe_greedy(SOURCES, batch_size=2)) == greedy


@pytest.mark.skipif(not modeling._HAS_ONEDNN_LINEAR, reason="packed weights need oneDNN's linear product")
def test_a_pipeline_call_packs_each_weight_once_for_all_its_batches(translation_pipeline):
    tokenizer = tiny_tokenizer()
    model = tiny_translation_model(tokenizer, d_model=64, d_ff=8192, init_std=0.3)  # 64 x 8192: packed on any CPU
    model.generation_config.max_len_a, model.generation_config.max_len_b = 0, 6
    packable = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.numel() >= 8192 * 64]
    pipe = translation_pipeline("translation", model=model, tokenizer=tokenizer)
    expected = generate_one_by_one(model, tokenizer, SOURCES)
    modeling.release_packed_weights(model)  # as a first call finds it: the reference's calls kept theirs
    with torch.profiler.profile() as profile:
        translated = texts(pipe(SOURCES, batch_size=1))
    packings = sum(event.name == "mkldnn::_reorder_linear_weight" for event in profile.events())
    assert translated == expected and len(set(expected)) > 2 and len(SOURCES) == 6 and len(packable) == 4
    assert 2 <= packings <= len(packable)  # the decoder's two at the first batch, the encoder's at the fourth
    with torch.profiler.profile() as profile:
        again = texts(pipe(SOURCES, batch_size=1))
    assert again == expected  # and a second run packs nothing: the copies are kept while the weights stay
    assert not any(event.name == "mkldnn::_reorder_linear_weight" for event in profile.events())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_pipeline_in_a_precision_the_cpu_emulates_is_warned_about(saved, dtype, translation_pipeline, caplog):
    """As vaswani-translate: a half precision this CPU multiplies in software (several times slower than float32)
    gets one warning naming float32; native precisions none."""
    if not cpu_flags():
        pytest.skip("needs Linux /proc/cpuinfo to know the CPU's features independently")
    folder = saved[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        pipe = translation_pipeline("translation", model=str(folder), dtype=getattr(torch, dtype))
    assert pipe.model.dtype == getattr(torch, dtype)
    warnings = [r.getMessage() for r in caplog.records if "multiplies" in r.getMessage()]
    if multiplies_by_flags(getattr(torch, dtype)):
        assert warnings == []
    else:
        assert len(warnings) == 1 and "pipeline's model" in warnings[0] and "float32" in warnings[0]


def test_pipeline_from_model_object_and_num_return_sequences(saved, translation_pipeline):
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=model, tokenizer=tokenizer)
    inputs = tokenizer(SOURCES[:2], return_tensors="pt", padding=True)
    output = model.generate(**inputs, num_return_sequences=2)
    expected = tokenizer.batch_decode(output, skip_special_tokens=True)
    result = pipe(SOURCES[:2], batch_size=2, num_return_sequences=2)
    assert [[o["translation_text"] for o in r] for r in result] == [expected[:2], expected[2:]]


def test_a_pipeline_over_an_int8_model_translates_as_its_generate_does(saved, translation_pipeline):
    """`pipeline("translation", model=quantized)`, a model whose linear layers `quantize_linear_layers` put in int8
    (PyTorch's dynamic quantization, as `vaswani-translate --quantization int8`), gives the quantized model's own
    `generate` translations of the same batches: one sentence at a time, and four. (int8 is not batch-invariant:
    the inputs' int8 scale is one per product, over the batch.)"""
    from vaswani_transformer.translate import load_model_and_tokenizer, quantization_of

    folder, _, _ = saved
    model, tokenizer = load_model_and_tokenizer(str(folder), quantization="int8")
    assert quantization_of(model) == "int8"
    pipe = translation_pipeline("translation", model=model, tokenizer=tokenizer)
    assert texts(pipe(SOURCES)) == generate_one_by_one(model, tokenizer, SOURCES)
    in_fours = [text for i in range(0, len(SOURCES), 4) for text in generate_texts(model, tokenizer, SOURCES[i : i + 4])]
    assert texts(pipe(SOURCES, batch_size=4)) == in_fours


def test_stop_strings_need_no_tokenizer_from_the_caller(saved, translation_pipeline):
    """`pipe(texts, stop_strings=[...])` passes generate its own tokenizer (generate needs one to read stop strings),
    with the paper's search and with greedy decoding: as generate given the tokenizer."""
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=str(folder))
    plain = generate_texts(model, tokenizer, SOURCES)
    for settings in ({}, {"num_beams": 1}):
        inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
        output = model.generate(**inputs, stop_strings=["eß"], tokenizer=tokenizer, **settings)
        expected = tokenizer.batch_decode(output, skip_special_tokens=True)
        assert texts(pipe(SOURCES, batch_size=2, stop_strings=["eß"], **settings)) == expected
    assert expected != plain and all("eß" in text for text in expected if text)


def test_transformers_4_output_parameters(saved, translation_pipeline):
    """transformers 4's translation-pipeline parameters: `clean_up_tokenization_spaces` decodes as the tokenizer does
    with it, `return_tensors` gives the token ids (with `return_text=True` the text too); `truncation` and
    `return_text=False` alone are errors naming what to do (they used to reach `generate` as unknown arguments)."""
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=str(folder))
    inputs = tokenizer(SOURCES[:3], return_tensors="pt", padding=True)
    output = model.generate(**inputs)
    for cleanup in (True, False):
        expected = tokenizer.batch_decode(output, skip_special_tokens=True, clean_up_tokenization_spaces=cleanup)
        assert texts(pipe(SOURCES[:3], batch_size=3, clean_up_tokenization_spaces=cleanup)) == expected
    both = pipe(SOURCES[:1], return_tensors=True, return_text=True)[0]
    ids = both["translation_token_ids"]
    assert both["translation_text"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert torch.equal(ids, model.generate(**tokenizer(SOURCES[:1], return_tensors="pt"))[0])
    assert set(pipe(SOURCES[:1], return_tensors=True)[0]) == {"translation_token_ids"}
    with pytest.raises(ValueError, match="max_source_length"):
        pipe(SOURCES[:1], truncation=True)
    with pytest.raises(ValueError, match="nothing to return"):
        pipe(SOURCES[:1], return_text=False)


def test_empty_and_whitespace_sources_translate_to_empty(saved, translation_pipeline):
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=str(folder))
    sources = ["", SOURCES[0], "   \t", SOURCES[1]]
    expected = generate_texts(model, tokenizer, [SOURCES[0], SOURCES[1]])
    assert texts(pipe(sources, batch_size=4)) == ["", expected[0], "", expected[1]]
    assert texts(pipe(["", " "], batch_size=2)) == ["", ""]
    assert pipe("") == [{"translation_text": ""}]


def test_empty_source_token_ids_do_not_depend_on_the_batch(saved, translation_pipeline):
    """With `return_tensors`, an empty source gives `[pad]` per returned sequence alone or batched with other
    sources (it used to give the model's ids for its padded row there), and the others give generate's ids."""
    folder, model, tokenizer = saved
    pipe = translation_pipeline("translation", model=str(folder))
    sources = [SOURCES[0], "", SOURCES[1], " "]
    pad = [tokenizer.pad_token_id]

    def token_ids(batch_size, **kwargs):
        result = pipe(sources, batch_size=batch_size, return_tensors=True, return_text=True, **kwargs)
        rows = [r if isinstance(r, list) else [r] for r in result]  # one sequence each: the dicts themselves
        return [[(o["translation_token_ids"].tolist(), o["translation_text"]) for o in row] for row in rows]

    for settings in ({"num_return_sequences": 1}, {"num_return_sequences": 2}):
        n = settings["num_return_sequences"]
        alone = token_ids(1, **settings)
        assert alone[1] == alone[3] == [(pad, "")] * n
        for batch_size in (2, 3, 4):
            batched = token_ids(batch_size, **settings)
            assert batched[1] == batched[3] == alone[1], batch_size  # (other rows' ids may carry the batch's padding)
            assert [[text for _, text in row] for row in batched] == [[text for _, text in row] for row in alone]
        generated = model.generate(**tokenizer(sources[:1], return_tensors="pt"), **settings)
        assert [ids for ids, _ in alone[0]] == generated.tolist()
    # the number of sequences set in the model's generation config, when the call does not name one
    pipe.model.generation_config.num_return_sequences = 2
    try:
        assert token_ids(1)[1] == token_ids(2)[1] == token_ids(4)[1] == [(pad, "")] * 2
    finally:
        pipe.model.generation_config.num_return_sequences = 1


def test_dataset_and_key_dataset_inputs(saved, translation_pipeline):
    from datasets import Dataset
    from transformers.pipelines.pt_utils import KeyDataset

    folder, model, tokenizer = saved
    expected = generate_texts(model, tokenizer, SOURCES)
    rows = Dataset.from_dict({"translation": [{"en": s, "de": "-"} for s in SOURCES], "text": SOURCES})
    pipe = translation_pipeline("translation_en_to_de", model=str(folder))
    assert [r[0]["translation_text"] for r in pipe(rows.select_columns(["translation"]), batch_size=4)] == expected
    plain = translation_pipeline("translation", model=str(folder))
    assert [r[0]["translation_text"] for r in plain(KeyDataset(rows, "text"), batch_size=4)] == expected
    with pytest.raises(ValueError, match="needs the source language"):
        list(plain(rows.select_columns(["translation"])))
    # a streamed (iterable) dataset, as a generator (it failed: "object of type 'IterableDataset' has no len()")
    streamed = rows.select_columns(["translation"]).to_iterable_dataset()
    assert [r[0]["translation_text"] for r in pipe(streamed, batch_size=4)] == expected
    # return_dict_in_generate (asked, or saved in a generation config) gives the same texts (it failed in reshape)
    assert texts(pipe(SOURCES[:2], return_dict_in_generate=True, output_scores=True)) == expected[:2]


def test_language_pair_of_an_exported_model_is_checked(exported, translation_pipeline):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(exported), AutoTokenizer.from_pretrained(exported)
    with pytest.raises(ValueError, match="this model translates en->de"):
        translation_pipeline("translation_fr_to_de", model=model, tokenizer=tokenizer)
    assert translation_pipeline("translation_en_to_de", model=model, tokenizer=tokenizer).task == "translation_en_to_de"
    # The exported folder lists its pipelines in `custom_pipelines`: transformers runs the folder's own pipeline.py,
    # which needs trust_remote_code=True (transformers' rule, decided before any task lookup), package or not.
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        translation_pipeline("translation_en_to_de", model=str(exported))
    remote = translation_pipeline("translation_en_to_de", model=str(exported), trust_remote_code=True)
    assert remote.task == "translation_en_to_de" and type(remote).__module__.startswith("transformers_modules.")
    with pytest.raises(ValueError, match="this model translates en->de"):  # not in custom_pipelines: ours checks it
        translation_pipeline("translation_fr_to_de", model=str(exported), trust_remote_code=True)
    # Languages given per call or at construction are checked the same way (they were ignored: German came back)
    for translator in (translation_pipeline("translation", model=model, tokenizer=tokenizer), remote):
        for given in (dict(src_lang="fr"), dict(tgt_lang="fr"), dict(src_lang="fr", tgt_lang="en")):
            named = ", ".join(f"{k}={v!r}" for k, v in given.items()).split(", ")[0]
            with pytest.raises(ValueError, match=rf"{named}, but this model translates en->de\."):
                translator("A man.", **given)
        assert translator("A man.", src_lang="en", tgt_lang="de") == translator("A man.")
    with pytest.raises(ValueError, match=r"tgt_lang='fr', but this model translates en->de\."):
        translation_pipeline("translation", model=model, tokenizer=tokenizer, tgt_lang="fr")


def test_a_pair_asked_of_a_model_that_records_none_is_warned_of_and_rows_take_the_recorded_source(
    saved, exported, translation_pipeline, caplog
):
    """A saved model without `custom_pipelines` cannot check a language pair asked of it: it translates what it was
    trained on, and says so once (before, 'translation_fr_to_ja' gave the model's German without a word). A model that
    records its pair reads `{"translation": {...}}` rows by its source language (it asked for src_lang)."""
    folder, _, _ = saved
    with caplog.at_level("WARNING", logger="vaswani_transformer.pipeline"):
        translation_pipeline("translation_fr_to_ja", model=str(folder))
    said = "records no language pair (`custom_pipelines` in its config.json), so task 'translation_fr_to_ja' cannot"
    assert said + " be checked" in caplog.text
    with caplog.at_level("WARNING", logger="vaswani_transformer.pipeline"):
        translation_pipeline("translation", model=str(folder))("A man.", tgt_lang="ja")
    assert "so tgt_lang='ja' cannot be checked" in caplog.text
    translator = translation_pipeline("translation", model=str(exported), trust_remote_code=True)
    row = {"translation": {"en": "A man.", "de": "Ein Mann."}}
    assert translator(row) == translator("A man.")


def test_learned_positions_truncate_with_warning_or_refuse_when_strict(tmp_path, translation_pipeline, caplog):
    folder = tmp_path / "learned"
    # 12 learned positions: enough for the decoder (max_len_b=10 tokens after <s>), fewer than the long source.
    model, tokenizer = save_tiny_model(folder, position_encoding="learned", max_position_embeddings=12)
    assert source_length_limit(model.config) == 12 and source_length_limit(model.config, 4) == 4
    long_source = SOURCES[1]
    ids = tokenizer(long_source)["input_ids"]
    assert len(ids) > 12
    truncated = truncate_source(ids, 12, tokenizer.eos_token_id)
    assert truncated == ids[:11] + [tokenizer.eos_token_id]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([truncated]), attention_mask=torch.ones(1, 12, dtype=torch.long))
    expected = tokenizer.batch_decode(out, skip_special_tokens=True)[0]

    pipe = translation_pipeline("translation", model=str(folder))
    with caplog.at_level(logging.WARNING):
        assert pipe(long_source) == [{"translation_text": expected}]
    assert f"source of {len(ids)} tokens" in caplog.text and "to 12 tokens" in caplog.text
    with pytest.raises(ValueError, match="longer than the limit of 12 tokens"):
        pipe(long_source, strict=True)
    with pytest.raises(ValueError, match="longer than the limit of 3 tokens"):
        pipe(SOURCES[0], max_source_length=3, strict=True)


# pipeline() calls in a fresh Python that imports this package before or after transformers' `pipeline` (or not at
# all); prints each call's outcome: the pipeline's class, task and translations, or the exception's type and message.
PIPELINE_CALLS_SCRIPT = """
import json, sys
order, calls = sys.argv[1], json.loads(sys.argv[2])
if order == "package-first":
    import vaswani_transformer
from transformers import pipeline
if order == "transformers-first":
    import vaswani_transformer
from transformers import AutoModelForSeq2SeqLM
results = []
for task, folder, as_object, call_kwargs in calls:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder) if as_object else folder
    try:
        pipe = pipeline(task, model=model, **call_kwargs)
        outputs = pipe(["A man is riding a bicycle.", "Two dogs."], batch_size=2)
        results.append([type(pipe).__name__, pipe.task, [o["translation_text"] for o in outputs]])
    except Exception as error:
        results.append([type(error).__name__, str(error)])
print(json.dumps(results))
"""


def run_pipeline_calls(order: str, calls: list, cwd) -> list:
    done = subprocess.run(
        [sys.executable, "-c", PIPELINE_CALLS_SCRIPT, order, json.dumps(calls)], capture_output=True, text=True,
        cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **SINGLE_THREAD_ENV}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["transformers-first", "package-first"])
def test_pipeline_works_in_any_import_order(saved, tmp_path, order):
    """`from transformers import pipeline` before `import vaswani_transformer` (isort's order) or after it."""
    folder, model, tokenizer = saved
    expected = generate_texts(model, tokenizer, ["A man is riding a bicycle.", "Two dogs."])
    calls = [["translation", str(folder), False, {}], ["translation_en_to_de", str(folder), False, {}],
             ["translation", str(folder), True, {"tokenizer": str(folder)}]]  # fmt: skip
    assert run_pipeline_calls(order, calls, tmp_path) == [
        ["TranslationPipeline", "translation", expected],
        ["TranslationPipeline", "translation_en_to_de", expected],
        ["TranslationPipeline", "translation", expected],
    ]


def test_other_models_keep_transformers_behaviour(tmp_path, saved):
    """A MarianMTModel gets exactly what it gets without this package, whichever import comes first."""
    folder, _, _ = saved
    marian_dir = tmp_path / "marian"
    marian_config = MarianConfig(vocab_size=320, d_model=8, encoder_layers=1, decoder_layers=1,
                                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=8,
                                 decoder_ffn_dim=8, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2,
                                 forced_eos_token_id=2, max_length=8)  # fmt: skip
    torch.manual_seed(0)
    MarianMTModel(marian_config).save_pretrained(marian_dir)
    calls = [[task, str(marian_dir), as_object, kwargs]
             for task in ("translation", "translation_en_to_de", "summarization")
             for as_object in (False, True) for kwargs in ({}, {"tokenizer": str(folder)})]  # fmt: skip
    without = run_pipeline_calls("without-package", calls, tmp_path)
    assert all(r[0] == "KeyError" and "has been removed from transformers" in r[1] for r in without)
    for order in ("transformers-first", "package-first"):
        assert run_pipeline_calls(order, calls, tmp_path) == without, order


def test_other_tasks_on_our_models_are_untouched(saved, translation_pipeline):
    folder, _, _ = saved
    with pytest.raises(KeyError, match="summarization has been removed"):
        transformers.pipeline("summarization", model=str(folder))
    assert parse_translation_task("translation_en_to_de") == ("en", "de")
    assert parse_translation_task("translation") == (None, None)
    assert parse_translation_task("text-generation") is None
    assert REGISTERED_TASK in transformers.pipelines.PIPELINE_REGISTRY.get_supported_tasks()
    register_translation_pipeline()  # idempotent: still one wrapper around transformers' function
    wrapped = transformers.pipelines._resolve_deprecated_task.__vaswani_wrapped__
    assert getattr(wrapped, "__vaswani_wrapped__", None) is None
    assert transformers.pipeline is transformers.pipelines.pipeline  # transformers' own function, not replaced


@pytest.mark.slow
def test_remote_code_pipeline_equals_generate_without_the_package(exported, saved, python_without_package, tmp_path):
    """Only transformers: pipeline("translation", trust_remote_code=True) on the exported folder == generate."""
    _, model, tokenizer = saved
    expected = generate_texts(model, tokenizer, SOURCES)
    greedy = generate_texts(model, tokenizer, SOURCES, num_beams=1)
    result = python_without_package(
        f"""
        import json
        import torch
        torch.set_num_threads(1)
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        folder = {str(exported)!r}
        sources = {SOURCES!r}
        translator = pipeline("translation", model=folder, trust_remote_code=True)
        pair = pipeline("translation_en_to_de", model=folder, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        generated = tokenizer.batch_decode(
            model.generate(**tokenizer(sources, return_tensors="pt", padding=True)), skip_special_tokens=True
        )
        print(json.dumps({{
            "pipeline": [o["translation_text"] for o in translator(sources, batch_size=4)],
            "pair": [o["translation_text"] for o in pair(sources)],
            "greedy": [o["translation_text"] for o in translator(sources, batch_size=2, num_beams=1)],
            "generate": generated,
            "pipeline_module": type(translator).__module__,
            "model_module": type(model).__module__,
            "decoding": [model.generation_config.num_beams, model.generation_config.length_penalty,
                         model.generation_config.length_penalty_type, model.generation_config.max_len_b],
        }}))
        """
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["pipeline_module"].startswith("transformers_modules.")
    assert report["model_module"].startswith("transformers_modules.")
    assert report["generate"] == expected
    assert report["pipeline"] == expected and report["pair"] == expected
    assert report["greedy"] == greedy
    assert report["decoding"] == [4, 0.6, "gnmt", TEST_MAX_LEN_B]
