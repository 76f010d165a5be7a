"""The benchmarks' own measuring helpers (benchmarks/device.py), where a wrong figure would go unnoticed."""

import json
import os
import subprocess
import sys

import pytest


BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS from /proc: Linux")
def test_a_child_process_reports_its_own_peak_rss_not_its_parents():
    """Each benchmark setting runs in a child process so that its peak RSS is its own. getrusage's ru_maxrss is not:
    Linux carries the parent's peak into a child started with fork/vfork and exec. A parent holding 1.5 GiB more than
    the child ever touches: the child's reported peak stays far below it."""
    ballast = bytearray(b"\x01") * (1536 * 2**20)  # written, so resident
    code = (f"import sys, json, torch; sys.path.insert(0, {BENCHMARKS!r}); import device; "
            "print(json.dumps([device.peak_memory_mib(torch.device('cpu')), device.peak_rss_mib()]))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cpu_peak, rss_peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert cpu_peak == rss_peak
    assert 10 < rss_peak < 1024, rss_peak  # torch imported: a few hundred MiB, not the parent's 1.5 GiB and more
    assert ballast[-1] == 1
