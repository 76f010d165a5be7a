"""Shared command-line behaviour: options are spelled in full (no prefix abbreviations), an unknown option or
recipe key gets a "did you mean" from the valid names, an output path that cannot be written is named before any
work (`output_path_problem`), and numbers out of range are argparse errors (`positive_int`, `fraction`)."""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def did_you_mean(name: str, valid: Iterable[str], aliases: dict[str, str] | None = None, quote: bool = False) -> str:
    """``"did you mean a or b?"`` for the names of ``valid`` closest to ``name`` (each alias reported as the name
    ``aliases`` maps it to), or ``""`` when none is close."""
    aliases = aliases or {}
    matches = difflib.get_close_matches(name, sorted(set(valid) | set(aliases)), n=6)
    names = list(dict.fromkeys(aliases.get(m, m) for m in matches))[:3]
    names = [repr(n) if quote else n for n in names]
    return f"did you mean {' or '.join(names)}?" if names else ""


def long_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every ``--option`` spelling ``parser`` accepts -> its canonical spelling (the first one of its argument)."""
    options = {}
    for action in parser._actions:
        spellings = [s for s in action.option_strings if s.startswith("--")]
        options.update({s: spellings[0] for s in spellings})
    return options


def unknown_arguments_message(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """One message for the arguments ``parser`` left over: each unknown option with its closest valid spellings."""
    options = long_options(parser)
    parts = []
    for arg in extras:
        if not arg.startswith("-"):
            continue  # the value of an unknown option, or a stray positional (listed below)
        flag = arg.split("=", 1)[0]
        hint = did_you_mean(flag, options.values(), aliases=options)
        parts.append(f"unknown option {flag}" + (f" ({hint})" if hint else ""))
    if not parts:
        return f"unrecognized arguments: {' '.join(extras)}"
    return "; ".join(parts) + ". Run with --help for the valid options."


def output_path_problem(path: str | os.PathLike, option: str, directory: bool = False) -> str | None:
    """Why ``path``, the value of ``option``, cannot be written (as a folder when ``directory``), or None: a file
    where a folder must be (the path or one of its parents), a folder where a file must be, or a folder that is not
    writable. Checked before any work, so that a run does not end on it."""
    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            return f"{option} {path} is a file, not a folder."
        if not directory and path.is_dir():
            return f"{option} {path} is a folder, not a file."
        if not os.access(path if directory else path.parent, os.W_OK | os.X_OK):
            return f"{option} {path} is not writable (permission denied)."
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{option} {path}: {parent} is a file, not a folder."
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create it in {parent} (permission denied)."
    return None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a bad value is an argparse error, exit 2, before any work)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (0.3 for 30%; nan and inf are refused like any value outside)."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without prefix abbreviations (``--max_step`` is not ``--max_steps``) whose unknown
    options get a "did you mean" instead of the bare "unrecognized arguments"."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_arguments_message(self, extras))
        return namespace


__all__ = [
    "ArgumentParser",
    "did_you_mean",
    "fraction",
    "long_options",
    "output_path_problem",
    "positive_int",
    "unknown_arguments_message",
]
