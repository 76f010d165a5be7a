"""Bad command lines get clear answers (issue 16, section 1): no prefix abbreviations and a "did you mean" for unknown
flags in every CLI of ours, a closed stdin/stdout for `translate.py`, and missing or directory data/input paths that
the error names. All through real subprocesses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import RUN_MAINS, save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run_script(name, *args, cwd, shell_redirect: str = "", stdin=None):
    """`python scripts/<name> args` in `cwd`; `shell_redirect` (e.g. "0<&-") is applied by bash to the command."""
    command = [sys.executable, str(ROOT / "scripts" / name), *map(str, args)]
    if shell_redirect:
        quoted = " ".join(f"'{c}'" for c in command)
        command = ["bash", "-c", f"exec {quoted} {shell_redirect}"]
    return subprocess.run(command, cwd=cwd, env=ENV, input=stdin, capture_output=True, timeout=120)


@pytest.mark.parametrize(
    "argv, unknown, suggestion",
    [
        (["--max_step", "5"], "--max_step", "--max_steps"),  # a prefix of --max_steps: argparse used to take it
        (["--max_stepps", "5"], "--max_stepps", "--max_steps"),  # a typo: used to list ~200 flags, no suggestion
    ],
)
def test_train_refuses_abbreviated_or_misspelled_flag_with_a_suggestion(tmp_path, argv, unknown, suggestion):
    result = run_script("train.py", "--output_dir", tmp_path / "run", *argv, cwd=tmp_path)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert f"unknown option {unknown} (did you mean {suggestion}" in stderr
    assert "Traceback" not in stderr and len(stderr.splitlines()) <= 3, stderr
    assert not (tmp_path / "run").exists()


# (module, an abbreviation of one of its options, the option in full): every parser of ours refuses abbreviations
ABBREVIATIONS = [
    ("vaswani_transformer.translate", ["--model_name_or_path", "m"], "--eng", "--engine"),
    ("vaswani_transformer.evaluation", ["--hypotheses", "h"], "--refer", "--reference"),
    ("vaswani_transformer.checkpoints", ["run", "--output_dir", "o"], "--num_la", "--num_last"),
    ("vaswani_transformer.hub", ["--model_name_or_path", "m"], "--repo", "--repo_id"),
    ("vaswani_transformer.tokenization", ["--train_file", "t", "--output_dir", "o"], "--dataset_conf",
     "--dataset_config_name"),
    ("vaswani_transformer.demo", [], "--vocab", "--vocab_size"),
    ("vaswani_transformer.ctranslate2_export", ["--model_name_or_path", "m", "--output_dir", "o"], "--quantiz",
     "--quantization"),
    ("vaswani_transformer.fairseq_import", ["--checkpoint", "c", "--output_dir", "o"], "--source_la", "--source_lang"),
]


def test_every_cli_refuses_abbreviations_and_suggests_the_option(tmp_path):
    # one process runs each module's `main` (what scripts/*.py and the console commands call) on its bad command line
    cases = [[module, module, argv + [abbreviation, "1"]] for module, argv, abbreviation, _ in ABBREVIATIONS]
    result = subprocess.run([sys.executable, "-c", RUN_MAINS, json.dumps(cases)], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line[5:]) for line in result.stdout.splitlines() if line.startswith("CASE [")]
    assert [a[0] for a in answers] == [c[0] for c in ABBREVIATIONS]
    for (module, code, stderr), (_, _, abbreviation, full) in zip(answers, ABBREVIATIONS):
        assert code == 2, (module, code, stderr)
        assert f"unknown option {abbreviation} (did you mean {full}" in stderr, (module, stderr)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    save_tiny_model(folder)
    return folder


@pytest.mark.parametrize(
    "redirect, extra, message",
    [
        ("0<&-", [], "standard input is closed"),
        ("1>&-", ["--input", "in.txt"], "standard output is closed"),
    ],
)
def test_translate_with_a_closed_standard_stream_is_a_clear_error(tmp_path, model_folder, redirect, extra, message):
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    result = run_script("translate.py", "--model_name_or_path", model_folder, "--no_progress", *extra,
                        cwd=tmp_path, shell_redirect=redirect)  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert f"error: {message}" in stderr and "Traceback" not in stderr, stderr


def test_translate_input_that_is_missing_or_a_directory_is_named(tmp_path, model_folder):
    (tmp_path / "folder").mkdir()
    for path, what in (("folder", "is a directory, not a text file"), ("missing.txt", ": no such file")):
        result = run_script("translate.py", "--model_name_or_path", model_folder, "--input", path, cwd=tmp_path)
        stderr = result.stderr.decode()
        assert result.returncode == 1, stderr
        assert f"error: --input {path}{' ' if what[0] != ':' else ''}{what}" in stderr and "Traceback" not in stderr


def test_an_unquoted_yaml_no_for_a_text_argument_is_an_error_naming_the_key(tmp_path):
    """YAML reads an unquoted `no` as False: `save_strategy: no` failed with "False is not a valid SaveStrategy",
    naming no key. The error names the key and says to quote it; quoted, and for real yes/no options, it works."""
    from vaswani_transformer.train import parse_arguments

    (tmp_path / "bad.yaml").write_text("output_dir: run\nsave_strategy: no\n", encoding="utf-8")
    result = run_script("train.py", "bad.yaml", cwd=tmp_path)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "bad.yaml: save_strategy: False is a boolean" in stderr and 'save_strategy: "no"' in stderr, stderr
    assert "Traceback" not in stderr and not (tmp_path / "run").exists()
    good = tmp_path / "good.yaml"
    good.write_text(f"output_dir: {tmp_path / 'run'}\nsave_strategy: \"no\"\ndo_train: yes\ndisable_tqdm: on\n"
                    "use_cpu: true\nreport_to: none\n", encoding="utf-8")
    _, _, training_args = parse_arguments([str(good)])
    assert training_args.save_strategy == "no" and training_args.do_train and training_args.disable_tqdm
    # resume_from_checkpoint takes true/false as transformers' Trainer.train does (true: the latest checkpoint)
    for value, expected in (("true", True), ("false", False)):
        good.write_text(f"output_dir: {tmp_path / 'run'}\nresume_from_checkpoint: {value}\nuse_cpu: true\n",
                        encoding="utf-8")  # fmt: skip
        assert parse_arguments([str(good)])[2].resume_from_checkpoint == expected


def test_training_data_with_a_missing_or_directory_side_names_it(tmp_path):
    from vaswani_transformer.data import load_parallel_dataset

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.de").write_text("a\n", encoding="utf-8")  # train.en missing
    (data / "valid.de").write_text("a\n", encoding="utf-8")
    (data / "valid.en").mkdir()  # a directory where the English file should be
    cases = [
        (data / "train", f"{data / 'train.en'}: no such file (the en side of the parallel text {data / 'train'})"),
        (data / "valid", f"{data / 'valid.en'} is a directory, not the en text file"),
        (data, f"{data} is a directory: give the prefix of its files"),
    ]
    for prefix, message in cases:
        with pytest.raises(FileNotFoundError) as error:
            load_parallel_dataset(train_file=str(prefix), source_lang="en", target_lang="de")
        assert message in str(error.value)
    # the training command line reports it too (before building anything)
    result = run_script("train.py", "--output_dir", tmp_path / "run", "--train_file", data / "train",
                        "--source_lang", "en", "--target_lang", "de", cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert f"{data / 'train.en'}: no such file" in result.stderr.decode()


# In a fresh Python: `python -m <module> --help` for each module of [project.scripts] (runpy runs it as `-m` does);
# prints {module: [exit status, what it wrote]} as JSON.
HELP_UNDER_DASH_M = """
import contextlib, io, json, runpy, sys
results = {}
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    out, status = io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            status = exit.code
    results[module] = [status, out.getvalue()]
print(json.dumps(results))
"""


def test_python_dash_m_runs_each_command_as_its_console_script():
    """`python -m vaswani_transformer.train ...` is the console script (before: it ran nothing and exited 0, so a job
    written that way "succeeded" without training); the module of two commands (attention) says which to use."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    modules = sorted({target.split(":")[0] for target in scripts.values()})
    done = subprocess.run([sys.executable, "-c", HELP_UNDER_DASH_M, *modules], env=ENV, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for module, (status, output) in results.items():
        if module == "vaswani_transformer.attention":
            assert status == ("python -m vaswani_transformer.attention runs nothing: use vaswani-plot-attention or "
                              "vaswani-align (scripts/plot_attention.py, scripts/align.py).")  # fmt: skip
        else:
            assert status == 0 and "usage:" in output, (module, status, output[-500:])
