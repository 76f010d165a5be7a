"""The bad-input table of the README (issue 16, section 4): the rows not tested elsewhere. Each bad input gets one
error line naming the problem (no traceback) or a documented behaviour; translation keeps one output line per input
line whatever the line holds. The command lines run in one fresh Python (each `main`, as scripts/*.py and the
console commands call it)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file

from vaswani_transformer.data import load_parallel_dataset

from helpers import RUN_MAINS, SINGLE_THREAD_ENV, case_answers, generate_texts, save_tiny_model, tiny_tokenizer, tiny_translation_model

ENV = {**os.environ, **SINGLE_THREAD_ENV, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
TINY = "d_model=16,d_ff=32,num_heads=2,encoder_layers=1,decoder_layers=1"

# Lines a user may feed `vaswani-translate`; each must give exactly one output line, in order.
TRANSLATION_INPUTS = {
    "empty": "",
    "whitespace": " \t  ",
    "control characters": "a\x00b\x07c\x1bd\x7f",
    "U+2028 line separator": "left\u2028right",
    "U+2029 paragraph separator": "one\u2029two",
    "NEL, VT, FF, FS": "x\x85y\x0bz\x0cw\x1cv",
    "only U+2028": "\u2028",
    "very long": "word " * 1500,
    "Chinese": "我们今天去公园散步。",
    "Cyrillic": "Привет, как дела?",
    "Devanagari": "नमस्ते दुनिया",
    "Arabic, right-to-left": "مرحبا بالعالم",
    "Hebrew with a right-to-left mark": "\u200fשלום עולם",
    "bidi override": "abc \u202eevil\u202c def",
    "emoji and zero-width": "🙂👍🏽 a\u200bb",
    "a lone CR inside": "before\rafter",
    "CRLF line end": "windows line",  # written with \r\n
}


def expected_translation(model, tokenizer, text: str) -> str:
    """The documented answer, written from the rule: "" for a line without non-space text, else the model's
    translation of the line alone (generate + decode) with its line breaks turned into spaces."""
    if not text.strip():
        return ""
    translation = generate_texts(model, tokenizer, [text])[0]
    return translation.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")




def write_pairs(prefix, pairs, source="en", target="de"):
    for lang, side in ((source, 0), (target, 1)):
        prefix.with_name(f"{prefix.name}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Every command-line case of this module, run in one fresh Python; returns the folders and {label: (exit status,
    stderr)}."""
    tmp = tmp_path_factory.mktemp("bad_input")
    good = tmp / "good"
    model, tokenizer = save_tiny_model(good)
    truncated = tmp / "truncated"
    shutil.copytree(good, truncated)
    weights = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    other_shape = tmp / "other_shape"
    shutil.copytree(good, other_shape)
    config = json.loads((other_shape / "config.json").read_text())
    (other_shape / "config.json").write_text(json.dumps({**config, "d_ff": 2 * config["d_ff"]}))
    other_names = tmp / "other_names"  # another model's weights: the same tensors under other names
    shutil.copytree(good, other_names)
    tensors = load_file(other_names / "model.safetensors")
    save_file({f"other.{k}": v for k, v in tensors.items()}, other_names / "model.safetensors", metadata={"format": "pt"})
    small_vocab = tmp / "small_vocab"
    shutil.copytree(good, small_vocab)
    tiny_translation_model(tiny_tokenizer(), vocab_size=40).save_pretrained(small_vocab)
    afile = tmp / "afile"
    afile.write_text("a file where a folder should be\n")
    (tmp / "src.txt").write_text("A man is riding.\n", encoding="utf-8")
    (tmp / "ref.txt").write_text("Ein Mann fährt.\n", encoding="utf-8")
    lines = list(TRANSLATION_INPUTS.values())
    raw = "".join(line + ("\r\n" if label == "CRLF line end" else "\n") for label, line in TRANSLATION_INPUTS.items())
    (tmp / "hostile.txt").write_bytes(raw.encode("utf-8"))

    data = tmp / "data"
    data.mkdir()
    pairs = [(f"{a} {b}", f"{b} {a}") for a in ("one", "two", "three", "four", "five") for b in ("red", "blue")]
    write_pairs(data / "train", pairs)
    (data / "unequal.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (data / "unequal.de").write_text("eins\nzwei\n", encoding="utf-8")
    (data / "utf8.en").write_bytes(b"one\ntwo\n")
    (data / "utf8.de").write_bytes(b"eins\nzw\xc3\x28i\n")
    rows = [{"translation": {"en": "one", "de": "eins"}}, {"translation": {"en": "two", "fr": "deux"}}]
    (data / "keys.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    long_pairs = [("word " * 80, "Wort"), ("short", "Wort " * 80)]  # over a 64-token batch, each on one side
    write_pairs(data / "budget", pairs + long_pairs)

    def train(output, train_file, *extra):
        vocab = [] if "--tokenizer_name" in extra else ["--tokenizer_vocab_size", "280"]  # (no effect with a tokenizer)
        return ["--train_file", str(train_file), "--source_lang", "en", "--target_lang", "de", "--output_dir",
                str(output), "--do_train", "--max_steps", "1", "--config_overrides", TINY, *vocab,
                "--max_tokens_per_batch", "64", "--warmup_steps", "1", "--use_cpu", "--report_to", "none",
                "--disable_tqdm", "true", "--average_last_checkpoints", "0", *extra]  # fmt: skip

    T, E, A, P, R = (f"vaswani_transformer.{m}" for m in ("translate", "evaluation", "checkpoints", "hub", "train"))
    cases = [
        ("translate round trip", T, ["--model_name_or_path", good, "--input", tmp / "hostile.txt", "--output",
                                     tmp / "out" / "hostile.hyp", "--no_progress"]),
        ("translate truncated", T, ["--model_name_or_path", truncated, "--input", tmp / "src.txt"]),
        ("translate other shape", T, ["--model_name_or_path", other_shape, "--input", tmp / "src.txt"]),
        ("translate other names", T, ["--model_name_or_path", other_names, "--input", tmp / "src.txt"]),
        ("evaluate other names", E, ["--model_name_or_path", other_names, "--source", tmp / "src.txt", "--reference",
                                     tmp / "ref.txt"]),
        ("translate small vocab", T, ["--model_name_or_path", small_vocab, "--input", tmp / "src.txt"]),
        ("translate unwritable", T, ["--model_name_or_path", good, "--input", tmp / "src.txt", "--output",
                                     afile / "hyp.txt"]),
        ("evaluate truncated", E, ["--model_name_or_path", truncated, "--source", tmp / "src.txt", "--reference",
                                   tmp / "ref.txt"]),
        ("evaluate unwritable", E, ["--hypotheses", tmp / "src.txt", "--reference", tmp / "ref.txt",
                                    "--output_json", afile / "eval.json"]),
        ("average unwritable", A, [tmp / "no_run", "--output_dir", afile]),
        ("push truncated", P, ["--model_name_or_path", truncated, "--output_dir", tmp / "repo"]),
        ("push unwritable", P, ["--model_name_or_path", good, "--output_dir", afile / "repo"]),
        ("train unequal", R, train(tmp / "r1", data / "unequal")),
        ("train utf8", R, train(tmp / "r2", data / "utf8")),
        ("train keys", R, train(tmp / "r3", data / "keys.jsonl")),
        ("train preset", R, train(tmp / "r4", data / "train", "--preset", "huge")),
        ("train sizes", R, train(tmp / "r5", data / "train", "--config_overrides", "d_model=30")),
        ("train vocab", R, train(tmp / "r6", data / "train", "--tokenizer_name", good, "--config_overrides",
                                 TINY + ",vocab_size=100")),
        ("train unwritable", R, train(afile, data / "train")),
        ("train budget", R, train(tmp / "r8", data / "budget")),
        ("train all filtered", R, train(tmp / "r9", data / "train", "--max_source_length", "2")),
        ("train length 0", R, train(tmp / "r10", data / "train", "--max_source_length", "0")),
        ("train length -1", R, train(tmp / "r11", data / "train", "--max_target_length", "-1")),
    ]  # fmt: skip
    cases = [[label, module, [str(a) for a in argv]] for label, module, argv in cases]
    result = subprocess.run([sys.executable, "-c", RUN_MAINS, json.dumps(cases)], cwd=tmp, env=ENV,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    answers = case_answers(result.stdout)
    assert list(answers) == [c[0] for c in cases], result.stderr[-4000:]
    folders = dict(tmp=tmp, good=good, truncated=truncated, other_shape=other_shape, other_names=other_names,
                   small_vocab=small_vocab,
                   afile=afile, data=data)  # fmt: skip
    return folders, answers, model, tokenizer, lines


def assert_one_error_line(answer, status: int, message: str):
    code, stderr = answer
    assert code == status, (code, stderr[-3000:])
    assert message in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if "error:" in line] == [
        next(line for line in stderr.splitlines() if message in line)
    ], stderr[-3000:]


@pytest.mark.slow
def test_translation_inputs_round_trip_one_line_per_input_line(run):
    folders, answers, model, tokenizer, lines = run
    assert answers["translate round trip"][0] == 0, answers["translate round trip"][1][-3000:]
    written = (folders["tmp"] / "out" / "hostile.hyp").read_bytes()
    assert written.count(b"\n") == len(lines) and written.endswith(b"\n")  # U+2028, NEL, VT, FF, CR split nothing
    got = written.decode("utf-8").split("\n")[:-1]
    assert dict(zip(TRANSLATION_INPUTS, got)) == {
        label: expected_translation(model, tokenizer, text) for label, text in TRANSLATION_INPUTS.items()
    }


@pytest.mark.slow
def test_model_folder_problems_are_named_in_one_line(run):
    folders, answers, _, _, _ = run
    truncated = f"error: {folders['truncated']}: unreadable weights (a truncated or corrupt safetensors file: "
    for label in ("translate truncated", "evaluate truncated", "push truncated"):
        assert_one_error_line(answers[label], 1, truncated)
    assert_one_error_line(answers["translate other shape"], 1,
                          f"error: {folders['other_shape']}: the weights do not fit its config.json")  # fmt: skip
    # transformers would start every missing tensor from random values and only print a load report
    for label in ("translate other names", "evaluate other names"):
        assert_one_error_line(answers[label], 1, f"error: {folders['other_names']}: its weights lack ")
        assert "of the model's tensors (lm_head.weight, " in answers[label][1]
    assert_one_error_line(answers["translate small vocab"], 1, f"error: {folders['small_vocab']}: the tokenizer has "
                          "320 tokens but the model's vocabulary has 40")  # fmt: skip
    assert not (folders["tmp"] / "repo").exists()


@pytest.mark.slow
def test_unwritable_outputs_are_named_before_any_work(run):
    folders, answers, _, _, _ = run
    afile = folders["afile"]
    for label, option, path in [
        ("translate unwritable", "--output", afile / "hyp.txt"),
        ("evaluate unwritable", "--output_json", afile / "eval.json"),
        ("push unwritable", "--output_dir", afile / "repo"),
    ]:
        assert_one_error_line(answers[label], 1, f"error: {option} {path}: {afile} is a file, not a folder.")
    assert_one_error_line(answers["average unwritable"], 1, f"error: --output_dir {afile} is a file, not a folder.")
    assert_one_error_line(answers["train unwritable"], 2, f"error: --output_dir {afile} is a file, not a folder.")
    assert afile.read_text() == "a file where a folder should be\n"


@pytest.mark.slow
def test_training_input_errors_are_one_line_not_a_traceback(run):
    folders, answers, _, _, _ = run
    data = folders["data"]
    cases = {
        "train unequal": f"error: Parallel files have different line counts: {data / 'unequal.en'} has 3 lines, "
        f"{data / 'unequal.de'} has 2 lines.",
        "train utf8": f"error: {data / 'utf8.de'}:2: invalid UTF-8",
        "train keys": f"error: {data / 'keys.jsonl'}:2: \"translation\" has no 'de' key (keys: ['en', 'fr'])",
        "train sizes": "error: `d_model` (30) must be divisible by `num_heads` (8)",
        "train vocab": "error: Tokenizer and model config disagree: tokenizer has 320 tokens",
    }
    for label, message in cases.items():
        assert_one_error_line(answers[label], 1, message)
    # filters that leave no training pair (the run made 0 updates and saved an untrained model, exit 0)
    assert_one_error_line(answers["train all filtered"], 1, "error: The filters dropped all 10 training pairs, so "
                          "training would make no update: source_too_long 10 (more than 2 source tokens, </s> included, "
                          "set by --max_source_length 2). Raise the limits named, or check the training data.")
    # the preset is read with the command line: a command-line error (status 2), as argparse's
    assert_one_error_line(answers["train preset"], 2, "error: Unknown preset 'huge'. Valid presets: base, big, A-h1")
    # a length limit below 1 (0 was silently the default, a negative one dropped every pair)
    for label, message in (("train length 0", "max_source_length must be at least 1 (the </s> token), got 0;"),
                           ("train length -1", "max_target_length must be at least 1 (the </s> token), got -1;")):
        assert_one_error_line(answers[label], 2, f"error: {message}")
    for run_folder in ("r1", "r2", "r3", "r4", "r5", "r6", "r9", "r10", "r11"):
        assert not list((folders["tmp"] / run_folder).glob("checkpoint-*")), run_folder  # stopped before training
    assert not (folders["tmp"] / "r9" / "model.safetensors").exists()
    assert not (folders["tmp"] / "r9" / "training_summary.json").exists()


@pytest.mark.slow
def test_pairs_over_the_token_budget_are_dropped_and_counted(run):
    # A pair with a side longer than --max_tokens_per_batch cannot fit a batch: the training split drops it and the
    # summary counts it under its rule (nothing silently lost).
    folders, answers, _, _, _ = run
    assert answers["train budget"][0] in (0, None), answers["train budget"][1][-3000:]
    summary = json.loads((folders["tmp"] / "r8" / "training_summary.json").read_text())
    counts = summary["filtered"]["splits"]["train"]
    assert (counts["total"], counts["kept"]) == (12, 10)
    assert (counts["source_too_long"], counts["target_too_long"]) == (1, 1)
    assert summary["filtered"]["rules"]["max_source_tokens"] == summary["filtered"]["rules"]["max_target_tokens"] == 64


@pytest.mark.parametrize("fmt", ["text", "tsv", "jsonl"])
def test_crlf_data_files_lose_the_carriage_return(tmp_path, fmt):
    pairs = [("one two", "eins zwei"), ("", ""), ("three", "drei")]
    if fmt == "text":
        for lang, side in (("en", 0), ("de", 1)):
            (tmp_path / f"train.{lang}").write_bytes("".join(p[side] + "\r\n" for p in pairs).encode())
        path = tmp_path / "train"
    elif fmt == "tsv":
        path = tmp_path / "train.tsv"
        path.write_bytes("".join(f"{s}\t{t}\r\n" if s else "\r\n" for s, t in pairs).encode())
    else:
        path = tmp_path / "train.jsonl"
        rows = [json.dumps({"translation": {"en": s, "de": t}}) if s else "" for s, t in pairs]
        path.write_bytes("".join(r + "\r\n" for r in rows).encode())
    data = load_parallel_dataset(train_file=str(path), source_lang="en", target_lang="de")
    assert [(r["translation"]["en"], r["translation"]["de"]) for r in data["train"]] == pairs
