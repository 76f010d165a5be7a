"""Pictures of the model and of a run (vaswani_transformer.plots, scripts/plot_run.py) and the card's pictures: the
numbers behind each picture against the paper's formulas written here, the PNGs' sizes, a real tiny training run."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from vaswani_transformer.card import training_info_from_run
from vaswani_transformer.hub import export_repository
from vaswani_transformer.plots import (
    learning_curve,
    learning_curve_by_time,
    learning_rate_schedule,
    main,
    plot_learning_curve,
    plot_learning_rate_schedule,
    plot_position_encoding,
    position_encoding,
    position_similarity,
)
from vaswani_transformer.train import run_from_args

from test_training import tiny_args, write_fixture

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "plot_run.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file, which must be non-empty."""
    path = Path(path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        return image.size


def paper_encoding(length: int, d_model: int) -> torch.Tensor:
    """Section 3.5 in float64: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    table = torch.zeros(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(0, d_model, 2):
            table[pos, i] = math.sin(pos / 10000 ** (i / d_model))
            if i + 1 < d_model:
                table[pos, i + 1] = math.cos(pos / 10000 ** (i / d_model))
    return table


def equation_3(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's equation (3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), times the factor."""
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# ------------------------------------------------------------------------------------- positional encoding


@pytest.mark.parametrize("d_model", [32, 30])
def test_encoding_is_the_papers_and_its_similarity_depends_on_the_offset_only(d_model, tmp_path):
    length = 64
    encoding = position_encoding(length, d_model)
    expected = paper_encoding(length, d_model)
    assert encoding.shape == (length, d_model) and encoding.dtype == torch.float64
    torch.testing.assert_close(encoding, expected, atol=1e-6, rtol=0)
    similarity = position_similarity(encoding)
    # PE(p) . PE(q) = sum_i sin(p w_i) sin(q w_i) + cos(p w_i) cos(q w_i) = sum_i cos((p - q) w_i), w_i = 10000^(-2i/d)
    frequencies = [10000 ** (-i / d_model) for i in range(0, d_model, 2)]
    by_offset = {k: sum(math.cos(k * w) for w in frequencies) for k in range(-length + 1, length)}
    formula = torch.tensor([[by_offset[p - q] for q in range(length)] for p in range(length)], dtype=torch.float64)
    torch.testing.assert_close(similarity, formula, atol=1e-5, rtol=0)
    for offset in range(-length + 1, length):  # Toeplitz: every diagonal is one value
        diagonal = torch.diagonal(similarity, offset)
        assert float(diagonal.max() - diagonal.min()) < 1e-5, offset
    assert float(similarity[0, 0]) == pytest.approx(d_model / 2)  # |PE(pos)|^2: d_model/2 pairs sin^2 + cos^2

    png = plot_position_encoding(tmp_path / "encoding.png", d_model=d_model, length=length)
    assert png_size(png) == (1200, 500)


def test_authors_layout_is_also_offset_only_and_bad_layouts_are_named(tmp_path):
    similarity = position_similarity(position_encoding(40, 16, layout="tensor2tensor"))
    for offset in range(-39, 40):
        diagonal = torch.diagonal(similarity, offset)
        assert float(diagonal.max() - diagonal.min()) < 1e-5
    with pytest.raises(ValueError, match="Unknown positional encoding layout 'rope'. Valid: sinusoidal, tensor2tensor"):
        position_encoding(10, 16, layout="rope")
    with pytest.raises(ValueError, match="length >= 1"):
        position_encoding(0, 16)


# ----------------------------------------------------------------------------------- learning-rate schedule


def test_schedule_of_the_shipped_recipes_peaks_at_equation_3(tmp_path):
    for name, d_model in (("quickstart.yaml", None), ("wmt14_en_de_big.yaml", 1024)):
        recipe = yaml.safe_load((REPO / "configs" / name).read_text())
        # the recipe's own d_model override, else the preset's (big: 1024, set by --preset, not in the file)
        d_model = (recipe.get("config_overrides") or {}).get("d_model", d_model)
        schedule = learning_rate_schedule(REPO / "configs" / name)
        warmup, factor = recipe["warmup_steps"], recipe["lr_factor"]
        assert (schedule.d_model, schedule.warmup, schedule.max_steps) == (d_model, warmup, recipe["max_steps"])
        step, rate = schedule.peak()
        assert step == warmup and rate == pytest.approx(equation_3(warmup, d_model, warmup, factor), rel=1e-12)
        for n in (1, warmup // 2, warmup + 1, recipe["max_steps"]):
            assert schedule.rates([n])[0] == pytest.approx(equation_3(n, d_model, warmup, factor), rel=1e-12)
    assert png_size(plot_learning_rate_schedule(schedule, tmp_path / "big.png")) == (800, 450)


def test_schedule_of_the_short_multi30k_recipe_warms_up_holds_and_anneals_to_zero():
    # transformers' warmup_stable_decay as the recipe describes it: linear warmup, the peak held, a cosine to 0.
    recipe = yaml.safe_load((REPO / "configs" / "multi30k_cpu_short.yaml").read_text())
    peak, warmup, total = recipe["learning_rate"], recipe["warmup_steps"], recipe["max_steps"]
    decay = recipe["lr_scheduler_kwargs"]["num_decay_steps"]

    def expected(n: int) -> float:  # update n (1-based) trains with the rate after n - 1 scheduler steps
        s = n - 1
        if s < warmup:
            return peak * s / warmup
        if s < total - decay:
            return peak
        return peak * 0.5 * (1 + math.cos(math.pi * (s - (total - decay)) / decay))

    schedule = learning_rate_schedule(REPO / "configs" / "multi30k_cpu_short.yaml")
    assert (schedule.d_model, schedule.max_steps) == (256, total)
    assert schedule.rates(range(1, total + 1)) == pytest.approx([expected(n) for n in range(1, total + 1)], abs=1e-15)
    assert schedule.peak() == (warmup + 1, pytest.approx(peak))
    assert schedule.rates([total])[0] < 1e-5 * peak  # the final weights are trained at a rate near 0


def test_schedule_takes_the_presets_training_values_and_hf_schedules(tmp_path):
    # A Table 3 row without warmup or max_steps in the recipe: the preset's values (4000, 100k) and its d_model.
    recipe = tmp_path / "c_d256.yaml"
    recipe.write_text("synthetic_task: numbers\noutput_dir: out\npreset: C-d256\n")
    schedule = learning_rate_schedule(recipe)
    assert (schedule.d_model, schedule.warmup, schedule.max_steps, schedule.lr_factor) == (256, 4000, 100_000, 1.0)
    assert schedule.peak() == (4000, pytest.approx(equation_3(4000, 256, 4000)))

    # transformers' linear schedule: update n trains at lr * (n-1)/warmup, then lr * (max - (n-1)) / (max - warmup)
    recipe = tmp_path / "hf.yaml"
    recipe.write_text("synthetic_task: numbers\noutput_dir: out\nlr_schedule: hf\nlearning_rate: 0.001\n"
                      "lr_scheduler_type: linear\nwarmup_steps: 10\nmax_steps: 100\n")  # fmt: skip
    schedule = learning_rate_schedule(recipe)
    expected = [1e-3 * (n - 1) / 10 if n - 1 < 10 else 1e-3 * (100 - (n - 1)) / 90 for n in range(1, 101)]
    assert schedule.rates(range(1, 101)) == pytest.approx(expected, abs=1e-15)
    assert schedule.peak() == (11, pytest.approx(1e-3))

    epochs = tmp_path / "epochs.yaml"
    epochs.write_text("synthetic_task: numbers\noutput_dir: out\nnum_train_epochs: 3\n")
    with pytest.raises(ValueError, match="trains for a number of epochs .* give max_steps"):
        learning_rate_schedule(epochs)
    assert learning_rate_schedule(epochs, max_steps=50).max_steps == 50
    with pytest.raises(FileNotFoundError, match="Recipe file or training output folder not found: .*missing.yaml"):
        learning_rate_schedule(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError, match="has no training_args.json: not a training output folder"):
        learning_rate_schedule(tmp_path)


# ------------------------------------------------------------------------------------- a real tiny run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real tiny training run (in-process): 6 updates, validation every 3, test set, last checkpoint averaged."""
    root = tmp_path_factory.mktemp("plots_run")
    data = write_fixture(root / "data", n_train=200, n_valid=6)
    out = root / "run"
    run_from_args(tiny_args(data, out, "--max_steps", "6", "--do_eval", "--eval_strategy", "steps", "--eval_steps",
                            "3", "--per_device_eval_batch_size", "8", "--save_strategy", "no", "--test_file",
                            str(data / "valid"), "--do_predict", "--average_last_checkpoints", "1"))  # fmt: skip
    return out, data


def test_log_entries_carry_wall_time_and_curves_use_it(run, tmp_path):
    out, _ = run
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    elapsed = [entry["elapsed_seconds"] for entry in history]  # every entry: losses, evaluations, the final one
    summary = json.loads((out / "training_summary.json").read_text())["summary"]
    assert elapsed == sorted(elapsed) and 0 < elapsed[0] and elapsed[-1] < summary["wall_time_seconds"] + 60
    curves, timed = learning_curve(out), learning_curve_by_time(out)
    assert [s for s, _ in curves["loss"]] == list(range(1, 7)) and [s for s, _ in curves["eval_bleu"]] == [3, 6]
    losses = [(e["elapsed_seconds"], e["loss"]) for e in history if "loss" in e]
    assert timed["loss"] == losses and len(timed["eval_loss"]) == len(curves["eval_loss"]) == 2
    assert png_size(plot_learning_curve(out, tmp_path / "curve.png")) == (1200, 450)
    # a run logged before elapsed_seconds existed: the time panel says so, the picture keeps its size
    old = tmp_path / "old"
    old.mkdir()
    stripped = [{k: v for k, v in e.items() if k != "elapsed_seconds"} for e in history]
    (old / "trainer_state.json").write_text(json.dumps({"log_history": stripped}))
    assert learning_curve_by_time(old) == {}
    assert png_size(plot_learning_curve(old, tmp_path / "old.png")) == (1200, 450)
    with pytest.raises(FileNotFoundError, match="No trainer_state.json at .*: not a training output"):
        learning_curve(tmp_path / "nothing")


def test_schedule_of_a_run_is_what_it_trained_with(run):
    out, _ = run
    schedule = learning_rate_schedule(out)
    assert (schedule.d_model, schedule.warmup, schedule.lr_factor, schedule.max_steps) == (32, 10, 3.0, 6)
    logged = [rate for _, rate in learning_curve(out)["learning_rate"]]
    assert schedule.rates(range(1, 7)) == pytest.approx(logged, rel=1e-6)
    assert logged == pytest.approx([equation_3(n, 32, 10, 3.0) for n in range(1, 7)], rel=1e-6)
    # the run records its arguments: the card reads the recipe from them (only the paper schedule's own values)
    info = training_info_from_run(out)
    assert info["warmup_steps"] == 10 and info["lr_factor"] == 3 and info["lr_schedule"] == "paper"
    assert "learning_rate" not in info and info["max_steps"] == 6 and "num_train_epochs" not in info


def test_an_evaluation_on_start_a_run_s_own_schedule_and_the_smoothed_validation_loss_are_drawn_as_they_are(
        run, tmp_path):  # fmt: skip
    """`--eval_on_start`'s evaluation (before update 1) had no wall time, so the time panel left it out; `--max_steps`
    on a run folder redrew its schedule for another total (rates its optimizer never applied); and the validation
    loss, label-smoothed like the training loss, was labelled as if it were the plain NLL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vaswani_transformer.plots import _draw_curves

    out, data = run
    early = tmp_path / "early"
    run_from_args(tiny_args(data, early, "--max_steps", "4", "--do_eval", "--eval_strategy", "steps", "--eval_steps",
                            "2", "--eval_on_start", "true", "--per_device_eval_batch_size", "8", "--save_strategy",
                            "no"))  # fmt: skip
    curves, timed = learning_curve(early), learning_curve_by_time(early)
    assert [s for s, _ in curves["eval_loss"]] == [0, 2, 4]
    assert len(timed["eval_loss"]) == 3 and timed["eval_loss"][0][0] == 0.0
    with pytest.raises(ValueError, match="trained for 6 updates, with the schedule of that total: --max_steps 12"):
        learning_rate_schedule(out, max_steps=12)
    assert learning_rate_schedule(out, max_steps=6).max_steps == 6
    fig, ax = plt.subplots()
    _draw_curves(ax, curves, "update")
    labels = ax.get_legend_handles_labels()[1]
    plt.close(fig)
    assert "validation loss (label-smoothed)" in labels and "training loss (label-smoothed)" in labels


def card_images(folder: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (folder / "README.md").read_text(encoding="utf-8"))


def test_card_embeds_the_learning_curve_and_attention_and_export_carries_them(run, tmp_path):
    out, data = run
    images = card_images(out)
    assert "learning_curve.png" in images
    for image in images:  # relative paths inside the folder, so they show on the Hub
        assert "://" not in image and not image.startswith("/") and (out / image).is_file(), image
    assert png_size(out / "learning_curve.png") == (1200, 450)
    assert "attention.png" in images
    first_test_source = (data / "valid.src").read_text().splitlines()[0]
    card = (out / "README.md").read_text()
    assert f"> {first_test_source}\n" in card and "the first test sentence" in card
    # The optimizer row names what VaswaniSeq2SeqTrainer built (Adam with the paper's betas), not `--optim`.
    args = json.loads((out / "training_args.json").read_text())
    assert (args["adam_beta1"], args["adam_beta2"], args["adam_epsilon"], args["weight_decay"]) == (0.9, 0.98, 1e-9, 0)
    assert "| optimizer | Adam (beta1 0.9, beta2 0.98, eps 1e-09) |" in card, card

    # Push: the repository folder (the dry run's output, uploaded whole by upload_folder) of the averaged model,
    # whose learning curve comes from the run around it.
    assert not (out / "averaged" / "trainer_state.json").exists()
    repo = export_repository(out / "averaged", tmp_path / "repo", source_lang="src", target_lang="tgt")
    assert sorted(card_images(repo)) == sorted(images)
    for image in images:
        assert (repo / image).is_file() and png_size(repo / image)[0] > 100


# --------------------------------------------------------------------------------------------- command line


def test_cli_subcommands_write_their_pictures(run, tmp_path):
    out, _ = run
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    commands = {
        "encoding": ["encoding", "--d_model", "64", "--length", "50"],
        "schedule": ["schedule", str(REPO / "configs" / "quickstart.yaml")],
        "curves": ["curves", str(out)],
    }
    sizes = {"encoding": (1200, 500), "schedule": (800, 450), "curves": (1200, 450)}
    for name, args in commands.items():
        png = tmp_path / f"{name}.png"
        done = subprocess.run([sys.executable, str(SCRIPT), *args, "--output", str(png)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"Wrote {png}" in done.stdout and png_size(png) == sizes[name]
        if name == "schedule":  # quickstart: d_model 128, warmup 100, lr_factor 0.25
            peak = re.search(r"Peak learning rate (\S+) at update (\d+)", done.stdout)
            assert int(peak[2]) == 100 and float(peak[1]) == pytest.approx(equation_3(100, 128, 100, 0.25), rel=1e-5)


def test_cli_bad_input_is_one_clear_error(tmp_path, capsys):
    assert main(["schedule", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "x.png")]) == 1
    assert "error: Recipe file or training output folder not found" in capsys.readouterr().err
    assert main(["curves", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 1
    assert f"error: No trainer_state.json at {tmp_path / 'trainer_state.json'}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["encoding", "--d_mod", "64", "-o", str(tmp_path / "x.png")])
    assert exit_info.value.code == 2
    assert "unknown option --d_mod (did you mean --d_model?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["encoding", "--d_model", "64"])
    assert "required: --output" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_output_without_an_extension_gets_png_and_a_folder_is_refused(tmp_path, capsys):
    """As matplotlib's savefig, a name without an extension is written with ".png", and the path printed is the
    file written; a folder (existing, or named by a trailing "/") and an extension matplotlib cannot write are
    refused before anything is drawn."""
    args = ["encoding", "--d_model", "8", "--length", "4", "-o"]
    assert main([*args, str(tmp_path / "encoding")]) == 0
    assert capsys.readouterr().out == f"Wrote {tmp_path / 'encoding.png'}\n"
    assert png_size(tmp_path / "encoding.png") == (1200, 500) and not (tmp_path / "encoding").exists()
    (tmp_path / "pictures").mkdir()
    refused = {tmp_path / "pictures": [f"--output {tmp_path / 'pictures'} is a folder, not a file."],
               f"{tmp_path / 'pictures'}/": [f"names a folder; give a file name such as {tmp_path / 'pictures'}/"],
               tmp_path / "plot.v2": ["matplotlib cannot write .v2 files; end the name in one of", ".pdf, ", ".png, ",
                                      "(no extension: .png)"]}  # fmt: skip
    for output, messages in refused.items():
        assert main([*args, str(output)]) == 1
        captured = capsys.readouterr()
        assert all(message in captured.err for message in messages) and captured.out == "", captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoding.png", "pictures"]
    assert not list((tmp_path / "pictures").iterdir())
