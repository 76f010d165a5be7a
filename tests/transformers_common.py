"""transformers' own common model tests, fetched for the installed transformers version and importable here.

`load_common_test_suites()` downloads the source distribution of the installed transformers release (it ships the
top-level `tests/*.py`; never committed here), extracts `tests/test_modeling_common.py` and
`tests/test_configuration_common.py` into a cache folder outside git, and imports them as the package
`transformers_common_tests`. The three sibling modules they import but the distribution lacks get minimal stand-ins of
our own (not copies):

- `generation.test_utils.GenerationTesterMixin`: an empty mixin. `ModelTesterMixin` only checks that a tester of a
  generating model inherits it; the generation behaviours are tested in tests/test_generation.py and
  tests/test_modeling.py (paper beam search, greedy with and without cache, static cache compiled with fullgraph).
- `exporters.test_export.ExportTesterMixin`: an empty base class (no `torch.export` tests).
- `utils.test_configuration_utils.config_common_kwargs`: non-default values for every field of `PreTrainedConfig`
  that `ConfigTester.check_config_arguments_init` checks a model config passes through.

The cache folder is `$VASWANI_TRANSFORMERS_TESTS_CACHE` or `~/.cache/vaswani-transformer/transformers-tests`.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from pathlib import Path

import pytest
import transformers

PACKAGE = "transformers_common_tests"
SUITE_FILES = ("test_modeling_common.py", "test_configuration_common.py")


class SuiteUnavailable(RuntimeError):
    """transformers' test sources could not be downloaded or extracted for the installed version."""


def cache_folder(version: str = transformers.__version__) -> Path:
    root = os.environ.get("VASWANI_TRANSFORMERS_TESTS_CACHE")
    root = Path(root) if root else Path.home() / ".cache" / "vaswani-transformer" / "transformers-tests"
    return root / version / PACKAGE


def fetch_suite_sources(version: str = transformers.__version__) -> Path:
    """The folder holding the two suite files of transformers `version`, downloading its sdist when not cached."""
    folder = cache_folder(version)
    if all((folder / name).is_file() for name in SUITE_FILES):
        return folder
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--no-input",
                   "--disable-pip-version-check", f"transformers=={version}", "-d", download]  # fmt: skip
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SuiteUnavailable(f"`{' '.join(command)}` failed: {error}") from error
        archives = sorted(Path(download).glob(f"transformers-{version}.tar.gz"))
        if result.returncode != 0 or not archives:
            raise SuiteUnavailable(
                f"`{' '.join(command)}` gave no source distribution (exit {result.returncode}): "
                f"{result.stderr.strip()[-2000:]}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[0]) as archive:
            for name in SUITE_FILES:
                try:
                    member = archive.extractfile(f"transformers-{version}/tests/{name}")
                except KeyError as error:
                    raise SuiteUnavailable(f"{archives[0].name} has no tests/{name}") from error
                partial = folder / f".{name}.partial"
                partial.write_bytes(member.read())
                partial.replace(folder / name)  # whole files only: an interrupted run leaves no half file behind
    # `test_configuration_common` imports transformers from its own folder's __init__.py: an empty one.
    (folder / "__init__.py").touch()
    return folder


def _stand_in(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


class GenerationTesterMixin:
    """Stand-in for transformers' `tests/generation/test_utils.py` mixin (not in the sdist): no tests of its own."""


class ExportTesterMixin:
    """Stand-in for transformers' `tests/exporters/test_export.py` mixin (not in the sdist): no tests of its own."""


# Non-default values for the fields of `PreTrainedConfig` (transformers 5.x), as `check_config_arguments_init` needs.
CONFIG_COMMON_KWARGS = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["SomeModel"],
    "id2label": {0: "label"},
    "label2id": {"label": 0},
    "problem_type": "regression",
}


def load_common_test_suites() -> types.SimpleNamespace:
    """`ModelTesterMixin`, `ConfigTester`, `ids_tensor` and the `GenerationTesterMixin` stand-in, ready to use."""
    folder = fetch_suite_sources()
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
        for sub in ("generation", "exporters", "utils"):
            _stand_in(f"{PACKAGE}.{sub}", __path__=[])
        _stand_in(f"{PACKAGE}.generation.test_utils", GenerationTesterMixin=GenerationTesterMixin)
        _stand_in(f"{PACKAGE}.exporters.test_export", ExportTesterMixin=ExportTesterMixin)
        _stand_in(f"{PACKAGE}.utils.test_configuration_utils", config_common_kwargs=CONFIG_COMMON_KWARGS)
    with warnings.catch_warnings():
        # Marks of transformers' own pytest configuration (flash_attn_test, torch_compile_test...), unknown here.
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
        configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return types.SimpleNamespace(
        ModelTesterMixin=modeling.ModelTesterMixin,
        ids_tensor=modeling.ids_tensor,
        ConfigTester=configuration.ConfigTester,
        GenerationTesterMixin=GenerationTesterMixin,
    )
