"""Hub export: the dry-run folder works with only transformers, the card carries the results, uploads are validated."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

import vaswani_transformer  # noqa: F401
from vaswani_transformer import VaswaniTransformerConfig
from vaswani_transformer.evaluation import evaluate_model, evaluation_report
from vaswani_transformer.card import count_parameters, detect_preset, eval_results_for_card, training_info_from_run
from vaswani_transformer.hub import (
    CODE_FILES,
    RepositoryValidationError,
    export_repository,
    push_repository,
    write_model_card,
    write_repository_extras,
)

from helpers import (
    SINGLE_THREAD_ENV,
    SOURCES,
    TEST_MAX_LEN_B,
    generate_texts,
    save_tiny_model,
)


ROOT = Path(__file__).resolve().parents[1]
REFERENCES = [
    "Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee beim kleinen Haus am Fluss.", "Grüße aus Köln", "x",
    "Die Katze schläft.", "Zwei Hunde spielen im Schnee und ein Mann fährt Fahrrad die Straße entlang.",
]  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    model, tokenizer = save_tiny_model(folder)
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def eval_json(tmp_path_factory):
    """A real evaluation report (the JSON vaswani-evaluate writes): hypotheses that partly match the references."""
    path = tmp_path_factory.mktemp("eval") / "test_2016_flickr.json"
    hypotheses = REFERENCES[:3] + ["y", "Die Katze.", "Zwei Hunde spielen."]
    report = evaluation_report(hypotheses, REFERENCES, source_lang="en", target_lang="de", model="tiny",
                               output_json=path, source_file="data/test_2016_flickr.en")  # fmt: skip
    return path, report


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, saved, eval_json):
    """scripts/push_to_hub.py --output_dir, as a user runs it (it validates the folder in a clean Python itself)."""
    folder, _, _ = saved
    out = tmp_path_factory.mktemp("dry") / "repo"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "push_to_hub.py"), "--model_name_or_path", str(folder),
         "--output_dir", str(out), "--source_lang", "en", "--target_lang", "de", "--eval_results", str(eval_json[0]),
         "--dataset", "bentrevett/multi30k", "--repo_id", "someone/transformer-tiny-en-de"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", **SINGLE_THREAD_ENV},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"Wrote {out}; it translates in a clean Python" in result.stdout
    return out


class RecordingHfApi:
    """Stands in for huggingface_hub.HfApi (no network): records what would be created and uploaded."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        return type("CommitInfo", (), {"commit_url": f"https://hub.example/{kwargs['repo_id']}/commit/1"})()


