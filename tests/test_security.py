"""Security (issue 16, section 5), through the real entry points: a pickle that runs code when unpickled never runs,
the exported remote-code folder holds only our code, tokens are never printed or written, importing the package opens
no network connection, and `trust_remote_code` is only ever turned on for a folder our code wrote."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

import vaswani_transformer
from vaswani_transformer import VaswaniTransformerForConditionalGeneration
from vaswani_transformer.hub import CODE_FILES, PIPELINE_FILE, export_repository
from vaswani_transformer.hub import main as hub_main
from vaswani_transformer.train import run_from_args
from vaswani_transformer.translate import load_model_and_tokenizer

from helpers import RUN_MAINS, SINGLE_THREAD_ENV, save_tiny_model, tiny_tokenizer, tiny_translation_model

PACKAGE = Path(vaswani_transformer.__file__).resolve().parent
ENV = {**os.environ, **SINGLE_THREAD_ENV, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
FAKE_TOKEN = "hf_fakeTOKENfor0vaswani0security0tests0"


class Payload:
    """Unpickling this writes `marker`: what a hostile `pytorch_model.bin` would do (any code could run instead)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('the pickle ran code')",)


def write_hostile_pickle(path: Path, state_dict: dict, marker: Path) -> None:
    """A torch.save archive holding every tensor of `state_dict` and one object that runs code when unpickled."""
    torch.save({**state_dict, "payload": Payload(marker)}, path)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A model folder (valid config.json and tokenizer) whose only weights are a hostile pickle `pytorch_model.bin`,
    a training run whose one checkpoint holds it, and the marker file its payload would write."""
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "PAYLOAD_RAN"
    folder = root / "model"
    model, _ = save_tiny_model(folder)
    (folder / "model.safetensors").unlink()
    write_hostile_pickle(folder / "pytorch_model.bin", model.state_dict(), marker)
    checkpoint = root / "run" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "pytorch_model.bin", "tokenizer.json"):
        (checkpoint / name).write_bytes((folder / name).read_bytes())
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1}), encoding="utf-8")
    return root, folder, marker, model


def test_the_payload_is_real_when_unpickled_unsafely(tmp_path):
    # The control: a file built like the hostile one does run code under a plain (unsafe) torch.load.
    marker = tmp_path / "control"
    write_hostile_pickle(tmp_path / "control.bin", {"w": torch.zeros(1)}, marker)
    torch.load(tmp_path / "control.bin", weights_only=False)
    assert marker.read_text() == "the pickle ran code"


@pytest.mark.parametrize("model_class", [AutoModelForSeq2SeqLM, VaswaniTransformerForConditionalGeneration])
def test_from_pretrained_refuses_the_pickle_without_running_it(hostile, model_class):
    _, folder, marker, _ = hostile
    with pytest.raises(Exception, match="Unsupported global: GLOBAL exec") as refused:
        model_class.from_pretrained(folder)
    assert "Weights only load failed" in str(refused.value)  # torch's weights-only unpickler refused it
    assert not marker.exists()


def test_a_pickle_of_plain_tensors_loads_with_the_weights_only_loader(tmp_path, hostile):
    _, folder, _, model = hostile
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (plain / name).write_bytes((folder / name).read_bytes())
    torch.save(model.state_dict(), plain / "pytorch_model.bin")
    loaded, _ = load_model_and_tokenizer(plain)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


# Each command line's `main` (what scripts/*.py and the console commands call) in one fresh process, on the hostile
# folder: (command, module, argv, what its one error line must say, the output it must not write).
ENTRY_POINTS = [
    ("vaswani-translate", "vaswani_transformer.translate",
     ["--model_name_or_path", "{model}", "--input", "{src}", "--output", "{out}/hyp.txt"],
     "error: {model}: refused to load its pickled weights (Unsupported global: GLOBAL exec", "hyp.txt"),
    ("vaswani-evaluate", "vaswani_transformer.evaluation",
     ["--model_name_or_path", "{model}", "--source", "{src}", "--reference", "{src}",
      "--hypotheses_file", "{out}/eval.hyp", "--output_json", "{out}/eval.json"],
     "error: {model}: refused to load its pickled weights (Unsupported global: GLOBAL exec", "eval.json"),
    ("vaswani-average", "vaswani_transformer.checkpoints",
     ["{run}", "--num_last", "1", "--output_dir", "{out}/averaged"],
     "Skipped: {run}/checkpoint-1: missing model.safetensors", "averaged"),
    ("vaswani-push", "vaswani_transformer.hub", ["--model_name_or_path", "{model}", "--output_dir", "{out}/repo"],
     "error: {model}: refused to load its pickled weights (Unsupported global: GLOBAL exec", "repo"),
    ("vaswani-convert-fairseq", "vaswani_transformer.fairseq_import",
     ["--checkpoint", "{model}/pytorch_model.bin", "--output_dir", "{out}/converted"],
     "pass --unsafe_pickle (unsafe_pickle=True) for a checkpoint you trust", "converted"),
]  # fmt: skip

# Run first in that process: an audit hook that records (and refuses) every attempt to resolve a name or connect.
_REFUSE_NETWORK = """
import socket, sys

