"""Run ``pathlift`` command lines in the test process, through the console script's entry."""

from __future__ import annotations

from dataclasses import dataclass

from typer.testing import CliRunner

from pathlift.cli import app
from pathlift.cli_support import run

WIDE = {"COLUMNS": "200"}


@dataclass(frozen=True)
class Result:
    """What one ``pathlift`` command line did."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(*args: str) -> Result:
    """Run the console script's entry (``cli_support.run``) on ``args`` in this process."""
    code = 0
    with CliRunner().isolation(env=WIDE) as (out, err, _):
        try:
            run(app, list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        return Result(code, out.getvalue().decode(), err.getvalue().decode())