@pytest.mark.slow
def test_dry_run_folder_loads_and_translates_without_the_package(dry_run, saved, python_without_package):
    _, model, tokenizer = saved
    files = sorted(p.name for p in dry_run.iterdir())
    for name in ("README.md", "config.json", "generation_config.json", "model.safetensors", "pipeline.py",
                 "tokenizer.json", "tokenizer_config.json", *CODE_FILES):  # fmt: skip
        assert name in files
    config = json.loads((dry_run / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("modeling_vaswani_transformer.")
    assert set(config["custom_pipelines"]) == {"translation", "translation_en_to_de"}
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline.TranslationPipeline"

    expected = generate_texts(model, tokenizer, SOURCES)
    result = python_without_package(
        f"""
        import json
        import torch
        torch.set_num_threads(1)
        from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        folder = {str(dry_run)!r}
        sources = {SOURCES!r}
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
        generated = tokenizer.batch_decode(
            model.generate(**tokenizer(sources, return_tensors="pt", padding=True)), skip_special_tokens=True
        )
        translator = pipeline("translation_en_to_de", model=folder, trust_remote_code=True)
        g = model.generation_config
        print(json.dumps({{
            "config": type(config).__name__, "model": type(model).__module__,
            "generate": generated, "pipeline": [o["translation_text"] for o in translator(sources, batch_size=3)],
            "decoding": [g.num_beams, g.length_penalty, g.length_penalty_type, g.early_stopping, g.max_len_a,
                         g.max_len_b],
        }}))
        """
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["config"] == "VaswaniTransformerConfig" and report["model"].startswith("transformers_modules.")
    assert report["generate"] == expected and report["pipeline"] == expected
    assert report["decoding"] == [4, 0.6, "gnmt", True, 0, TEST_MAX_LEN_B]  # the saved model's, kept on export


def test_exported_repository_gives_the_base_model_to_automodel_without_the_package(
    tmp_path, saved, python_without_package
):
    """`AutoModel.from_pretrained(repo, trust_remote_code=True)` where the package is not installed loads the base
    model, as `AutoModel` does with the package (which registers it): transformers' `save_pretrained` maps only the
    seq2seq class in `auto_map`, and this call failed with "Unrecognized configuration class". Its encoder output is
    the package's. The model's own saved folder (`saved`) and its export both map it."""
    folder, model, tokenizer = saved
    repo = export_repository(folder, tmp_path / "repo")
    for config in (folder / "config.json", repo / "config.json"):
        auto_map = json.loads(config.read_text())["auto_map"]
        assert auto_map["AutoModel"] == "modeling_vaswani_transformer.VaswaniTransformerModel", config
    with torch.no_grad():
        expected = model.model.encoder(**tokenizer(SOURCES, return_tensors="pt", padding=True)).last_hidden_state
    hidden_path = tmp_path / "hidden.pt"
    result = python_without_package(
        f"""
        import json
        import torch
        torch.set_num_threads(1)
        from transformers import AutoModel, AutoTokenizer
        folder = {str(repo)!r}
        model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        inputs = tokenizer({SOURCES!r}, return_tensors="pt", padding=True)
        with torch.no_grad():
            torch.save(model.encoder(**inputs).last_hidden_state, {str(hidden_path)!r})
        print(json.dumps([type(model).__module__, type(model).__name__]))
        """
    )
    module, name = json.loads(result.stdout.strip().splitlines()[-1])
    assert module.startswith("transformers_modules.") and name == "VaswaniTransformerModel"
    assert torch.equal(torch.load(hidden_path), expected)


def test_card_parses_and_carries_the_results(tmp_path, saved, eval_json):
    folder, model, _ = saved
    path, report = eval_json
    repo = tmp_path / "repo"
    export_repository(folder, repo, eval_results=[path], datasets=["bentrevett/multi30k"], source_lang="en",
                      target_lang="de", training_info={"max_steps": 100000, "warmup_steps": 4000})  # fmt: skip
    card = ModelCard.load(repo / "README.md")
    data = card.data
    assert data.language == ["en", "de"] and data.license == "apache-2.0" and data.datasets == ["bentrevett/multi30k"]
    assert data.pipeline_tag == "translation" and data.library_name == "transformers"
    results = {r.metric_name: r for r in data.eval_results}
    assert set(results) == {"sacreBLEU", "tokenized BLEU", "chrF"}
    assert results["sacreBLEU"].metric_value == round(report["sacrebleu"], 2) > 0
    assert results["sacreBLEU"].metric_config == report["sacrebleu_signature"]
    assert results["tokenized BLEU"].metric_value == round(report["tokenized_bleu"], 2)
    assert results["chrF"].metric_value == round(report["chrf"], 2)
    assert all(r.task_type == "translation" and r.dataset_name == "test_2016_flickr.en" for r in data.eval_results)
    text = card.text
    parameters = model.num_parameters()
    assert count_parameters(repo) == parameters
    assert f"{parameters:,}" in text and "`custom` (not a paper preset)" in text
    assert "| max_steps | 100000 |" in text and "| warmup steps | 4000 |" in text
    assert "English (en) → German (de)" in text
    assert 'pipeline("translation", model=repo, trust_remote_code=True)' in text
    assert report["sacrebleu_signature"].replace("|", "\\|") in text  # escaped inside the results table


def test_card_names_the_decoding_of_an_evaluate_model_report(saved):
    """translate_lines' None arguments keep the model's generation config: the card shows that config's values,
    and an explicit argument where one was given."""
    _, model, tokenizer = saved
    config = model.generation_config
    for decoding, beams in ((None, config.num_beams), ({"num_beams": 2}, 2)):
        report = evaluate_model(model, SOURCES[:2], REFERENCES[:2], tokenizer=tokenizer, source_lang="en",
                                target_lang="de", decoding=decoding)  # fmt: skip
        text = eval_results_for_card([report], "en", "de")[2]
        assert f"num_beams={beams}," in text and f"length_penalty={config.length_penalty}," in text, text
        assert f"max_len_a={config.max_len_a}," in text and "None" not in text, text
        assert "length_penalty_type=gnmt," in text and "beam_search_rules=t2t," in text, text
    # any decoding field the evaluation passed (vaswani-evaluate --decoding length_penalty_type=transformers)
    report = evaluate_model(model, SOURCES[:2], REFERENCES[:2], tokenizer=tokenizer, source_lang="en",
                            target_lang="de", decoding={"length_penalty_type": "transformers"})  # fmt: skip
    assert "length_penalty_type=transformers," in eval_results_for_card([report], "en", "de")[2]
    # two test sets, decoded differently, or one of them scored from hypotheses as given: each named with its own
    # (before, the one decoding was written for both)
    greedy = evaluation_report(["a b c d"], ["a b c d"], source_lang="en", target_lang="de", decoding={"num_beams": 1},
                               source_file="data/newstest2014.en")  # fmt: skip
    given = evaluation_report(["a b c d"], ["a b c e"], source_lang="en", target_lang="de",
                              source_file="data/newstest2013.en")  # fmt: skip
    text = eval_results_for_card([greedy, given], "en", "de")[2]
    assert text == "newstest2014.en: num_beams=1; newstest2013.en: not recorded", text
    assert eval_results_for_card([given], "en", "de")[2] is None  # the card then names the generation config


def test_a_report_does_not_replace_a_runs_results_and_one_found_in_their_place_reaches_the_card(tmp_path, saved):
    """vaswani-evaluate's help once showed `--output_json <average>/eval_results.json`: the report replaced the
    Trainer's validation score there, and the card, finding no `eval_bleu` in the file, showed neither. A report now
    refuses to replace other results (before translating anything), and a report found there is the card's."""
    from vaswani_transformer.card import trainer_metric_reports

    _, model, tokenizer = saved
    trainer_file = tmp_path / "eval_results.json"
    trainer_file.write_text(json.dumps({"eval_bleu": 11.0, "eval_loss": 2.5}))
    translated = []

    def translate_fn(model, tokenizer, lines, **decoding):
        translated.extend(lines)
        return list(lines)

    with pytest.raises(FileExistsError, match="eval_results.json holds other results \\(eval_bleu, eval_loss\\)"):
        evaluate_model(model, SOURCES[:2], REFERENCES[:2], tokenizer=tokenizer, source_lang="en", target_lang="de",
                       translate_fn=translate_fn, output_json=trainer_file)  # fmt: skip
    with pytest.raises(FileExistsError, match="holds other results"):
        evaluation_report(["a"], ["a"], target_lang="de", output_json=trainer_file)
    assert translated == [] and json.loads(trainer_file.read_text()) == {"eval_bleu": 11.0, "eval_loss": 2.5}
    # a report replaces a report (the same command run again)
    report_file = tmp_path / "report.json"
    evaluation_report(["a b c"], ["a b d"], target_lang="de", output_json=report_file)
    first = evaluation_report(["a b c d"], ["a b c d"], target_lang="de", output_json=report_file,
                              source_file="data/test_2016_flickr.en")  # fmt: skip
    assert json.loads(report_file.read_text())["sacrebleu"] == first["sacrebleu"] == pytest.approx(100)
    # a folder written before: its eval_results.json is a report, which the card shows (it was dropped silently)
    folder = tmp_path / "averaged"
    folder.mkdir()
    (folder / "test_results.json").write_text(json.dumps({"test_bleu": 12.5}))
    shutil.copy(report_file, folder / "eval_results.json")
    reports = trainer_metric_reports(folder)
    assert [r["sacrebleu"] for r in reports] == [12.5, first["sacrebleu"]]
    rows = eval_results_for_card(reports, "en", "de")[1]
    shown = [(r["dataset"], r["metric"], r["value"]) for r in rows]
    assert ("test_2016_flickr.en", "sacreBLEU", first["sacrebleu"]) in shown, shown


def test_trainer_runs_get_the_same_repository(tmp_path, saved):
    """write_model_card is what VaswaniSeq2SeqTrainer.create_model_card calls on its output folder."""
    from transformers import Seq2SeqTrainer

    from vaswani_transformer.train import VaswaniTrainingArguments

    folder, model, tokenizer = saved
    run = tmp_path / "run"
    shutil.copytree(folder, run)
    (run / "pipeline.py").unlink(missing_ok=True)
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 1234}))
    (run / "training_summary.json").write_text(json.dumps({"summary": {
        "updates": 1234, "source_tokens_seen": 56789, "target_tokens_seen": 60000, "wall_time_seconds": 12.5,
        "num_processes": 2}}))  # fmt: skip
    (run / "test_results.json").write_text(json.dumps({"test_bleu": 12.5, "test_chrf": 40.25, "test_loss": 3.0}))
    assert training_info_from_run(run)["source_tokens_seen"] == 56789
    args = VaswaniTrainingArguments(output_dir=str(run), report_to=[], max_steps=50, warmup_steps=10)
    trainer = Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)
    card = write_model_card(run, trainer=trainer, language=["en", "de"], dataset="multi30k")
    assert (run / "pipeline.py").is_file()
    custom_pipelines = json.loads((run / "config.json").read_text())["custom_pipelines"]
    assert set(custom_pipelines) == {"translation", "translation_en_to_de"}
    loaded = ModelCard.load(run / "README.md")
    assert loaded.data.language == ["en", "de"] and loaded.data.datasets == ["multi30k"]
    results = {r.metric_name: r for r in loaded.data.eval_results}
    assert set(results) == {"sacreBLEU", "chrF"} and results["sacreBLEU"].metric_value == 12.5
    assert results["chrF"].metric_value == 40.25 and results["sacreBLEU"].dataset_split == "test"
    assert "| test split | sacreBLEU | 12.50 | `-` |" in loaded.text
    rows = ("| Adam beta2 | 0.98 |", "| Adam epsilon | 1e-09 |", "| label smoothing | 0.1 |", "| warmup steps | 10 |",
            "| learning-rate schedule | paper |", "| max_steps | 50 |", "| source tokens seen | 56789 |")
    for row in rows:
        assert row in card.text, row
    assert "| updates (optimizer steps) | 1234 |" in card.text


