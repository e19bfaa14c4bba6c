"""Issue 40, "misleading" (cosmetic): a transient progress bar (``kron-design``'s) wrote an
empty line to standard output where it is not a terminal (a pipe, a log, the tests), so a
refusal after it read as two lines. The bar is now off there; on a terminal rich erases it,
and the screen (replayed below from rich's cursor codes) shows no empty line either."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from cli_runner import invoke
from pathlift.cli_support import progress_bar


@pytest.mark.parametrize("args", [
    ["kron-design", "8", "8"],
    ["kron-design", "4", "8", "--budget", "0.3"],
    ["kron-design", "8", "8", "--factors", "3"],
])
def test_a_refusal_after_the_transient_bar_leaves_no_empty_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    errors = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith("Error: no chain of"), errors[0]
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and all(lines[:-1]), repr(result.stdout)  # no empty line
    assert [line.split(":")[0] for line in lines[:-1]] == ["estimate"]  # its one line


def _screen(stream: str) -> list[str]:
    """The lines a terminal shows after ``stream``: text written at the cursor, CR, LF (to
    the next line's start, as a tty's output translation does), cursor up (ESC[nA), erase
    line (ESC[2K); other escape codes (colours, cursor shown/hidden) move nothing."""
    rows, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", stream):
        if token in "\r\n":
            row, col = row + (token == "\n"), 0
            rows += [""] * (row + 1 - len(rows))
        elif token.endswith("A") and token.startswith("\x1b["):
            row -= int(token[2:-1] or 1)
        elif token == "\x1b[2K":
            rows[row] = ""
        elif not token.startswith("\x1b"):
            line = rows[row].ljust(col)
            rows[row], col = line[:col] + token + line[col + len(token):], col + len(token)
    return rows[:-1] if rows[-1] == "" else rows


@pytest.mark.parametrize("terminal", [False, True])
def test_the_transient_bar_leaves_only_what_was_printed(terminal):
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=80, markup=False, emoji=False)
    with progress_bar(console, transient=True) as progress:
        task = progress.add_task("calibrating", total=None)
        progress.console.print("estimate: 1 s", soft_wrap=True)
        progress.update(task, advance=1)
        progress.refresh()
    console.print("Error: refused")
    assert _screen(out.getvalue()) == ["estimate: 1 s", "Error: refused"], repr(out.getvalue())
