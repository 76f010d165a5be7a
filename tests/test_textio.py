"""textio, the one reader and writer of text lines: UTF-8 errors named by file and line, BOM, line breaks."""

import contextlib
import io
import os
import subprocess
import sys

import pytest

from vaswani_transformer.data import ParallelDataError, load_parallel_dataset
from vaswani_transformer.evaluation import read_segments
from vaswani_transformer.textio import (
    LineWriter,
    TextFileError,
    count_lines,
    drop_partial_line,
    is_same_file,
    iter_text_files,
    one_line,
    read_lines,
    write_lines,
)


BOM = "\ufeff".encode("utf-8")  # b"\xef\xbb\xbf"


def test_lines_keep_their_text_and_lose_only_the_line_break(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("first\n\n  Grüße \r\n\tlast without newline".encode("utf-8"))
    assert read_lines(path) == (["first", "", "  Grüße ", "\tlast without newline"], str(path))
    assert count_lines(path) == 4
    (tmp_path / "two.txt").write_bytes(b"a\nb\n")
    assert list(iter_text_files([path, tmp_path / "two.txt"]))[-3:] == ["\tlast without newline", "a", "b"]


def test_invalid_utf8_and_missing_files_are_named(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok\nok\n\xff\xfe broken\n")
    with pytest.raises(TextFileError, match=r"in\.txt:3: invalid UTF-8 \(invalid start byte at byte 0\)"):
        read_lines(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.txt: no such file"):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(ParallelDataError, match=r"train\.de:2: invalid UTF-8"):  # the same rule, data's error class
        (tmp_path / "train.en").write_bytes(b"a\nb\n")
        (tmp_path / "train.de").write_bytes(b"a\n\xc3\x28\n")
        load_parallel_dataset(train_file=str(tmp_path / "train"), source_lang="en", target_lang="de")


def test_a_byte_order_mark_opening_a_file_is_not_text(tmp_path):
    # Editors on Windows write UTF-8 with a BOM; it must not become part of the first sentence.
    path = tmp_path / "bom.txt"
    path.write_bytes(BOM + "Grüße\n".encode("utf-8") + BOM + b"x\n")
    assert read_lines(path)[0] == ["Grüße", "\ufeffx"]  # only the file's first bytes are a BOM
    (tmp_path / "ref.de").write_bytes(BOM + b"Ein Mann.\n")
    assert read_segments(tmp_path / "ref.de") == ["Ein Mann."]
    (tmp_path / "train.en").write_bytes(BOM + b"a b\n")
    (tmp_path / "train.de").write_bytes(BOM + b"c d\n")
    data = load_parallel_dataset(train_file=str(tmp_path / "train"), source_lang="en", target_lang="de")
    assert data["train"][0]["translation"] == {"en": "a b", "de": "c d"}
    done = subprocess.run(
        [sys.executable, "-c", "from vaswani_transformer.textio import read_lines; print(repr(read_lines('-')))"],
        input=BOM + b"eins\nzwei", capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == repr((["eins", "zwei"], "<stdin>"))


def test_writing_keeps_one_text_per_line(tmp_path):
    assert one_line("a\nb\r\nc\rd") == "a b c d"
    path = tmp_path / "out" / "hyp.txt"
    assert write_lines(["x\ny", "", "Grüße\r\n"], path) == 3
    assert path.read_bytes() == "x y\n\nGrüße \n".encode("utf-8")
    assert read_lines(path)[0] == ["x y", "", "Grüße "]


def test_a_directory_is_named_as_one(tmp_path):
    with pytest.raises(IsADirectoryError, match=r"is a directory, not a text file") as error:
        read_lines(tmp_path)
    assert isinstance(error.value, FileNotFoundError)  # the CLIs report bad paths by catching FileNotFoundError


def test_line_writer_appends_whole_lines_and_a_partial_last_line_is_cut(tmp_path):
    path = tmp_path / "sub" / "hyp.txt"
    with LineWriter(path) as writer:
        assert writer.write(["a\nb", ""]) == 2
        assert path.read_bytes() == b"a b\n\n"  # flushed at once, before the writer is closed
        writer.write(["Grüße"])
    assert writer.lines == 3
    with LineWriter(path, append=True) as writer:
        writer.write(["d"])
    assert path.read_bytes() == "a b\n\nGrüße\nd\n".encode("utf-8")
    assert drop_partial_line(path) == 0 and count_lines(path) == 4
    # a process killed in the middle of a write leaves a last line without its line break
    with open(path, "ab") as f:
        f.write("half a li".encode("utf-8"))
    assert drop_partial_line(path) == len("half a li")
    assert path.read_bytes() == "a b\n\nGrüße\nd\n".encode("utf-8")
    big = tmp_path / "big.txt"  # the last line break lies more than one block (64 KiB) back
    big.write_bytes(b"x\n" + b"y" * 200_000)
    assert drop_partial_line(big) == 200_000 and big.read_bytes() == b"x\n"
    big.write_bytes(b"z" * 70_000)
    assert drop_partial_line(big) == 70_000 and big.read_bytes() == b""


def test_standard_streams_without_a_byte_layer_keep_the_line_rules(monkeypatch):
    # redirect_stdout(io.StringIO()), a StringIO stdin, Jupyter: no .buffer; the same lines as through bytes
    monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeffeins\r\n\n Grüße \u2028x\nletzte"))
    assert read_lines("-") == (["eins", "", " Grüße \u2028x", "letzte"], "<stdin>")
    written = io.StringIO()
    with contextlib.redirect_stdout(written):
        assert write_lines(["a\nb", "", "Grüße\r\n"]) == 3
        with LineWriter("-") as writer:
            writer.write(["c"])
    assert written.getvalue() == "a b\n\nGrüße \nc\n"


def test_an_output_is_the_input_when_it_is_the_same_regular_file(tmp_path, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("a\n", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(source)
    os.link(source, tmp_path / "hard.txt")
    for output in (source, tmp_path / "link.txt", tmp_path / "hard.txt", tmp_path / "x" / ".." / "in.txt"):
        assert is_same_file(source, output) and is_same_file(output, source)
    assert not is_same_file(source, tmp_path / "other.txt") and not is_same_file(source, "-")
    assert not is_same_file(os.devnull, os.devnull)  # a device (a terminal, /dev/stdin to /dev/stdout) is no clash
    with open(source, "rb") as stdin:  # `... --output in.txt < in.txt`
        monkeypatch.setattr(sys, "stdin", stdin)
        assert is_same_file("-", source) and not is_same_file("-", tmp_path / "other.txt")


def test_only_one_line_break_is_removed_a_carriage_return_before_it_is_text(tmp_path):
    path = tmp_path / "cr.txt"
    path.write_bytes(b"a\r\r\nb\r\n\r\nc\n\rd\r")
    assert read_lines(path)[0] == ["a\r", "b", "", "c", "\rd"]
