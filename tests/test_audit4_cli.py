"""Issue 40, "misleading", variants the issue does not list: the user's own code ending the
process. A model factory or data callable calling ``sys.exit(0)`` made pathlift exit 0
having computed nothing, silent; ``raise SystemExit("config missing")`` printed only
"config missing", status 1; a factory parsing its own arguments with argparse (a training
script's habit) printed argparse's usage of *pathlift's* command line and status 2,
without a word from pathlift. Now each ends in pathlift's line naming the user's file,
line and function and saying nothing was computed, status 2 (argparse's own lines come
first: it prints them before it raises)."""

from __future__ import annotations

import pytest

from cli_runner import invoke

USER_CODE = """\
import argparse
import sys

from torch import nn


def quits():
    sys.exit(0)


def refuses():
    raise SystemExit("config missing")


def parses():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", required=True)
    parser.parse_args()
    return nn.Linear(2, 2)


for f in (quits, refuses, parses):
    f.input_shape = (2,)
"""


@pytest.mark.parametrize(("spec", "line", "says", "before"), [
    ("quits", 8, "sys.exit(0)", 0),
    ("refuses", 12, "sys.exit('config missing')", 0),
    ("parses", 18, "sys.exit(2)", 2),  # argparse's usage and error lines come first
])
@pytest.mark.parametrize("role", ["model", "data"])
def test_the_user_s_code_ending_the_process_is_one_line_naming_it(spec, line, says, before,
                                                                  role, tmp_path):
    path = tmp_path / f"userexit_{role}_{spec}.py"  # a fresh module for every case
    path.write_text(USER_CODE)
    result = invoke("norm", f"{path}:{spec}") if role == "model" else \
        invoke("bounds", "mlp", "--data", f"{path}:{spec}")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == before + 1, result.output
    assert lines[-1].startswith(f"Error: your code raised SystemExit ({path}:{line}, in {spec})"
                                f": it called {says}, so nothing was computed"), lines[-1]
    assert not result.stdout.strip()  # no table: nothing was computed


def test_pathlift_s_own_exit_status_is_kept(tmp_path):
    """pathlift's own exits (a usage error, --version) are not the user's code."""
    assert invoke("norm", "mlp", "-q", "0").exit_code == 2
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.startswith("pathlift ")