@pytest.mark.parametrize("schedule", ["paper", "hf", "hf-clocked"])
def test_card_shows_the_settings_of_the_schedule_in_use(tmp_path, saved, schedule):
    """The paper schedule: its factor, not the learning rate or transformers' schedule type it ignores; transformers'
    schedules (lr_schedule=hf): their type, arguments and learning rate, not the paper's factor (before, an hf run's
    card showed `schedule factor 1` and no schedule); a decay placed by the clock: the budget and its decay minutes."""
    from transformers import Seq2SeqTrainer

    from vaswani_transformer.train import VaswaniTrainingArguments

    folder, model, tokenizer = saved
    run = tmp_path / "run"
    shutil.copytree(folder, run)
    lr_schedule, clocked = schedule.split("-")[0], schedule == "hf-clocked"
    hf = lr_schedule == "hf"
    kwargs = {"max_train_minutes": 2.0, "lr_decay_minutes": 0.5} if clocked else {
        "lr_factor": 2.0, "lr_scheduler_kwargs": {"num_decay_steps": 20}}  # fmt: skip
    args = VaswaniTrainingArguments(
        output_dir=str(run), report_to=[], max_steps=50, warmup_steps=10, lr_schedule=lr_schedule,
        learning_rate=1.1e-3, lr_scheduler_type="warmup_stable_decay", **kwargs,
    )  # fmt: skip
    card = write_model_card(run, trainer=Seq2SeqTrainer(model=model, args=args, processing_class=tokenizer)).text
    rows = {"| schedule factor | 2 |": schedule == "paper", "| learning rate | 0.0011 |": hf,
            "| transformers schedule | warmup_stable_decay |": hf,
            '| schedule arguments | {"num_decay_steps": 20} |': schedule == "hf",
            "| time budget (minutes) | 2 |": clocked,
            "| decay over the budget's last (minutes) | 0.5 |": clocked}  # fmt: skip
    assert {row: row in card for row in rows} == rows
    assert f"| learning-rate schedule | {lr_schedule} |" in card and "| warmup steps | 10 |" in card


