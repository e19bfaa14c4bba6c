"""Atomic writes: the previous file survives a failing writer, OS errors are one line."""

import errno
import os

import pytest

from pathlift.files import FileSystemError, atomic_write, os_errors, write_json, write_text


def test_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    write_text(target, "one")
    write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.txt"]


def test_failing_writer_keeps_previous_file(tmp_path):
    target = tmp_path / "a.json"
    write_json(target, {"x": 1})

    def half(fh):
        fh.write(b"{\"x\": ")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FileSystemError, match=r"a\.json.*disk is full"):
        atomic_write(target, half)
    assert target.read_text() == '{\n "x": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_os_error_is_one_line_naming_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FileSystemError) as info:
        write_text(blocker / "inside.txt", "y")
    message = str(info.value)
    assert "\n" not in message and str(blocker) in message and "not a folder" in message
    with pytest.raises(FileSystemError, match="read-only"), os_errors(tmp_path / "z"):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