attempts = []

def refuse_network(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
                 "urllib.Request", "http.client.connect"):
        attempts.append(f"{event} {args!r}"[:200])
        raise ConnectionRefusedError(f"no network in this test: {event}")

sys.addaudithook(refuse_network)
"""

# Then: import the package and build the base preset, run the entry points (helpers.RUN_MAINS), and check the hook.
_BUILD = """
import json

import vaswani_transformer
from transformers import AutoModelForSeq2SeqLM
from vaswani_transformer import VaswaniTransformerConfig

model = AutoModelForSeq2SeqLM.from_config(VaswaniTransformerConfig.from_preset("base", vocab_size=1000))
print("BUILT", type(model).__name__, json.dumps(attempts))
"""
_CONTROL = """
print("ATTEMPTS", json.dumps(attempts))
try:  # the control: the hook does see a connection
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError:
    pass
print("CONTROL", json.dumps(attempts))
"""


@pytest.fixture(scope="module")
def entry_point_run(tmp_path_factory, hostile):
    """One fresh Python, online (no HF_HUB_OFFLINE) but with every connection refused and recorded: imports the
    package, builds the base preset, then runs each entry point of ENTRY_POINTS on the hostile folder."""
    root, folder, marker, _ = hostile
    tmp = tmp_path_factory.mktemp("entry_points")
    (tmp / "src.txt").write_text("a man\n", encoding="utf-8")
    names = {"model": folder, "run": root / "run", "src": tmp / "src.txt", "out": tmp / "out"}
    cases = [[c, m, [a.format(**names) for a in argv]] for c, m, argv, _, _ in ENTRY_POINTS]
    env = {k: v for k, v in ENV.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp / "hf_home")
    code = _REFUSE_NETWORK + _BUILD + RUN_MAINS + _CONTROL
    result = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], cwd=tmp, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout, names, marker


@pytest.mark.slow
def test_no_entry_point_runs_the_pickle(entry_point_run):
    stdout, names, marker = entry_point_run
    answers = [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("CASE [")]
    assert [a[0] for a in answers] == [c[0] for c in ENTRY_POINTS]
    for (command, code, stderr), (_, _, _, message, output) in zip(answers, ENTRY_POINTS):
        assert code == 1, (command, code, stderr)  # refused, with one error line (no traceback)
        assert message.format(**names) in stderr and "Traceback" not in stderr, (command, stderr)
        assert not (names["out"] / output).exists(), command
    assert not marker.exists()  # the payload never ran: nothing unpickled it beyond tensors


@pytest.mark.slow
def test_importing_the_package_and_building_a_model_opens_no_connection(entry_point_run):
    stdout, _, _ = entry_point_run
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in stdout.splitlines()
             if line.startswith(("BUILT ", "ATTEMPTS ", "CONTROL "))}  # fmt: skip
    assert lines["BUILT"] == "VaswaniTransformerForConditionalGeneration []"  # import + a model from a preset
    assert json.loads(lines["ATTEMPTS"]) == []  # nor did any entry point on a local folder
    assert len(json.loads(lines["CONTROL"])) >= 1  # the hook does see connections


def test_our_code_loads_pickles_only_with_the_weights_only_loader():
    # Every torch.load in the package passes weights_only=True, except the fairseq converter's, which passes
    # weights_only=False only under --unsafe_pickle; no pickle.load, no yaml.load, no eval/exec of data.
    unsafe = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            if name == "torch.load":
                weights_only = {k.arg: ast.unparse(k.value) for k in node.keywords}.get("weights_only")
                if weights_only != "True":
                    guard = parents[parents[node]] if node in parents and parents[node] in parents else None
                    guarded = isinstance(guard, ast.If) and ast.unparse(guard.test) == "unsafe_pickle"
                    assert where.startswith("fairseq_import.py") and guarded, f"{where}: {ast.unparse(node)}"
                    unsafe.append(where)
            elif name in ("pickle.load", "pickle.loads", "yaml.load", "yaml.unsafe_load", "eval", "exec",
                          "torch.serialization.add_safe_globals"):  # fmt: skip
                pytest.fail(f"{where}: {ast.unparse(node)}")
    assert len(unsafe) == 1  # fairseq_import.load_checkpoint, behind --unsafe_pickle


# ------------------------------------------------------------------------------ the exported remote-code folder

SAVED_FILES = {"config.json", "generation_config.json", "model.safetensors", *CODE_FILES}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}
EXPORTED_FILES = SAVED_FILES | TOKENIZER_FILES | {PIPELINE_FILE, "README.md"}
# What the copied code may import besides the standard library and its sibling files: torch, transformers and
# huggingface_hub (transformers' own dependency, whose `strict` dataclasses transformers' configurations use).
ALLOWED_IMPORTS = {"torch", "transformers", "huggingface_hub"}


def imported_modules(source: str) -> set[str]:
    """Every module a Python file imports, anywhere in it; relative imports as ".name"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def exported_files(folder: Path) -> set[str]:
    """The names of the files in `folder`, the model card's pictures (PNG images, no code) left out."""
    pictures = {p.name for p in folder.glob("*.png") if p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"}
    return {p.name for p in folder.iterdir()} - pictures


def test_saved_and_exported_folders_hold_exactly_our_files(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_translation_model(tokenizer)
    model.save_pretrained(tmp_path / "saved")
    assert {p.name for p in (tmp_path / "saved").iterdir()} == SAVED_FILES
    export_repository(model, tmp_path / "repo", tokenizer=tokenizer, source_lang="en", target_lang="de")
    files = exported_files(tmp_path / "repo")
    assert files == EXPORTED_FILES  # weights only as safetensors: no .bin, .pt or other pickle
    for name in sorted(f for f in files if f.endswith(".py")):
        code = (tmp_path / "repo" / name).read_text(encoding="utf-8")
        assert code == (PACKAGE / name).read_text(encoding="utf-8"), name  # the package's own file, unchanged
        for module in imported_modules(code):
            top = module.split(".")[0]
            if module.startswith("."):
                assert f"{module[1:]}.py" in files, (name, module)  # a sibling in the folder
            else:
                assert top in ALLOWED_IMPORTS or top in sys.stdlib_module_names or top == "__future__", (name, module)


def tampered_model_folder(folder: Path, marker: Path) -> None:
    """A saved model folder whose code files (and an added pipeline.py) write `marker` when imported: what a folder
    from someone else could hold next to `auto_map`."""
    save_tiny_model(folder)
    for name in (*CODE_FILES, PIPELINE_FILE):
        (folder / name).write_text(f"open({str(marker)!r}, 'a').write({name!r} + ' ran\\n')\n", encoding="utf-8")


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.slow
def test_push_dry_run_runs_only_our_code_and_never_writes_the_token(tmp_path, monkeypatch, capfd, caplog):
    # `vaswani-push` (its `main`, in this process; the validation is its own fresh Python) exports a folder and
    # validates it with trust_remote_code=True: the code that runs must be the package's (copied by save_pretrained),
    # never the code files of the folder the user gave, and the token in the environment appears in no output, no
    # log and no file.
    marker = tmp_path / "FOREIGN_CODE_RAN"
    tampered_model_folder(tmp_path / "model", marker)
    out = tmp_path / "repo"
    for name, value in {"HF_TOKEN": FAKE_TOKEN, "HUGGING_FACE_HUB_TOKEN": FAKE_TOKEN, "TMPDIR": str(tmp_path),
                        "HF_HOME": str(tmp_path / "hf_home"), **SINGLE_THREAD_ENV}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    code = hub_main(["--model_name_or_path", str(tmp_path / "model"), "--output_dir", str(out), "--source_lang", "en",
                     "--target_lang", "de", "--repo_id", "someone/tiny"])  # fmt: skip
    stdout, stderr = capfd.readouterr()
    assert code == 0, stderr
    assert f"Wrote {out}; it translates in a clean Python" in stdout
    assert not marker.exists()
    assert exported_files(out) == EXPORTED_FILES
    for name in (*CODE_FILES, PIPELINE_FILE):
        assert (out / name).read_bytes() == (PACKAGE / name).read_bytes(), name
    assert FAKE_TOKEN not in stdout + stderr + caplog.text
    assert [p for p in all_files(tmp_path) if FAKE_TOKEN.encode() in p.read_bytes()] == []


def test_an_auto_map_naming_other_code_is_dropped_before_the_validation_runs_it(tmp_path, caplog):
    # A downloaded folder's tokenizer_config.json and config.json may name code elsewhere (another folder, or a cached
    # Hub repository: `repo--module.Class`); the export kept those entries, the validation (trust_remote_code=True)
    # imported that code, and the pushed repository would have handed the reference on to its users.
    from vaswani_transformer.hub import validate_repository

    marker = tmp_path / "FOREIGN_CODE_RAN"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "tokenization_evil.py").write_text(
        f"open({str(marker)!r}, 'a').write('tokenizer code ran\\n')\n"
        "from transformers import TokenizersBackend\nclass EvilTok(TokenizersBackend):\n    pass\n", encoding="utf-8")
    (evil / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'a').write('model code ran\\n')\n",
                                           encoding="utf-8")  # fmt: skip
    folder = tmp_path / "model"
    save_tiny_model(folder)
    for name, key, value in (("tokenizer_config.json", "AutoTokenizer", [None, f"{evil}--tokenization_evil.EvilTok"]),
                             ("config.json", "AutoModelForCausalLM", f"{evil}--modeling_evil.Evil")):  # fmt: skip
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        data["auto_map"] = {**data.get("auto_map", {}), key: value}
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    with caplog.at_level("WARNING", logger="vaswani_transformer.hub"):
        export_repository(str(folder), tmp_path / "repo", source_lang="en", target_lang="de")
    assert "dropped auto_map entries naming code other than this package's" in caplog.text
    assert "auto_map" not in json.loads((tmp_path / "repo" / "tokenizer_config.json").read_text(encoding="utf-8"))
    auto_map = json.loads((tmp_path / "repo" / "config.json").read_text(encoding="utf-8"))["auto_map"]
    assert sorted(auto_map) == ["AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"]
    assert all(value.split(".")[0] in ("configuration_vaswani_transformer", "modeling_vaswani_transformer")
               for value in auto_map.values())  # fmt: skip
    validate_repository(tmp_path / "repo")
    assert not marker.exists()


