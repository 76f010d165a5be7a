#!/usr/bin/env python
"""The Multi30k CPU recipe end to end: train for the recipe's budget, average its last checkpoints, test BLEU.

    python benchmarks/multi30k_cpu_recipe.py                      # 25 minutes, configs/multi30k_cpu.yaml
    python benchmarks/multi30k_cpu_recipe.py --recipe configs/multi30k_cpu_short.yaml --output_dir runs/m30k_short
    python benchmarks/multi30k_cpu_recipe.py --minutes 5 --output_dir runs/m30k_5min

Runs `scripts/train.py configs/multi30k_cpu.yaml` in a subprocess (so the training is exactly the documented
command), then prints a table: updates, tokens, wall time, throughput and sacreBLEU / chrF on test_2016_flickr
(beam 4, alpha 0.6: the model's default generation config, or the alpha the recipe chose on validation; on the
average of the recipe's last 8 checkpoints, or on the final weights where the recipe averages none),
and validation sacreBLEU (the set to choose settings on), and writes a learning-curve plot next to the run. Target:
sacreBLEU >= 36.5 (HF MarianMT of the same size, 25 minutes, standard recipe: 33.6). Needs ../shared/data/multi30k
(relative to the repository root).

`--time_to_bleu 36.5` keeps every checkpoint and then finds the first one whose average with the (up to 8) checkpoints
before it reaches that test sacreBLEU: minutes from the command's start to that checkpoint's write. It bisects over
the checkpoints (test BLEU of the running average grows with training: a handful of evaluations instead of one per
checkpoint) and prints every point it evaluated. Where the recipe has a `length_penalty_grid`, each average is
decoded with the alpha its validation score chooses, as the recipe's own model is.

Where the recipe chooses the length penalty on the validation set (`length_penalty_grid`), the table shows the
alpha chosen, the validation score of each, and the minutes until the chosen one was saved.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def validation_scores(recipe: Path, model_dir: Path) -> str:
    """sacreBLEU (chrF) of the averaged model on the recipe's validation files: the set to choose settings on."""
    from vaswani_transformer.evaluation import evaluate_model
    from vaswani_transformer.train import load_recipe

    values = load_recipe(recipe)
    prefix = REPO / values["validation_file"]
    if not (model_dir / "model.safetensors").is_file():
        return f"no model in {model_dir}"
    source, target = values["source_lang"], values["target_lang"]
    report = evaluate_model(model_dir, f"{prefix}.{source}", f"{prefix}.{target}", source_lang=source, target_lang=target)
    return f"{report['sacrebleu']:.2f} ({report['chrf']:.2f})"


def length_penalty_rows(record: dict | None, tested: Path, start: float) -> list[tuple]:
    """The recipe's `length_penalty_grid` choice: validation sacreBLEU per alpha, the chosen one, and when the tested
    model's generation config held it (minutes from the command's start: training plus the validation decodes)."""
    if not record:
        return [("length penalty (alpha)", "the model's (0.6, the paper's)")]
    scores = ", ".join(f"{alpha}: {bleu:.2f}" for alpha, bleu in record["validation_bleu"].items())
    ready = ((tested / "generation_config.json").stat().st_mtime - start) / 60
    return [
        ("length penalty (alpha) chosen on validation", f"{record['chosen']} (validation sacreBLEU {scores})"),
        ("minutes from the command's start to the chosen alpha", round(ready, 1)),
    ]