def test_generation_config_written_or_completed(tmp_path, saved):
    folder, _, _ = saved
    repo = tmp_path / "repo"
    shutil.copytree(folder, repo)
    (repo / "generation_config.json").unlink()
    card = write_repository_extras(repo, source_lang="en", target_lang="de")
    assert card.data.eval_results is None and "No evaluation results were recorded" in card.text
    generation = json.loads((repo / "generation_config.json").read_text())
    assert {k: generation[k] for k in ("num_beams", "length_penalty", "length_penalty_type", "max_len_a", "max_len_b",
                                       "early_stopping")} == {  # fmt: skip
        "num_beams": 4, "length_penalty": 0.6, "length_penalty_type": "gnmt", "max_len_a": 1, "max_len_b": 50,
        "early_stopping": True}  # fmt: skip
    # An existing generation config is the model's choice: kept, only the missing paper fields are added.
    generation.update(num_beams=5)
    del generation["max_len_a"]
    (repo / "generation_config.json").write_text(json.dumps(generation))
    write_repository_extras(repo)
    generation = json.loads((repo / "generation_config.json").read_text())
    assert generation["num_beams"] == 5 and generation["max_len_a"] == 1
    # the language pair recorded at the first export is kept
    assert "translation_en_to_de" in json.loads((repo / "config.json").read_text())["custom_pipelines"]