def test_the_card_never_copies_a_file_an_evaluation_report_names(tmp_path):
    # An evaluation report from elsewhere may name any file as its `source_file` (/proc/self/environ, a key): the card
    # showed that file's first line as its attention picture's sentence, and the push published it.
    secret = tmp_path / "secret.txt"
    secret.write_text(f"HF_TOKEN={FAKE_TOKEN}\n", encoding="utf-8")
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"sacrebleu": 27.3, "source_file": str(secret)}), encoding="utf-8")
    folder = tmp_path / "model"
    save_tiny_model(folder)
    export_repository(str(folder), tmp_path / "repo", source_lang="en", target_lang="de", eval_results=[str(report)])
    assert [p for p in all_files(tmp_path / "repo") if FAKE_TOKEN.encode() in p.read_bytes()] == []


def test_loading_a_folder_never_runs_its_code_unless_asked(tmp_path):
    # Our loaders use the installed classes for a folder whose config names remote code (auto_map): its code files
    # run only with trust_remote_code=True, which only the user turns on (--trust_remote_code).
    marker = tmp_path / "FOREIGN_CODE_RAN"
    tampered_model_folder(tmp_path / "model", marker)
    model, _ = load_model_and_tokenizer(tmp_path / "model")
    assert type(model) is VaswaniTransformerForConditionalGeneration
    AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    assert not marker.exists()


