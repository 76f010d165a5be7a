"""translate_lines and vaswani-translate (scripts/translate.py): line for line, empty lines, truncation, bad input
named by line."""

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

import vaswani_transformer  # noqa: F401
from vaswani_transformer import modeling_vaswani_transformer as modeling
from vaswani_transformer.hardware import multiplies_natively
from vaswani_transformer.textio import one_line
from vaswani_transformer.translate import (
    check_model_folder,
    iter_translations,
    load_model_and_tokenizer,
    main,
    translate_file,
    translate_lines,
)

from helpers import (
    MALLINFO_PRELUDE,
    SINGLE_THREAD_ENV,
    SOURCES,
    cpu_flags,
    generate_texts,
    multiplies_by_flags,
    save_tiny_model,
    tiny_tokenizer,
    tiny_translation_model,
)


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "translate.py"
MAX_POSITIONS = 16  # learned positions: long lines must be truncated to 16 source tokens
LONG_LINE = " ".join(SOURCES[1:] * 2)
LINES = [SOURCES[0], "", LONG_LINE, "   \t", "Grüße aus Köln — 東京 😀 ñ", "x", SOURCES[4]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learned")
    model, tokenizer = save_tiny_model(folder, position_encoding="learned", max_position_embeddings=MAX_POSITIONS)
    return folder, model, tokenizer


def reference(model, tokenizer, lines, limit=MAX_POSITIONS, **generate_kwargs):
    """One sentence at a time through generate, truncating (keeping </s>) by hand; "" for blank lines."""
    out = []
    for line in lines:
        if not line.strip():
            out.append("")
            continue
        ids = tokenizer(line)["input_ids"]
        if len(ids) > limit:
            ids = ids[: limit - 1] + [tokenizer.eos_token_id]
        with torch.no_grad():
            mask = torch.ones(1, len(ids), dtype=torch.long)
            generated = model.generate(input_ids=torch.tensor([ids]), attention_mask=mask, **generate_kwargs)
        out.append(tokenizer.batch_decode(generated, skip_special_tokens=True)[0])
    return out


def run_cli(*args, stdin: bytes | None = None, cwd=None):
    # PYTHONIOENCODING=ascii: the output must be UTF-8 whatever the locale says
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **SINGLE_THREAD_ENV, "PYTHONIOENCODING": "ascii"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--no-progress"], input=stdin,
                          capture_output=True, env=env, cwd=cwd, timeout=300)  # fmt: skip


def test_translate_lines_matches_generate_whatever_the_batching(saved, caplog):
    folder, model, tokenizer = saved
    assert len(tokenizer(LONG_LINE)["input_ids"]) > MAX_POSITIONS
    expected = reference(model, tokenizer, LINES)
    assert len(set(expected)) > 2
    for max_tokens in (1, 4096):  # one sentence per batch, everything in one batch (the CLI test uses 24)
        caplog.clear()
        assert translate_lines(model, tokenizer, LINES, max_tokens=max_tokens, source_name="in.txt") == expected
        assert "in.txt:3: the source has" in caplog.text and f"limit of {MAX_POSITIONS}" in caplog.text
    # A user limit below the model's: every line longer than 5 tokens is truncated.
    assert translate_lines(model, tokenizer, LINES, max_source_length=5) == reference(model, tokenizer, LINES, limit=5)


@pytest.mark.skipif(not modeling._HAS_ONEDNN_LINEAR, reason="packed weights need oneDNN's linear product")
def test_translate_lines_packs_each_weight_once_for_all_batches():
    # Each generate call packed its own copies before they were kept from call to call (`packed_cpu_weights`): ~90 ms
    # per batch for WMT's base output layer, a few % of a batch.
    tokenizer = tiny_tokenizer()
    model = tiny_translation_model(tokenizer, d_model=64, d_ff=8192, init_std=0.3)  # 64 x 8192: packed on any CPU
    packable = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.numel() >= 8192 * 64]
    lines = [line for line in LINES if line.strip()]
    expected = reference(model, tokenizer, lines, limit=10**6, max_len_a=0, max_len_b=6)
    modeling.release_packed_weights(model)  # as a first call finds it: the reference's calls kept theirs
    with torch.profiler.profile() as profile:
        translated = translate_lines(model, tokenizer, lines, max_tokens=1, max_len_a=0, max_len_b=6)
    packings = sum(event.name == "mkldnn::_reorder_linear_weight" for event in profile.events())
    assert translated == expected and len(set(expected)) > 2 and len(lines) == 5 and len(packable) == 4
    assert 2 <= packings <= len(packable)  # the decoder's two at the first batch, the encoder's at the fourth
    with torch.profiler.profile() as profile:
        again = translate_lines(model, tokenizer, lines, max_tokens=1, max_len_a=0, max_len_b=6)
    assert again == expected  # and a second run packs nothing: the copies are kept while the weights stay
    assert not any(event.name == "mkldnn::_reorder_linear_weight" for event in profile.events())