def time_to_bleu(run: Path, start: float, target: float, recipe: Path, num_last: int = 8) -> list[tuple]:
    """(minutes, step, test sacreBLEU) of the checkpoints evaluated by bisection for the first whose average with the
    `num_last - 1` before it reaches `target`; the last row is that checkpoint (or the final one, when never)."""
    from vaswani_transformer.checkpoints import average_checkpoints, checkpoint_problem, find_checkpoints
    from vaswani_transformer.evaluation import choose_length_penalty, evaluate_model
    from vaswani_transformer.train import load_recipe

    values = load_recipe(recipe)
    prefix, source, target_lang = REPO / values["test_file"], values["source_lang"], values["target_lang"]
    validation, grid = REPO / values["validation_file"], values.get("length_penalty_grid")
    checkpoints = [c for c in find_checkpoints(run) if checkpoint_problem(c) is None]
    scores: dict[int, float] = {}

    def bleu(i: int) -> float:
        if i not in scores:
            folder = run / "time_to_bleu" / checkpoints[i].name
            average_checkpoints(checkpoints[max(0, i - num_last + 1) : i + 1], None, folder)
            decoding, chosen = {}, ""
            if grid:  # the recipe's length_penalty_grid: alpha chosen on validation for this average too
                alpha = choose_length_penalty(lambda a: evaluate_model(
                    folder, f"{validation}.{source}", f"{validation}.{target_lang}", source_lang=source,
                    target_lang=target_lang, decoding={"length_penalty": a})["sacrebleu"], grid)["chosen"]  # fmt: skip
                decoding, chosen = {"length_penalty": alpha}, f" (alpha {alpha})"
            report = evaluate_model(folder, f"{prefix}.{source}", f"{prefix}.{target_lang}", source_lang=source,
                                    target_lang=target_lang, decoding=decoding)  # fmt: skip
            scores[i] = report["sacrebleu"]
            print(f"  {minutes(i):6.1f} min  {checkpoints[i].name}: test sacreBLEU {scores[i]:.2f}{chosen}", flush=True)
        return scores[i]

    def minutes(i: int) -> float:
        return ((checkpoints[i] / "trainer_state.json").stat().st_mtime - start) / 60

    low, high = 0, len(checkpoints) - 1
    if bleu(high) >= target:
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if bleu(middle) >= target else (middle + 1, high)
    return [(round(minutes(i), 1), checkpoints[i].name, round(scores[i], 2)) for i in sorted(scores)] + [
        (round(minutes(high), 1), checkpoints[high].name, round(bleu(high), 2))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=None,
                        help="training budget (wall clock); default: the recipe's max_train_minutes (25 for "
                             "configs/multi30k_cpu.yaml; none for configs/multi30k_cpu_short.yaml, whose budget is "
                             "updates)")  # fmt: skip
    parser.add_argument("--output_dir", default="runs/multi30k_cpu")
    parser.add_argument("--recipe", default="configs/multi30k_cpu.yaml")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores)")
    parser.add_argument("--time_to_bleu", type=float, default=None,
                        help="keep every checkpoint and report the minutes until test sacreBLEU first reaches this")
    parser.add_argument("extra", nargs="*", help="more --flags for scripts/train.py (after --)")
    args = parser.parse_args()

    out = Path(args.output_dir)
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), args.recipe, "--output_dir", str(out)]
    if args.minutes is not None:
        cmd += ["--max_train_minutes", str(args.minutes)]
    cmd += args.extra
    if args.time_to_bleu is not None:
        cmd += ["--save_total_limit", "100000"]  # every checkpoint stays, for the time-to-BLEU search
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    total = time.time() - start

    result = json.loads((REPO / out / "training_summary.json").read_text())
    summary, test = result.get("summary", {}), result.get("test", {})
    # The tested model: the average of the last checkpoints, or the final weights where the recipe averages none.
    tested = REPO / out / "averaged" if result.get("averaged_model") else REPO / out
    validation = validation_scores(REPO / args.recipe, tested)
    ready = ((tested / "model.safetensors").stat().st_mtime - start) / 60
    from vaswani_transformer.plots import plot_learning_curve

    plot = plot_learning_curve(
        REPO / out / "trainer_state.json",
        REPO / out / "learning_curve.png",
        title=f"Multi30k en-de, small Transformer, {summary.get('updates')} updates in "
              f"{summary.get('wall_time_seconds', 0) / 60:.1f} min on CPU",
        extra={"test_2016_flickr sacreBLEU": f"{test.get('test_bleu', float('nan')):.2f}"},
    )
    rows = [
        ("updates", summary.get("updates")),
        ("target tokens seen", summary.get("target_tokens_seen")),
        ("training wall time (s)", summary.get("wall_time_seconds")),
        ("target tokens / s", summary.get("target_tokens_per_second")),
        ("averaged checkpoints", "yes" if result.get("averaged_model") else "no"),
        ("minutes from the command's start to the tested model", round(ready, 1)),
        ("validation sacreBLEU (chrF)", validation),
        *length_penalty_rows(result.get("length_penalty"), tested, start),
        ("test_2016_flickr sacreBLEU", round(test.get("test_bleu", float("nan")), 2)),
        ("test_2016_flickr chrF", round(test.get("test_chrf", float("nan")), 2)),
        ("target (sacreBLEU)", ">= 36.5"),
        ("whole job wall time (s)", round(total, 1)),
        ("learning curve", plot),
    ]
    if args.time_to_bleu is not None:
        print(f"\nTime to test sacreBLEU {args.time_to_bleu} (average of up to 8 checkpoints, by bisection):")
        points = time_to_bleu(REPO / out, start, args.time_to_bleu, REPO / args.recipe)
        reached = points[-1][2] >= args.time_to_bleu
        rows.append((f"minutes to test sacreBLEU {args.time_to_bleu}",
                     f"{points[-1][0]} ({points[-1][1]})" if reached else f"not reached ({points[-1][2]} at the end)"))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    print("\n| " + "metric".ljust(width) + " | value |\n|" + "-" * (width + 2) + "|-------|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")


if __name__ == "__main__":
    main()
