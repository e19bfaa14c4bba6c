"""Run ``pathlift`` command lines in the test process, through the console script's entry."""

from __future__ import annotations

from dataclasses import dataclass

from typer.testing import CliRunner

from pathlift import cli
from pathlift.cli import app
from pathlift.cli_support import new_console, run

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
    """Run the console script's entry (``cli_support.run``) on ``args`` in this process,
    its tables on a console 200 columns wide (a console made before, in the same process,
    may have fixed its width from another COLUMNS: rich reads it once when one is set)."""
    code = 0
    kept = cli.console
    with CliRunner().isolation(env=WIDE) as (out, err, _):
        cli.console = new_console(width=int(WIDE["COLUMNS"]))
        try:
            run(app, list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        finally:
            cli.console = kept
        return Result(code, out.getvalue().decode(), err.getvalue().decode())
