"""Issue 40, "stops at Ctrl-C within a second, leaving a resumable state where the command
resumes", to the end: a real SIGINT to a ``prune`` process inside seed 1's dense training
(seed 0's network saved), then the same command again, which trains only what is left
and finishes: status 0, every run's row, seed 0's network as it was, the user's files
byte for byte. (tests/test_audit3_interrupt.py checks the stop itself in the default
selection; this one runs the resumed protocol through, so it is slow.)"""

from __future__ import annotations

import pytest

from test_audit3_interrupt import (
    PRUNE,
    _after_seed0_dense,
    _interrupt,
    _start,
    _stopped_in_one_line,
    _user_files,
)


@pytest.mark.slow  # about 30 s on a quiet 2-core machine
def test_a_prune_stopped_by_ctrl_c_resumes_and_finishes(tmp_path):
    out = tmp_path / "out"
    user = _user_files(out)
    args = [*PRUNE, "--epochs", "40", "--out", str(out)]
    process = _start(args, tmp_path)
    dense = _after_seed0_dense(process, out)
    seconds, err = _interrupt(process)
    _stopped_in_one_line(process, seconds, err)
    saved = dense.read_bytes()
    assert not (out / "runs.csv").exists() or \
        len((out / "runs.csv").read_text().splitlines()) < 1 + 4
    again = _start(args, tmp_path)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr
    assert stdout.startswith("estimate: ") and " dense training(s) and 4 run(s)" in stdout
    assert dense.read_bytes() == saved  # seed 0 not trained again
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 4  # header, every run
    assert (out / "summary.png").is_file()
    assert all(path.read_bytes() == data for path, data in user.items())