_TRANSLATE_THEN_PROBE_MALLOC = MALLINFO_PRELUDE + """
import importlib
main = importlib.import_module(f"vaswani_transformer.{sys.argv[1]}").main
assert main(sys.argv[2:]) == 0
before = libc.mallinfo2().hblkhd
block = torch.empty(16 << 20)  # 64 MB of float32: a block of its own (mapped) unless freed memory is kept
print(json.dumps(libc.mallinfo2().hblkhd - before))
"""


@pytest.mark.parametrize("cli, keep", [("translate", None), ("translate", "false"), ("evaluation", None)])
def test_cli_keeps_freed_memory_on_a_cpu_unless_told_not_to(saved, tmp_path, cli, keep):
    # Decoding and packing weights allocate the same large tensors call after call: faulted back in every time,
    # translating test_2016_flickr took 3-8% longer (whole command) and more memory.
    folder = saved[0]
    (tmp_path / "in.txt").write_text("A man is riding a bicycle.\n", encoding="utf-8")
    args = ["--model", folder, "--device", "cpu"]
    if cli == "translate":
        args += ["--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt", "--no-progress"]
    else:
        args += ["--source", tmp_path / "in.txt", "--reference", tmp_path / "in.txt", "--hypotheses_file",
                 tmp_path / "out.txt"]  # fmt: skip
    args += ["--keep_freed_cpu_memory", keep] if keep else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **SINGLE_THREAD_ENV}
    probe = subprocess.run([sys.executable, "-c", _TRANSLATE_THEN_PROBE_MALLOC, cli, *map(str, args)],
                           capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    mapped = json.loads(probe.stdout.splitlines()[-1])
    if mapped is None:
        pytest.skip("not glibc (no mallinfo2): keeping freed memory is a no-op there")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 1
    assert mapped == 0 if keep is None else mapped >= 64 << 20


def test_translate_lines_decoding_overrides(saved):
    folder, model, tokenizer = saved
    kwargs = dict(num_beams=2, length_penalty=1.0, max_len_a=0, max_len_b=5)
    expected = reference(model, tokenizer, LINES, **kwargs)
    assert translate_lines(model, tokenizer, LINES, max_tokens=30, **kwargs) == expected
    # the same as the model's generate for short sources, in one padded batch
    short = [SOURCES[0], SOURCES[2], SOURCES[4]]
    assert translate_lines(model, tokenizer, short, num_beams=1) == generate_texts(model, tokenizer, short, num_beams=1)


def test_translate_lines_bad_input(saved):
    folder, model, tokenizer = saved
    assert translate_lines(model, tokenizer, ["", " "]) == ["", ""]
    assert translate_lines(model, tokenizer, []) == []
    with pytest.raises(ValueError, match=r"in.txt:3: the source has \d+ tokens, more than the limit of 16 \(strict"):
        translate_lines(model, tokenizer, LINES, strict=True, source_name="in.txt")
    with pytest.raises(TypeError, match="line 2 is a int"):
        translate_lines(model, tokenizer, ["a", 3])
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        translate_lines(model, tokenizer, ["a"], max_tokens=0)
    # one translation per line: an n-best request is refused (it returned the first of each line without a word)
    with pytest.raises(ValueError, match=r"num_return_sequences=2: translating gives one translation per line"):
        translate_lines(model, tokenizer, ["a", "b"], num_return_sequences=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_multiplies_natively_follows_the_cpus_flags(dtype):
    """bf16 is native where Linux lists avx512_bf16 or amx_bf16, fp16 where it lists avx512_fp16 or amx_fp16 (the
    CPUID bits torch probes, read independently), float32 everywhere."""
    if not cpu_flags():
        pytest.skip("needs Linux /proc/cpuinfo to know the CPU's features independently")
    assert multiplies_natively(dtype, "cpu") == multiplies_by_flags(dtype)
    # torch multiplies half precision through oneDNN alone: disabled, it emulates it (~150x slower than float32; it
    # was reported native)
    with torch.backends.mkldnn.flags(enabled=False):
        assert multiplies_natively(dtype, "cpu") == (dtype == torch.float32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_model_in_a_precision_the_cpu_emulates_is_warned_about(saved, dtype, tmp_path, caplog):
    """A model loaded (--dtype, or saved so) in a half precision this CPU multiplies in software, several times slower
    than float32, gets one warning naming the model and --dtype float32; native precisions none. The same for a
    model saved in that precision and loaded as saved."""
    if not cpu_flags():
        pytest.skip("needs Linux /proc/cpuinfo to know the CPU's features independently")
    folder, emulated = saved[0], not multiplies_by_flags(getattr(torch, dtype))
    as_saved = tmp_path / dtype
    shutil.copytree(folder, as_saved)
    for path, asked in ((folder, dtype), (as_saved, None)):
        caplog.clear()
        loaded, _ = load_model_and_tokenizer(path, dtype=asked)
        assert loaded.dtype == getattr(torch, dtype)
        warned = [r.getMessage() for r in caplog.records if "in software" in r.getMessage()]
        assert len(warned) == emulated, warned
        if emulated:
            assert str(path) in warned[0] and "--dtype float32" in warned[0] and dtype in warned[0]
        loaded.save_pretrained(as_saved)  # the second round loads it as saved


def test_model_folder_checks(tmp_path, saved):
    folder, _, _ = saved
    check_model_folder(folder)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"missing: the weights .*; the tokenizer"):
        check_model_folder(broken)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    (broken / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors .a weight shard listed"):
        check_model_folder(broken)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_and_tokenizer(tmp_path / "nope")


@pytest.mark.slow
def test_cli_file_to_file_line_for_line(tmp_path, saved):
    folder, model, tokenizer = saved
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / "out" / "hyp.txt"
    result = run_cli("--model_name_or_path", folder, "--input", source, "--output", output, "--max_tokens", 24)
    assert result.returncode == 0, result.stderr.decode()
    written = output.read_bytes().decode("utf-8")
    assert written.endswith("\n") and written.count("\n") == len(LINES)
    assert written.split("\n")[:-1] == [one_line(t) for t in reference(model, tokenizer, LINES)]
    assert written.split("\n")[1] == "" and written.split("\n")[3] == ""
    assert f"{source}:3: the source has" in result.stderr.decode()


@pytest.mark.slow
def test_cli_stdin_to_stdout_with_decoding_options(saved):
    folder, model, tokenizer = saved
    lines = LINES[:2] + LINES[4:]  # no final newline on the last line: still one output line per input line
    # the older spellings (--model, --beam, --alpha, dashes) are aliases of --model_name_or_path, --num_beams, ...
    result = run_cli("--model", folder, "--beam", 2, "--alpha", 1.0, "--max-len-a", 0, "--max-len-b", 5,
                     "--dtype", "float32", "--device", "cpu", stdin="\n".join(lines).encode("utf-8"))  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    expected = reference(model, tokenizer, lines, num_beams=2, length_penalty=1.0, max_len_a=0, max_len_b=5)
    assert result.stdout.decode("utf-8").split("\n")[:-1] == [one_line(t) for t in expected]


@pytest.mark.slow
def test_cli_errors_name_the_problem(tmp_path, saved):
    folder, _, _ = saved
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / "hyp.txt"
    strict = run_cli("--model", folder, "--input", source, "--output", output, "--strict")
    assert strict.returncode == 1 and f"{source}:3: the source has" in strict.stderr.decode()
    assert output.read_bytes() == b""  # the output is opened first; nothing before line 3's window was finished

    source.write_bytes(b"fine\n\xc3\x28 broken\n")
    bad = run_cli("--model", folder, "--input", source, "--output", output)
    assert bad.returncode == 1 and f"{source}:2: invalid UTF-8" in bad.stderr.decode()
    assert output.read_bytes() == b""

    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    missing = run_cli("--model", incomplete, "--input", source)
    message = missing.stderr.decode()
    assert missing.returncode == 1 and "config.json" in message and "the weights" in message
    assert "the tokenizer" not in message


# ------------------------------------------------------------------------------ streaming, interrupting, resuming


def test_windows_translate_the_same_and_read_the_input_lazily(saved, caplog):
    folder, model, tokenizer = saved
    expected = reference(model, tokenizer, LINES)
    for window in (2, None):  # windows of 2 lines; everything in one window
        assert translate_lines(model, tokenizer, LINES, window=window, max_tokens=24, source_name="in.txt") == expected
    assert "in.txt:3: the source has" in caplog.text  # line numbers count across windows
    read = []

    def source():
        for line in LINES * 2:
            read.append(line)
            yield line

    translations = iter_translations(model, tokenizer, source(), window=3)
    assert next(translations) == expected[0] and len(read) == 3  # only the first window has been read
    assert [expected[0], *translations] == expected * 2


def test_resume_refuses_what_it_cannot_continue(tmp_path, saved, capsys):
    folder, model, tokenizer = saved
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("a\nb\n", encoding="utf-8")
    output.write_text("1\n2\n3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"out.txt holds 3 lines but .*in.txt only 2: not its translation"):
        translate_file(model, tokenizer, source, output, resume=True)
    assert main(["--model_name_or_path", str(folder), "--input", str(source), "--resume"]) == 1
    assert "error: --resume needs --output FILE" in capsys.readouterr().err
    # CTranslate2 computes in the type it was exported in: options only our engine honours are refused, not ignored
    for extra in (["--dtype", "bf16"], ["--revision", "main"], ["--trust_remote_code"]):
        assert main(["--model_name_or_path", str(folder), "--input", str(source), "--engine", "ctranslate2", *extra]) == 1
        assert f"error: {extra[0]} need --engine transformers" in capsys.readouterr().err
    # Batch sizes below 1, for either engine, are refused when the command line is read, naming the option
    # (`--window 0` passed the check above as False and ended in a TypeError with ctranslate2)
    for engine in ("transformers", "ctranslate2"):
        for extra in (["--window", "0"], ["--max_tokens", "0"], ["--max_tokens", "-3"]):
            with pytest.raises(SystemExit) as exit_info:
                main(["--model_name_or_path", str(folder), "--input", str(source), "--engine", engine, *extra])
            assert exit_info.value.code == 2
            assert f"{extra[0].replace('_', '-')}: must be >= 1, got {extra[1]}" in capsys.readouterr().err


def test_resume_refuses_an_output_begun_by_another_model_or_options(tmp_path, saved, capsys, caplog):
    """An unfinished output records its run beside it; resuming it with another model, input, generation config or
    decoding option would mix two translations in one file: refused, naming what changed. Batching may change."""
    folder, _, _ = saved
    model, tokenizer = load_model_and_tokenizer(str(folder))
    save_tiny_model(tmp_path / "other", seed=2, position_encoding="learned", max_position_embeddings=MAX_POSITIONS)
    other, _ = load_model_and_tokenizer(str(tmp_path / "other"))
    source, output, record = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "out.txt.translate.json"
    source.write_bytes(("\n".join(LINES[:3]) + "\n").encode() + b"\xff\n")
    with pytest.raises(ValueError, match="UTF-8"):  # a run that stops part-way: invalid UTF-8 on line 4
        translate_file(model, tokenizer, source, output, num_beams=2, window=1)
    assert len(output.read_text(encoding="utf-8").splitlines()) == 3 and record.exists()
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")  # the input mended
    shutil.copy(source, tmp_path / "copy.txt")
    begun = output.read_bytes(), record.read_bytes()

    def refused(changed: str, *args, **kwargs):
        with pytest.raises(ValueError, match=rf"out.txt was begun by another run \({changed}[.:].* then, .* now\)"):
            translate_file(*args, output, resume=True, **kwargs)
        assert (output.read_bytes(), record.read_bytes()) == begun

    refused("model", other, tokenizer, source, num_beams=2)
    refused("input", model, tokenizer, tmp_path / "copy.txt", num_beams=2)
    refused("decoding", model, tokenizer, source)
    refused("decoding", model, tokenizer, source, num_beams=2, length_penalty_type="transformers")
    model.generation_config.length_penalty = 1.0
    refused("decoding", model, tokenizer, source, num_beams=2)
    model.generation_config.length_penalty = 0.6
    record.write_text('{"model": ', encoding="utf-8")  # cut short (a kill while it was written)
    with pytest.raises(ValueError, match=r"the run record .*out.txt.translate.json cannot be read .* delete it"):
        translate_file(model, tokenizer, source, output, resume=True, num_beams=2)
    record.write_bytes(begun[1])
    assert main(["--model", str(folder), "-i", str(source), "-o", str(output), "--resume", "--num_beams", "3"]) == 1
    assert "error: --resume: " in capsys.readouterr().err and output.read_bytes() == begun[0]
    # The same run resumes (other batching, or an option given at the model's own value, is fine): the file equals
    # an uninterrupted run's, and the record goes.
    assert translate_file(model, tokenizer, source, output, resume=True, num_beams=2, window=3, max_tokens=64,
                          length_penalty=model.generation_config.length_penalty) == 7  # fmt: skip
    assert output.read_text(encoding="utf-8").splitlines() == translate_lines(model, tokenizer, LINES, num_beams=2)
    assert not record.exists()
    # An output begun before runs were recorded resumes with a warning that nothing could be checked.
    output.write_bytes(begun[0])
    with caplog.at_level(logging.WARNING, logger="vaswani_transformer.translate"):
        translate_file(model, tokenizer, source, output, resume=True, num_beams=2)
    assert "no out.txt.translate.json beside" in caplog.text and not record.exists()
    # No record beside what is not a regular file (/dev/null, a pipe); one that cannot be written is a warning.
    assert translate_file(model, tokenizer, source, os.devnull) == 7 and not os.path.exists(os.devnull + ".translate.json")
    record.mkdir()
    with caplog.at_level(logging.WARNING, logger="vaswani_transformer.translate"):
        assert translate_file(model, tokenizer, source, output) == 7
    assert "Could not write the run record" in caplog.text and record.is_dir()
    record.rmdir()
    # A length saved in the generation config gives way to a rule given, even at the config's own values: a resume
    # that gives one where the run did not decodes otherwise. Only the fields that changed are named.
    model.generation_config.max_new_tokens = 3
    source.write_bytes(("\n".join(LINES[:3]) + "\n").encode() + b"\xff\n")
    with pytest.raises(ValueError, match="UTF-8"):
        translate_file(model, tokenizer, source, output, num_beams=2, window=1)
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as refusal:
        translate_file(model, tokenizer, source, output, resume=True, num_beams=3,
                       max_len_b=model.generation_config.max_len_b)  # fmt: skip
    assert "(decoding.num_beams: 2 then, 3 now; length_rule_given: False then, True now)" in str(refusal.value)
    model.generation_config.max_new_tokens = None


def test_resume_with_ctranslate2_refuses_an_output_begun_by_another_run(tmp_path, saved, request, capsys):
    """`--engine ctranslate2` records its run beside the output as our engine does: a resume with other decoding
    options, or with the other engine, is refused naming what changed; the same run resumes to the whole output."""
    from vaswani_transformer.ctranslate2_export import decoding_options, load_translator, translate_lines_ctranslate2

    folder = saved[0]
    exported = request.getfixturevalue("exported")
    source, output, record = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "out.txt.translate.json"
    source.write_bytes(("\n".join(LINES[:3]) + "\n").encode() + b"\xff\n")
    argv = ["--engine", "ctranslate2", "--model", str(exported), "-i", str(source), "-o", str(output), "--window", "1"]
    assert main(argv) == 1 and "UTF-8" in capsys.readouterr().err  # a run that stops part-way, on line 4
    assert len(output.read_text(encoding="utf-8").splitlines()) == 3 and record.exists()
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")  # the input mended
    begun = output.read_bytes(), record.read_bytes()
    for other, changed in (
        (["--num_beams", "2"], "decoding.num_beams: 4 then, 2 now"),
        (["--engine", "transformers", "--model", str(folder)], "engine: 'ctranslate2' then, 'transformers' now"),
    ):
        assert main([*argv, "--resume", *other]) == 1
        assert changed in capsys.readouterr().err
        assert (output.read_bytes(), record.read_bytes()) == begun
    assert main([*argv, "--resume", "--window", "4"]) == 0 and not record.exists()
    translator, tokenizer, defaults = load_translator(str(exported))
    expected = translate_lines_ctranslate2(translator, tokenizer, LINES, **decoding_options(defaults))
    assert output.read_text(encoding="utf-8").split("\n") == [one_line(t) for t in expected] + [""]


def test_int8_quantization_of_every_linear_layer_translates_is_recorded_for_resume_and_refuses_what_it_cannot(
    tmp_path, saved, capsys
):
    """`--quantization int8` (`load_model_and_tokenizer(..., quantization="int8")`): every linear layer of the model
    in int8 (PyTorch's dynamic quantization), one translation per line as the model so quantized gives them; the run
    record names it, so a file begun in float32 does not resume in int8; a bf16 model, another quantization and the
    CTranslate2 engine are refused with the reason."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    from vaswani_transformer.translate import quantization_of, quantize_linear_layers

    folder, _, _ = saved
    model, tokenizer = load_model_and_tokenizer(str(folder), quantization="int8")
    linear = [type(m) for m in model.modules() if isinstance(m, (torch.nn.Linear, DynamicQuantizedLinear))]
    assert linear and set(linear) == {DynamicQuantizedLinear} and quantization_of(model) == "int8"
    expected = translate_lines(model, tokenizer, LINES)
    assert len(expected) == len(LINES) and expected[1] == expected[3] == ""
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = run_cli("--model", folder, "--input", source, "--output", output, "--quantization", "int8")
    assert result.returncode == 0, result.stderr.decode()
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == [one_line(t) for t in expected]

    plain, _ = load_model_and_tokenizer(str(folder))
    assert quantization_of(plain) is None
    source.write_bytes(("\n".join(LINES[:3]) + "\n").encode() + b"\xff\n")
    with pytest.raises(ValueError, match="UTF-8"):  # a float32 run that stops at line 4
        translate_file(plain, tokenizer, source, output, window=1)
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"begun by another run \(quantization: None then, 'int8' now\)"):
        translate_file(model, tokenizer, source, output, resume=True)

    with pytest.raises(ValueError, match="quantizes float32 weights; this model's are bfloat16"):
        load_model_and_tokenizer(str(folder), dtype="bfloat16", quantization="int8")
    with pytest.raises(ValueError, match="Unknown quantization 'int4'"):
        quantize_linear_layers(plain, "int4")
    assert main(["--model", str(folder), "-i", str(source), "--quantization", "int8", "--engine", "ctranslate2"]) == 1
    assert "--quantization need --engine transformers (with ctranslate2 the weight type" in capsys.readouterr().err


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, saved, capsys, monkeypatch):
    # Opening the output emptied the input before a line was read: exit 0, an empty file (--resume: nothing done).
    folder, model, tokenizer = saved
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    content = source.read_bytes()
    (tmp_path / "link.txt").symlink_to(source)
    os.link(source, tmp_path / "hard.txt")
    for output in (source, tmp_path / "link.txt", tmp_path / "hard.txt", tmp_path / "sub" / ".." / "in.txt"):
        for resume in ([], ["--resume"]):
            assert main(["--model", str(folder), "--input", str(source), "--output", str(output), *resume]) == 1
            assert capsys.readouterr().err == (f"error: --output {output} is the same file as --input {source}: "
                                               "writing it would destroy the input; write to another file.\n")
        with pytest.raises(ValueError, match="is the same file as"):  # the library function refuses it too
            translate_file(model, tokenizer, source, output)
    with open(source, "rb") as stdin:  # `vaswani-translate --output in.txt < in.txt`
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main(["--model", str(folder), "--output", str(source)]) == 1
    assert "is the same file as standard input" in capsys.readouterr().err
    assert source.read_bytes() == content


def test_an_input_that_changes_while_translated_is_an_error_not_a_short_output(tmp_path, saved):
    folder, model, tokenizer = saved
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(SOURCES[0] + "\n" + "\n" * 200_000, encoding="utf-8")  # longer than any read buffer

    class EmptyTheInput(logging.Handler):
        def emit(self, record):  # at line 1's truncation warning, another program empties the input
            source.write_bytes(b"")

    handler = EmptyTheInput()
    logging.getLogger("vaswani_transformer.translate").addHandler(handler)
    try:
        with pytest.raises(ValueError, match=r"in.txt: \d+ lines read \(200001 when the run began\) but \d+ in "
                                             r".*out.txt: the input changed while it was translated"):  # fmt: skip
            translate_file(model, tokenizer, source, output, max_source_length=2, show_progress=False)
    finally:
        logging.getLogger("vaswani_transformer.translate").removeHandler(handler)


def test_standard_streams_without_a_byte_layer_are_read_and_written_as_text(saved, monkeypatch):
    # contextlib.redirect_stdout(io.StringIO()) and Jupyter give streams without .buffer
    folder, model, tokenizer = saved
    lines = [SOURCES[0], "", "Grüße aus Köln — 東京 😀", SOURCES[4]]
    expected = [one_line(t) for t in translate_lines(model, tokenizer, lines)]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeff" + "\r\n".join(lines)))  # a BOM, CRLF, no final break
    written = io.StringIO()
    with contextlib.redirect_stdout(written):
        assert translate_file(model, tokenizer, "-", None, show_progress=False) == len(lines)
    assert written.getvalue() == "".join(t + "\n" for t in expected)


def test_generate_returning_a_dict_translates_as_it_does_returning_ids(tmp_path, saved):
    folder, model, tokenizer = saved
    plain = translate_lines(model, tokenizer, LINES, max_tokens=30)
    assert len(set(plain)) > 2
    assert translate_lines(model, tokenizer, LINES, max_tokens=30, return_dict_in_generate=True,
                           output_scores=True) == plain  # fmt: skip
    # a model folder whose generation config asks for it
    shutil.copytree(folder, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "generation_config.json").read_text(encoding="utf-8"))
    config["return_dict_in_generate"] = True
    (tmp_path / "model" / "generation_config.json").write_text(json.dumps(config), encoding="utf-8")
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert main(["--model", str(tmp_path / "model"), "--input", str(source), "--output", str(output),
                 "--max_tokens", "30", "--no-progress"]) == 0  # fmt: skip
    assert output.read_text(encoding="utf-8").split("\n") == [one_line(t) for t in plain] + [""]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_a_pipe_as_input_is_read_once_like_stdin_and_resumes(tmp_path, saved, capsys, caplog):
    # `--input <(cat in.txt)`, `--input /dev/stdin`: a pipe was "no such file" (and counting its lines first would
    # have consumed it)
    folder, model, tokenizer = saved
    source, fifo, output = tmp_path / "in.txt", tmp_path / "fifo", tmp_path / "out.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    expected = [one_line(t) for t in translate_lines(model, tokenizer, LINES)]
    os.mkfifo(fifo)
    for resume in ([], ["--resume"]):
        if resume:  # an output holding the first 3 translations: the first 3 lines the pipe delivers are skipped
            output.write_text("".join(t + "\n" for t in expected[:3]), encoding="utf-8")
        writer = subprocess.Popen(["sh", "-c", 'cat "$0" > "$1"', str(source), str(fifo)])
        try:
            assert main(["--model", str(folder), "--input", str(fifo), "--output", str(output), *resume,
                         "--no-progress"]) == 0, capsys.readouterr().err  # fmt: skip
            assert writer.wait(timeout=60) == 0
        finally:
            writer.kill()
        assert output.read_text(encoding="utf-8").split("\n") == expected + [""]
    assert f"translating from line 4 of {fifo}" in caplog.text


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_input_is_named_before_the_model_loads(tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a\n", encoding="utf-8")
    source.chmod(0)
    assert main(["--model", str(tmp_path / "no-model"), "--input", str(source)]) == 1  # a traceback before
    assert capsys.readouterr().err == f"error: --input {source}: no permission to read it.\n"


def _wait_for_lines(path: Path, count: int, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_bytes().count(b"\n") >= count):
        assert process.poll() is None, f"exited with {process.returncode} before writing {count} lines"
        assert time.monotonic() < deadline, f"{count} lines not written in {timeout} s"
        time.sleep(0.05)


def _exit_status(process: subprocess.Popen, errors: Path, timeout: float = 120) -> int:
    """The exit status of a signalled CLI; if it does not end, a failure showing its stderr and where each of its
    threads stood (SIGABRT makes the faulthandler `_popen` turns on print their Python stacks)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        pytest.fail(f"still running {timeout} s after the signal; its stderr:\n{errors.read_text(errors='replace')}")


def _popen(*args, stdin=None, stderr=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1", **SINGLE_THREAD_ENV}
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args), "--no-progress"], stdin=stdin,
                            stdout=subprocess.DEVNULL, stderr=stderr, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def exported(saved, tmp_path_factory):
    """The `saved` model as a float32 CTranslate2 folder (`translate --engine ctranslate2`)."""
    pytest.importorskip("ctranslate2")
    from vaswani_transformer.ctranslate2_export import export_ctranslate2

    folder = tmp_path_factory.mktemp("ct2") / "float32"
    export_ctranslate2(str(saved[0]), str(folder))
    return folder


def _engine(name: str, saved, request):
    """(model folder, translate(lines) -> list of translations) of `vaswani-translate --engine name`, the translations
    from the engine's library function over all lines at once."""
    folder, model, tokenizer = saved
    if name == "transformers":
        return folder, lambda lines: translate_lines(model, tokenizer, lines, window=None, max_tokens=24)
    from vaswani_transformer.ctranslate2_export import decoding_options, load_translator, translate_lines_ctranslate2

    folder = request.getfixturevalue("exported")
    translator, tokenizer, defaults = load_translator(str(folder))
    return folder, lambda lines: translate_lines_ctranslate2(translator, tokenizer, lines, max_tokens=24,
                                                             **decoding_options(defaults))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", "ctranslate2"])
def test_cli_streams_stops_on_sigterm_and_resumes(tmp_path, saved, engine, request):
    # --engine ctranslate2 read all its input before translating any of it, so an interrupted run wrote nothing, and
    # it refused --window and --resume: both engines now stream through the same code.
    folder, translate = _engine(engine, saved, request)
    lines = SOURCES + SOURCES[::-1][:4]  # 10 lines, windows of 2
    expected = [one_line(t) for t in translate(lines)]
    output, errors = tmp_path / "out" / "hyp.txt", tmp_path / "stderr.txt"
    with open(errors, "wb") as stderr:
        process = _popen("--engine", engine, "--model", folder, "--output", output, "--window", 2, "--max_tokens", 24,
                         stdin=subprocess.PIPE, stderr=stderr)  # fmt: skip
        try:
            # stdin stays open: each window's translations must be written before the next window is even sent
            for end in (2, 4):
                process.stdin.write("".join(line + "\n" for line in lines[end - 2 : end]).encode("utf-8"))
                process.stdin.flush()
                _wait_for_lines(output, end, process)
            process.stdin.write((lines[4] + "\n").encode("utf-8"))  # half of the third window
            process.stdin.flush()
            process.send_signal(signal.SIGTERM)
            assert _exit_status(process, errors) == 143
        finally:
            process.kill()
    message = errors.read_text(encoding="utf-8")
    assert message.strip().splitlines()[-1] == f"interrupted: 4 lines written to {output} (resume with --resume)"
    assert "Traceback" not in message
    assert output.read_text(encoding="utf-8").split("\n") == expected[:4] + [""]

    with open(output, "ab") as f:
        f.write("Ein halb".encode("utf-8"))  # what a run killed in the middle of a write could leave
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    resumed = run_cli("--engine", engine, "--model", folder, "--input", source, "--output", output, "--window", 2,
                      "--max_tokens", 24, "--resume")  # fmt: skip
    message = resumed.stderr.decode()
    assert resumed.returncode == 0, message
    assert "dropped the partial last line" in message and "translating from line 5" in message
    assert output.read_text(encoding="utf-8").split("\n") == expected + [""]


class _StdinThatSignalsInAFinalizer:
    """A text stdin that, before handing out line `at`, delivers `signum` while Python runs a finalizer: there the
    handler's exception is only printed ("Exception ignored in"), as when a signal lands in a generator's cleanup."""

    def __init__(self, lines: list[str], at: int, signum: int):
        self.lines, self.at, self.signum, self.swallowed = lines, at, signum, []

    def _deliver(self):
        try:
            signal.raise_signal(self.signum)  # the Python handler runs here, inside the finalizer
        except BaseException as stop:
            self.swallowed.append(stop)
            raise

    def __iter__(self):
        for number, line in enumerate(self.lines):
            if number == self.at:
                dies = type("Dies", (), {})()
                weakref.finalize(dies, self._deliver)
                del dies  # the finalizer runs now
            yield line + "\n"


def test_a_stop_signal_whose_exception_python_swallows_still_stops_the_cli(tmp_path, saved, monkeypatch, capsys):
    # CI once hung: the SIGTERM came while a finalizer ran, Python printed the handler's exception and went on, and
    # the CLI then waited on stdin (still open) forever. The stop must still take effect, at the next line it reads.
    folder, model, tokenizer = saved
    lines = SOURCES[:6]
    stdin = _StdinThatSignalsInAFinalizer(lines, at=3, signum=signal.SIGTERM)
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)  # Python's own: it prints to stderr
    output = tmp_path / "hyp.txt"
    before = signal.getsignal(signal.SIGTERM)
    status = main(["--model", str(folder), "--output", str(output), "--window", "2", "--max_tokens", "24",
                   "--no-progress"])  # fmt: skip
    errors = capsys.readouterr().err
    assert len(stdin.swallowed) == 1 and type(stdin.swallowed[0]).__name__ == "TranslationInterrupted"
    assert status == 143, errors
    # the window holding line 4 was read whole, so it is translated and written before the stop takes effect
    assert errors.strip().splitlines()[-1] == f"interrupted: 4 lines written to {output} (resume with --resume)"
    assert "Exception ignored" not in errors and "Traceback" not in errors, errors
    expected = translate_lines(model, tokenizer, lines, window=2, max_tokens=24)[:4]
    assert output.read_text(encoding="utf-8").split("\n") == [one_line(t) for t in expected] + [""]
    assert signal.getsignal(signal.SIGTERM) is before
    # a stop does not outlive its run: the next one translates everything
    monkeypatch.setattr(sys, "stdin", _StdinThatSignalsInAFinalizer(lines, at=len(lines), signum=signal.SIGTERM))
    assert main(["--model", str(folder), "--output", str(output), "--window", "2", "--no-progress"]) == 0
    assert output.read_text(encoding="utf-8").count("\n") == len(lines)


def _sleeping(thread_id: int) -> bool:
    with open(f"/proc/self/task/{thread_id}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.skipif(not (hasattr(signal, "pthread_sigmask") and os.path.exists("/proc/self/task")),
                    reason="per-thread signal masks and /proc (Linux)")  # fmt: skip
def test_a_stop_signal_that_another_thread_receives_still_ends_a_cli_waiting_on_stdin(tmp_path, saved, monkeypatch,
                                                                                      capsys):  # fmt: skip
    # The kernel hands a process's signal to any thread that does not block it, and Python runs the handler only when
    # the main thread next runs bytecode: one waiting on stdin would wait on. The same happens when the signal comes
    # just before a read begins (probably what hung CI once). Here the main thread blocks SIGTERM, so another
    # thread gets it for certain while the CLI waits for the rest of its third window.
    folder, model, tokenizer = saved
    lines = SOURCES[:5]
    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", open(read_end, encoding="utf-8"))
    os.write(write_end, "".join(line + "\n" for line in lines).encode("utf-8"))  # two windows and a half
    output = tmp_path / "hyp.txt"
    main_thread, unblocked = threading.get_native_id(), threading.Event()

    def send_sigterm_once_the_cli_waits():
        while not (output.exists() and output.read_bytes().count(b"\n") == 4):
            time.sleep(0.01)
        asleep = time.monotonic()
        while time.monotonic() - asleep < 0.3:  # in its read of line 6
            if not _sleeping(main_thread):
                asleep = time.monotonic()
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    def unblock_after_a_while():  # without the fix the CLI would wait for good: end its input instead
        if not stop_waiting.wait(60):
            unblocked.set()
            os.close(write_end)

    nudge_handler, wakeup_fd = signal.getsignal(signal.SIGURG), signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    stop_waiting = threading.Event()
    threads = [threading.Thread(target=send_sigterm_once_the_cli_waits), threading.Thread(target=unblock_after_a_while)]
    for thread in threads:
        thread.start()  # before the mask: they take SIGTERM
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        status = main(["--model", str(folder), "--output", str(output), "--window", "2", "--max_tokens", "24",
                       "--no-progress"])  # fmt: skip
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        stop_waiting.set()
        for thread in threads:
            thread.join()
        if not unblocked.is_set():
            os.close(write_end)
    errors = capsys.readouterr().err
    assert not unblocked.is_set(), "the CLI went on waiting on stdin after SIGTERM"
    assert status == 143, errors
    # what main set up for the time of the run is undone: its helper thread, SIGURG's handler, the wake-up fd
    assert "translate-stop-signals" not in [thread.name for thread in threading.enumerate()]
    assert signal.getsignal(signal.SIGURG) is nudge_handler and signal.set_wakeup_fd(wakeup_fd) == wakeup_fd
    assert errors.strip().splitlines()[-1] == f"interrupted: 4 lines written to {output} (resume with --resume)"
    expected = translate_lines(model, tokenizer, lines, window=2, max_tokens=24)[:4]
    assert output.read_text(encoding="utf-8").split("\n") == [one_line(t) for t in expected] + [""]


@pytest.mark.slow
def test_cli_sigint_while_translating_keeps_every_finished_line(tmp_path, saved):
    folder, model, tokenizer = saved
    lines = (SOURCES * 500)[:3000]
    source, output, errors = tmp_path / "in.txt", tmp_path / "hyp.txt", tmp_path / "stderr.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(errors, "wb") as stderr:
        process = _popen("--model", folder, "--input", source, "--output", output, "--window", 2, stderr=stderr)
        try:
            _wait_for_lines(output, 3, process)
            process.send_signal(signal.SIGINT)
            assert _exit_status(process, errors) == 130
        finally:
            process.kill()
    message = errors.read_text(encoding="utf-8")
    last = message.strip().splitlines()[-1]
    pattern = rf"interrupted: (\d+) of 3000 lines written to {re.escape(str(output))} \(resume with --resume\)"
    match = re.fullmatch(pattern, last)
    assert match and "Traceback" not in message, message
    written = int(match.group(1))
    assert 3 <= written < 3000
    expected = translate_lines(model, tokenizer, lines[: written + 1], window=2)[:written]
    assert output.read_text(encoding="utf-8").split("\n") == [one_line(t) for t in expected] + [""]
