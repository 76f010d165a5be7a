"""textio, the one reader and writer of text lines: UTF-8 errors named by file and line, BOM, line breaks."""

import subprocess
import sys

import pytest

from vaswani_transformer.data import ParallelDataError, load_parallel_dataset
from vaswani_transformer.evaluation import read_segments
from vaswani_transformer.textio import (
    TextFileError,
    count_lines,
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
