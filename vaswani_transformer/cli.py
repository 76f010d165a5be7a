"""Shared command-line behaviour: options are spelled in full (no prefix abbreviations) and an unknown option or
recipe key gets a "did you mean" from the valid names."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence


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


__all__ = ["ArgumentParser", "did_you_mean", "long_options", "unknown_arguments_message"]