def test_incomplete_folders_and_bad_inputs_are_refused(tmp_path, saved):
    folder, model, tokenizer = saved
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "config.json", bare / "config.json")
    with pytest.raises(FileNotFoundError, match="lacks configuration_vaswani_transformer.py, modeling_vaswani"):
        write_repository_extras(bare)
    with pytest.raises(FileExistsError, match="is not empty"):
        export_repository(folder, bare)
    with pytest.raises(ValueError, match="Pass `tokenizer`"):
        export_repository(model, tmp_path / "new")
    with pytest.raises(FileNotFoundError, match="incomplete; missing: the weights"):
        export_repository(bare, tmp_path / "new2")
    # an output folder that is, or holds, the model is refused before anything is deleted, even with overwrite
    run = tmp_path / "run"
    shutil.copytree(folder, run / "averaged")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for out in (run, run / "averaged", run / "averaged" / ".." / "averaged"):
        with pytest.raises(ValueError, match="the model to export .* would delete the model first"):
            export_repository(run / "averaged", out, overwrite=True)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    bad_eval = tmp_path / "eval.json"
    bad_eval.write_text(json.dumps({"bleu": 1.0}))
    with pytest.raises(ValueError, match="no 'sacrebleu', 'tokenized_bleu' or 'chrf' score"):
        export_repository(folder, tmp_path / "new3", eval_results=[bad_eval])


def test_detect_preset():
    assert detect_preset(VaswaniTransformerConfig.from_preset("base", vocab_size=100)) == "base"
    assert detect_preset(VaswaniTransformerConfig.from_preset("big")) == "big"
    # Section 6.1: the English-to-French big model used P_drop 0.1 (configs/wmt14_en_fr_big.yaml); it was "custom"
    assert detect_preset(VaswaniTransformerConfig.from_preset("big", dropout=0.1)) == "big"
    assert detect_preset(VaswaniTransformerConfig.from_preset("big", dropout=0.2)) == "custom"
    assert detect_preset(VaswaniTransformerConfig.from_preset("base", dropout=0.2)) == "D-drop0.2"
    assert detect_preset(VaswaniTransformerConfig.from_preset("E-learned")) == "E-learned"
    assert detect_preset(VaswaniTransformerConfig(d_model=64, num_heads=2, d_ff=128)) == "custom"


