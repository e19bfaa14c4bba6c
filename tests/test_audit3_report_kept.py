"""Issue 40, "a report that finished into the same folder (exit 0, 11 files) is wiped" by a
``prune`` into that folder that fails or is interrupted: a REAL ``pathlift report`` (the
digits, one epoch: every page and figure) is written once, then each test runs a ``prune``
into a copy of its folder that is interrupted (Ctrl-C, SIGTERM), refused over the time
limit after opening the folder, or refused without ``--overwrite``; every file of the
report is still there byte for byte, and nothing of the prune is left beside them."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from cli_runner import invoke
from pathlift.jobs.report.run import REPORT_FILES
from test_audit3_interrupt import _after_estimate, _interrupt, _start, _stopped_in_one_line

PRUNE = ["prune", "--model", "mlp", "--data", "digits", "--seeds", "1", "--amount", "0.5",
         "--method", "magnitude-global", "--epochs", "60"]


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_report(tmp_path_factory):
    """The folder of a report that finished (exit 0), and its files' bytes."""
    folder = tmp_path_factory.mktemp("report") / "r"
    result = invoke("report", "--model", "mlp", "--data", "digits", "--epochs", "1",
                    "--out", str(folder))
    assert result.exit_code == 0, result.output
    files = _snapshot(folder)
    assert {"report.md", "report.html", "report.json"} <= set(files) <= set(REPORT_FILES)
    assert len(files) >= 9, sorted(files)  # the pages and the figures of a trained model
    return folder, files


@pytest.fixture()
def report_folder(finished_report, tmp_path):
    folder, files = finished_report
    copy = tmp_path / "r"
    shutil.copytree(folder, copy)
    return copy, files


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_prune_interrupted_into_a_finished_report_keeps_every_file_of_it(signum,
                                                                           report_folder):
    folder, files = report_folder
    process = _start([*PRUNE, "--out", str(folder)], folder.parent)
    _after_estimate(process)  # the run folder is open: its manifest written
    if signum == signal.SIGINT:
        _stopped_in_one_line(process, *_interrupt(process))
    else:
        start = time.monotonic()
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 143 and "Traceback" not in err, err
        assert time.monotonic() - start < 30
    assert _snapshot(folder) == files  # the report byte for byte, no manifest or dense/


def test_a_prune_refused_after_opening_a_finished_report_keeps_every_file_of_it(
        report_folder):
    folder, files = report_folder
    result = invoke("--max-time", "1e-6", *PRUNE, "--out", str(folder))
    assert result.exit_code == 2 and "more than the time limit" in result.stderr, result.output
    assert "estimate: 1 dense training(s)" in result.stdout
    assert _snapshot(folder) == files


def test_a_second_report_or_a_prune_over_a_plot_is_refused_without_overwrite(report_folder):
    folder, files = report_folder
    again = invoke("report", "--model", "mlp", "--input-shape", "64", "--out", str(folder))
    assert again.exit_code == 2 and "--overwrite" in again.stderr, again.output
    assert len(again.stderr.strip().splitlines()) == 1
    assert _snapshot(folder) == files
    (folder / "summary.png").write_bytes(b"the user's own plot")
    files = _snapshot(folder)
    result = invoke(*PRUNE, "--out", str(folder))
    assert result.exit_code == 2 and "--overwrite" in result.stderr, result.output
    assert "estimate:" not in result.stdout  # refused before any training
    assert _snapshot(folder) == files