def test_trust_remote_code_is_turned_on_only_by_the_repository_validation():
    # No call in the package passes trust_remote_code=True; a --trust_remote_code flag is off unless given; the one
    # piece of code that turns it on is hub.py's validation, run on the folder export_repository has just written.
    turned_on, flags = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "trust_remote_code":
                        assert not (isinstance(keyword.value, ast.Constant) and keyword.value.value), ast.unparse(node)
                if ast.unparse(node.func).endswith("add_argument") and any(
                    isinstance(a, ast.Constant) and a.value == "--trust_remote_code" for a in node.args
                ):
                    options = {k.arg: ast.unparse(k.value) for k in node.keywords}
                    assert options.get("action") == "'store_true'" and "default" not in options, ast.unparse(node)
                    flags.append(path.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "trust_remote_code" in node.value:
                try:
                    code = ast.parse(textwrap.dedent(node.value))
                except SyntaxError:
                    continue  # prose (a docstring or a message)
                calls = [c for c in ast.walk(code) if isinstance(c, ast.Call)]
                if any(k.arg == "trust_remote_code" for c in calls for k in c.keywords):
                    turned_on.append(path.name)
    assert turned_on == ["hub.py"]  # _VALIDATION_CODE, run by validate_repository
    assert "translate.py" in flags


# ------------------------------------------------------------------------------------------ tokens and network


def test_resuming_a_checkpoint_whose_optimizer_state_runs_code_is_one_error_line(tmp_path, capsys):
    # A checkpoint from someone else whose optimizer.pt runs code when unpickled: transformers' weights-only loader
    # refuses it (the payload never runs); vaswani-train said so with torch's traceback, now in one line.
    from vaswani_transformer.train import main as train_main

    data = tmp_path / "data"
    data.mkdir()
    pairs = [(f"{a} {b}", f"{b} {a}") for a in ("one", "two", "three", "four") for b in ("red", "green", "blue")]
    for side, texts in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs])):
        (data / f"train.{side}").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    common = ["--train_file", str(data / "train"), "--source_lang", "src", "--target_lang", "tgt", "--output_dir",
              str(tmp_path / "run"), "--do_train", "--config_overrides",
              "d_model=16,d_ff=32,num_heads=2,encoder_layers=1,decoder_layers=1", "--tokenizer_vocab_size", "280",
              "--max_tokens_per_batch", "64", "--warmup_steps", "1", "--use_cpu", "--report_to", "none",
              "--save_steps", "2"]  # fmt: skip
    run_from_args([*common, "--max_steps", "2"])
    marker = tmp_path / "PAYLOAD_RAN"
    optimizer = tmp_path / "run" / "checkpoint-2" / "optimizer.pt"
    write_hostile_pickle(optimizer, torch.load(optimizer, weights_only=True), marker)
    with pytest.raises(SystemExit) as exit_info:
        train_main([*common, "--max_steps", "3", "--resume_from_checkpoint", "latest"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err, err
    assert "error: a file of the checkpoint resumed (optimizer, scheduler or RNG state) holds a pickle" in err
    assert "GLOBAL exec" in err and not marker.exists(), err[-700:]


def test_training_never_prints_or_writes_the_token(tmp_path, monkeypatch, capfd, caplog):
    # A training run (the job behind vaswani-train, in this process) with a token in the environment: checkpoints,
    # training_args.bin, TensorBoard logs, the model card, the averaged model, the summary - none holds it.
    data = tmp_path / "data"
    data.mkdir()
    pairs = [(f"{a} {b}", f"{b} {a}") for a in ("one", "two", "three", "four") for b in ("red", "green", "blue")]
    for name in ("train", "valid"):
        (data / f"{name}.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (data / f"{name}.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    for name, value in {"HF_TOKEN": FAKE_TOKEN, "HUGGING_FACE_HUB_TOKEN": FAKE_TOKEN, "TMPDIR": str(tmp_path),
                        "HF_HOME": str(tmp_path / "hf_home")}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    run_from_args([
        "--train_file", str(data / "train"), "--validation_file", str(data / "valid"), "--source_lang", "src",
        "--target_lang", "tgt", "--output_dir", str(tmp_path / "run"), "--do_train", "--max_steps", "2",
        "--config_overrides", "d_model=16,d_ff=32,num_heads=2,encoder_layers=1,decoder_layers=1",
        "--tokenizer_vocab_size", "280", "--max_tokens_per_batch", "64", "--warmup_steps", "1", "--use_cpu",
        "--report_to", "tensorboard", "--average_last_checkpoints", "1", "--logging_steps", "1",
    ])  # fmt: skip
    stdout, stderr = capfd.readouterr()
    written = {p.name for p in all_files(tmp_path / "run")}
    assert {"training_args.bin", "README.md", "training_summary.json"} <= written
    assert any("tfevents" in name for name in written)
    assert FAKE_TOKEN not in stdout + stderr + caplog.text
    assert [p for p in all_files(tmp_path) if FAKE_TOKEN.encode() in p.read_bytes()] == []
