"""Shared test fixtures: small models and a Python process in which `vaswani_transformer` cannot be imported."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))

# Prepended to code run by `python_without_package`: the package is made unimportable even when it is
# pip-installed (editable or not), so only `trust_remote_code` can bring the model in.
_HIDE_PACKAGE = textwrap.dedent(
    """
    import sys
    class _HidePackage:
        def find_spec(self, name, path=None, target=None):
            if name == "vaswani_transformer" or name.startswith("vaswani_transformer."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
    sys.meta_path.insert(0, _HidePackage())
    sys.path = [p for p in sys.path if p not in ("", ".")]
    try:
        import vaswani_transformer
    except ImportError:
        pass
    else:
        raise SystemExit("vaswani_transformer is importable: the test would not prove anything")
    """
)


@pytest.fixture
def python_without_package(tmp_path):
    """Run Python code in a fresh process that can import transformers but not vaswani_transformer."""

    def run(code: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"))
        result = subprocess.run(
            [sys.executable, "-c", _HIDE_PACKAGE + textwrap.dedent(code)],
            cwd=cwd or tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        return result

    return run
