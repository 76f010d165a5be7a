"""Shared test fixtures: small models and a Python process in which `vaswani_transformer` cannot be imported."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

# Under pytest-xdist (the README's `-n 2`) each worker copies remote code and `evaluate` metrics into its own modules
# cache, so two workers never write the same file at once. Set before transformers is imported: it reads it then.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix=f"hf_modules_{os.environ['PYTEST_XDIST_WORKER']}_")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

from vaswani_transformer.hub import HIDE_PACKAGE_CODE  # noqa: E402

torch.set_num_threads(1)  # tests use one thread: two busy cores slow each other down far more than 2x


@pytest.fixture
def python_without_package(tmp_path):
    """Run Python code in a fresh process that can import transformers but not vaswani_transformer."""

    def run(code: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"))
        result = subprocess.run(
            [sys.executable, "-c", HIDE_PACKAGE_CODE + textwrap.dedent(code)],
            cwd=cwd or tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        return result

    return run
