"""Reading and writing text lines, the one place: UTF-8, errors named by file and line, BOM, line breaks.

- A line is its text without the line break (`\\n`, `\\r\\n`); empty lines stay, as "".
- A UTF-8 byte order mark opening a file (or stdin) is not text: it is dropped.
- Invalid UTF-8 is a `TextFileError` (a ValueError) naming the file and line: `train.de:3: invalid UTF-8 (...)`.
- Any readable path that is not a directory is a text file, pipes included (`<(cat f)`, `/dev/stdin`): read once,
  in order. A standard stream without a byte layer (`redirect_stdout(io.StringIO())`, Jupyter) is read and written
  as text, by the same line rules.
- Writing puts one text per line: line breaks inside a text become spaces (`one_line`), so line N of the output
  always belongs to line N of the input.
- Streaming: `LineWriter` writes lines as they are done (each call one write of whole lines, then a flush), and
  `drop_partial_line` removes what a killed run may leave after the last line break, so that a file holds only
  complete lines and `--resume` can continue it.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any


PathLike = str | os.PathLike
STDIN_NAME = "<stdin>"
_BOM = "\ufeff"


class TextFileError(ValueError):
    """Unreadable text input; the message names the file and line."""


class DirectoryNotFileError(IsADirectoryError, FileNotFoundError):
    """A directory given where a text file must be; also a FileNotFoundError, which callers report for bad paths."""


def is_stdio(path: PathLike | None) -> bool:
    """True for None and "-", the command-line spellings of stdin/stdout."""
    return path is None or os.fspath(path) == "-"


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook`: a key given twice in one object is a ValueError naming it (json keeps the
    last one without a word)."""
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"{', '.join(map(repr, twice))} given twice; keep one.")
    return dict(pairs)


def decode_line(raw: bytes | str, name: PathLike, line_number: int) -> str:
    """One line of UTF-8 bytes (or text, from a text-only stream) as text without its one line break (LF, CR LF, or
    a CR ending the file) and without a BOM opening line 1; a CR before the break is text ("x" CR CR LF is "x" CR)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        text = text[:-1] if text.endswith("\n") else text
        text = text[:-1] if text.endswith("\r") else text
    except UnicodeDecodeError as err:
        raise TextFileError(f"{name}:{line_number}: invalid UTF-8 ({err.reason} at byte {err.start}).") from None
    return text[1:] if line_number == 1 and text.startswith(_BOM) else text


def iter_lines(path: PathLike | None) -> Iterator[str]:
    """The lines of a UTF-8 text file (or pipe), read lazily; None or "-" reads stdin."""
    if is_stdio(path):
        # bytes where stdin has them (UTF-8 whatever the locale); a text-only stream (io.StringIO, Jupyter) as text
        for number, raw in enumerate(getattr(sys.stdin, "buffer", sys.stdin), start=1):
            yield decode_line(raw, STDIN_NAME, number)
        return
    if os.path.isdir(path):
        raise DirectoryNotFileError(f"{path} is a directory, not a text file.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file.")
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield decode_line(raw, path, number)


def iter_text_files(paths: Sequence[PathLike]) -> Iterator[str]:
    """The lines of several UTF-8 text files, one file after the other."""
    for path in paths:
        yield from iter_lines(path)


def read_lines(path: PathLike | None) -> tuple[list[str], str]:
    """(lines, name) of a UTF-8 text file, or of stdin when `path` is None or "-" (name "<stdin>")."""
    return list(iter_lines(path)), STDIN_NAME if is_stdio(path) else os.fspath(path)


def count_lines(path: PathLike) -> int:
    """Number of lines of a text file (a final line without newline counts), read in binary chunks."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def is_regular_file(path: PathLike | None) -> bool:
    """True for a regular file (not stdin, a pipe or a device): one that can be counted first and read again."""
    return not is_stdio(path) and os.path.isfile(path)


def _stat(path: PathLike | None, stream) -> os.stat_result | None:
    """os.stat of `path`, or of `stream` (stdin, stdout) for None or "-"; None where there is none to take."""
    try:
        return os.fstat(stream.fileno()) if is_stdio(path) else os.stat(path)
    except (OSError, AttributeError, ValueError):  # a missing file, a closed stream, one without a file descriptor
        return None


def is_same_file(input_path: PathLike | None, output_path: PathLike | None) -> bool:
    """True when writing `output_path` would overwrite the regular file read as `input_path`: the same path, a link
    to it, or stdin/stdout ("-") redirected from/to it (a terminal or pipe read and written is no such clash)."""
    read, written = _stat(input_path, sys.stdin), _stat(output_path, sys.stdout)
    if read is None or written is None:
        return (not is_stdio(input_path) and not is_stdio(output_path)
                and os.path.realpath(input_path) == os.path.realpath(output_path))  # fmt: skip
    return os.path.samestat(read, written) and stat.S_ISREG(read.st_mode)


def one_line(text: str) -> str:
    """`text` with its line breaks (\\r\\n, \\n, \\r) turned into spaces, so that it stays one line."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


class LineWriter:
    """Writes texts one per line (`one_line`, UTF-8) to a file (parents created; `append=True` continues it) or to
    stdout (None or "-"), as they come: each `write` is one write of whole lines followed by a flush, so what was
    written is on disk (or in the pipe) even if the process dies right after. `lines`: how many this writer wrote.
    A stdout without a byte layer (`redirect_stdout(io.StringIO())`, Jupyter) gets the text itself."""

    def __init__(self, path: PathLike | None = None, append: bool = False):
        self.path, self.lines, self._text = path, 0, False
        if is_stdio(path):
            sys.stdout.flush()
            self._text = not hasattr(sys.stdout, "buffer")
            self._file, self._close = sys.stdout if self._text else sys.stdout.buffer, False
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file, self._close = open(path, "ab" if append else "wb"), True

    def write(self, texts: Iterable[str]) -> int:
        """Write `texts` as lines and flush; returns how many."""
        texts = [one_line(text) for text in texts]
        if texts:
            data = "".join(text + "\n" for text in texts)
            self._file.write(data if self._text else data.encode("utf-8"))
            self._file.flush()
            self.lines += len(texts)
        return len(texts)

    def close(self) -> None:
        if self._close:
            self._file.close()
        else:
            self._file.flush()

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_lines(lines: Iterable[str], path: PathLike | None = None) -> int:
    """Write one text per line (`one_line`), UTF-8 whatever the locale, to a file (parents created) or to stdout
    when `path` is None or "-"; returns the number of lines written."""
    with LineWriter(path) as writer:
        return writer.write(lines)


def drop_partial_line(path: PathLike) -> int:
    """Cut a file back to its last line break (what a process killed in the middle of a write can leave behind
    is a last line without one); returns the number of bytes removed."""
    size = os.path.getsize(path)
    with open(path, "rb+") as f:
        end = size
        while end > 0:  # look backwards for the last b"\n", a block at a time
            start = max(0, end - (1 << 16))
            f.seek(start)
            block = f.read(end - start)
            if start + len(block) == size and block.endswith(b"\n"):
                return 0
            if (cut := block.rfind(b"\n")) >= 0:
                end = start + cut + 1
                break
            end = start
        f.truncate(end)
    return size - end


__all__ = [
    "DirectoryNotFileError",
    "LineWriter",
    "TextFileError",
    "count_lines",
    "decode_line",
    "drop_partial_line",
    "is_regular_file",
    "is_same_file",
    "is_stdio",
    "iter_lines",
    "iter_text_files",
    "one_line",
    "read_lines",
    "write_lines",
]
