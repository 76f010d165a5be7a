"""The harness of tests/test_transformers_common.py when transformers' test sources cannot be downloaded.

Outside CI the module is skipped with the reason; in CI (`CI=true`) it fails, so a broken download is never green.
Both are real pytest runs in subprocesses with an empty cache folder and pip kept off any package index.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def run_common_tests_without_download(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(VASWANI_TRANSFORMERS_TESTS_CACHE=str(tmp_path / "empty-cache"), PIP_NO_INDEX="1")
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
               str(TESTS / "test_transformers_common.py")]  # fmt: skip
    return subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_unavailable_suites_skip_with_the_reason_outside_ci(tmp_path):
    result = run_common_tests_without_download(tmp_path, ci=None)
    # Exit status 5 is pytest's "no tests collected": the only module given was skipped whole.
    assert result.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "common test suites are unavailable" in result.stdout, result.stdout
    assert "pip download" in result.stdout  # the reason says what failed


@pytest.mark.slow
def test_unavailable_suites_fail_in_ci(tmp_path):
    result = run_common_tests_without_download(tmp_path, ci="true")
    assert result.returncode != 0, result.stdout
    assert "SuiteUnavailable" in result.stdout and "1 error" in result.stdout, result.stdout
