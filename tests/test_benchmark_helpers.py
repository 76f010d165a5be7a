"""The benchmarks' own measuring helpers (benchmarks/device.py), where a wrong figure would go unnoticed."""

import json
import os
import subprocess
import sys

import pytest


BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def printed_json(code: str):
    """What `code`, run in a fresh Python (so that a benchmark's imports and process state are its own), prints as
    JSON on its last line."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS from /proc: Linux")
def test_a_child_process_reports_its_own_peak_rss_not_its_parents():
    """Each benchmark setting runs in a child process so that its peak RSS is its own. getrusage's ru_maxrss is not:
    Linux carries the parent's peak into a child started with fork/vfork and exec. A parent holding 1.5 GiB more than
    the child ever touches: the child's reported peak stays far below it."""
    ballast = bytearray(b"\x01") * (1536 * 2**20)  # written, so resident
    code = (f"import sys, json, torch; sys.path.insert(0, {BENCHMARKS!r}); import device; "
            "print(json.dumps([device.peak_memory_mib(torch.device('cpu')), device.peak_rss_mib()]))")  # fmt: skip
    cpu_peak, rss_peak = printed_json(code)
    assert cpu_peak == rss_peak
    assert 10 < rss_peak < 1024, rss_peak  # torch imported: a few hundred MiB, not the parent's 1.5 GiB and more
    assert ballast[-1] == 1


def test_bf16_notes_give_the_real_reason():
    """The benchmarks' notes on bf16 name why it was or was not timed: `--bf16 no` on a device with native bf16 is
    no "emulated" device (training_step_speed.py said so), and the recipe comparison of training_token_batches.py
    names the precision the CPU recipe trains in on the device (bf16 where native: `bf16_where_native`), not the
    one `--bf16` happened to leave timed."""
    code = (f"import sys, json; sys.path.insert(0, {BENCHMARKS!r}); import training_step_speed as s, "
            "training_token_batches as t; print(json.dumps("
            "[s.bf16_note(r, n) for r in ('auto', 'yes', 'no') for n in (True, False)] + "
            "[t.recipe_precision(p, n) for p in (['fp32'], ['fp32', 'bf16']) for n in (True, False)]))")  # fmt: skip
    auto_native, auto_emulated, yes_native, yes_emulated, no_native, no_emulated, *recipe = printed_json(code)
    assert auto_native == yes_native == ""  # timed natively: nothing to explain
    assert "skipped: emulated" in auto_emulated and "emulated" in yes_emulated and "timed" in yes_emulated
    assert no_native == no_emulated and "--bf16 no" in no_native and "emulated" not in no_native
    fp32_only_native, fp32_only_emulated, both_native, both_emulated = recipe
    assert fp32_only_native[0] == "fp32" and "trains in bf16 here" in fp32_only_native[1]
    assert fp32_only_native[1].count("fp32") == 1 and "--bf16 no" in fp32_only_native[1]
    assert both_native == ["bf16", "as the CPU recipe trains here (bf16)"]
    assert fp32_only_emulated == both_emulated == ["fp32", "as the CPU recipe trains here (fp32)"]


def test_operator_times_see_every_operator_of_a_training_step_once():
    """training_token_batches.py's `--profile` on a CPU (`OperatorTimes`): a bf16-autocast step of a linear layer
    shows autocast's casts, autograd's backward products and fused Adam under torch.profiler's names; an operator
    that calls others inside (a cast's copy) is timed once, as itself; the times add up to no more than the block's
    wall time; and `profile_shares` puts them in their groups, the shares summing to one."""
    code = (
        f"import sys, json, time, torch; sys.path.insert(0, {BENCHMARKS!r}); import training_token_batches as t\n"
        "torch.manual_seed(0); layer = torch.nn.Linear(64, 32)\n"
        "optimizer = torch.optim.Adam(layer.parameters(), fused=True)\n"
        "x = torch.randn(16, 64)\n"
        "timer = t.OperatorTimes(); start = time.perf_counter()\n"
        "with timer:\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        y = layer(x)\n"
        "    y.float().square().sum().backward(); optimizer.step()\n"
        "wall = time.perf_counter() - start\n"
        "print(json.dumps([timer.seconds, wall, t.profile_shares(timer.seconds)]))"
    )
    seconds, wall, shares = printed_json(code)
    assert {"aten::_to_copy", "aten::addmm", "aten::mm", "aten::_fused_adam_"} <= set(seconds), sorted(seconds)
    assert "aten::copy_" not in seconds  # inside `_to_copy`: counted there, not twice
    assert all(value > 0 for value in seconds.values())
    assert sum(seconds.values()) <= wall
    assert shares["precision casts (bf16 <-> fp32)"] > 0 and shares["optimizer (fused Adam)"] > 0
    assert shares["matrix products (mm, addmm, bmm, oneDNN's linear)"] > 0
    assert abs(sum(shares.values()) - 1.0) < 1e-9


def test_the_median_run_of_two_is_the_slower_and_natural_rows_say_when_nothing_ended():
    """training_token_batches.py's "median of N runs" took the faster of two (the best, by default); and the natural
    rows of beam_search_speed.py, with random weights, had no output ending with </s> (every one ran to its length
    limit), which the benchmark now says under its table."""
    code = (
        f"import sys, json, torch; sys.path.insert(0, {BENCHMARKS!r}); import training_token_batches as t, "
        "beam_search_speed as b\n"
        "runs = {'k': [{'tok_s': 1300.0}, {'tok_s': 1000.0}]}\n"
        "three = {'k': [{'tok_s': 3.0}, {'tok_s': 1.0}, {'tok_s': 2.0}]}\n"
        "capped = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 9]]); ended = torch.tensor([[1, 5, 2, 0], [1, 8, 9, 9]])\n"
        "print(json.dumps([t.results_median(runs, 'k')['tok_s'], t.results_median(three, 'k')['tok_s'], "
        "b.natural_ends_line(capped, capped, 2, False), b.natural_ends_line(ended, capped, 2, True)]))"
    )
    two, three, none_ended, some_ended = printed_json(code)
    assert (two, three) == (1000.0, 2.0)
    assert "ours 0 of 2, MarianMTModel 0 of 2 - every output ran to its length limit" in none_ended
    assert "--model with --sources" in none_ended
    assert some_ended.endswith("ours 1 of 2, MarianMTModel 0 of 2")