@pytest.mark.slow
def test_push_uploads_only_a_validated_folder(tmp_path, dry_run, caplog, capsys):
    token = "hf_not_a_real_token_0123456789"
    api = RecordingHfApi()
    url = push_repository(dry_run, "someone/tiny", private=True, revision="v1", commit_message="first", token=token,
                          api=api)  # fmt: skip
    assert url == "https://hub.example/someone/tiny/commit/1"
    assert [c[0] for c in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert api.calls[0][2]["private"] is True and api.calls[1][2]["branch"] == "v1"
    upload = api.calls[2][2]
    assert upload["folder_path"] == str(dry_run) and upload["revision"] == "v1" and upload["commit_message"] == "first"

    broken = tmp_path / "broken"
    shutil.copytree(dry_run, broken)
    (broken / "pipeline.py").unlink()  # the remote-code pipeline is gone: the folder must not be uploaded
    api = RecordingHfApi()
    with pytest.raises(RepositoryValidationError, match="does not translate in a Python without vaswani_transformer"):
        push_repository(broken, "someone/tiny", token=token, api=api)
    assert api.calls == []
    captured = capsys.readouterr()
    assert token not in caplog.text + captured.out + captured.err


def test_push_refuses_a_run_folder_with_training_state_or_another_model(tmp_path, saved):
    """A training run's folder (checkpoints with optimizer states, averaged/ holding another model) is refused before
    anything is validated or uploaded, naming what it holds (before, all of it was uploaded)."""
    folder, _, _ = saved
    run = tmp_path / "run"
    shutil.copytree(folder, run)
    (run / "checkpoint-2").mkdir()
    (run / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")
    (run / "checkpoint-2" / "config.json").write_text("{}")
    (run / "averaged").mkdir()
    (run / "averaged" / "config.json").write_text("{}")
    api = RecordingHfApi()
    with pytest.raises(ValueError, match=r"holds more than a model repository \(averaged, checkpoint-2\).*Export the "
                                         r"model to a clean folder first"):  # fmt: skip
        push_repository(run, "someone/tiny", api=api)
    assert api.calls == []
    (run / "optimizer.pt").write_bytes(b"state")  # training state at the top level too
    with pytest.raises(ValueError, match=r"\(averaged, checkpoint-2, optimizer.pt\)"):
        push_repository(run, "someone/tiny", api=api)


@pytest.mark.slow
def test_push_without_network_is_one_line_and_uploads_nothing(tmp_path, saved):
    folder, _, _ = saved
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    token = "hf_not_a_real_token_0123456789"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN=token, HF_HOME=str(tmp_path / "hf_home"), **SINGLE_THREAD_ENV)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "push_to_hub.py"), "--model_name_or_path", str(folder),
         "--repo_id", "someone/tiny"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 1, output
    assert output.splitlines() == [output] and "Traceback" not in output
    assert output.startswith(f"error: cannot reach the Hub at {endpoint}: ") and output.endswith(
        "; nothing was uploaded."
    )
    assert token not in output


@pytest.mark.slow
def test_dry_run_card_shows_its_pictures_by_relative_paths(dry_run):
    """The card links its pictures relatively (they show on the Hub) and the folder push uploads holds them; a saved
    model folder without a training run around it has no learning curve to show."""
    import re

    text = (dry_run / "README.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert "learning_curve.png" not in images and not (dry_run / "learning_curve.png").exists()
    assert images == ["attention.png"] and (dry_run / "attention.png").read_bytes()[:4] == b"\x89PNG"
    assert "> A man is riding a bicycle down the street.\n" in text  # no test set known: the card's example
