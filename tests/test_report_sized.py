"""Issue 40, "work sized before it starts", for ``pathlift report``: one ``estimate:`` line
before any training, work over the time limit (``--max-time``, ``PATHLIFT_MAX_TIME``, else
one hour) or copies over the memory limit refused in one line with status 2 before any
training, and Ctrl-C inside its training ends it within about a second, the user's files
kept and no report file written."""

from __future__ import annotations

import pytest

from cli_runner import invoke
from pathlift.data import load_data
from pathlift.jobs.report import measure
from pathlift.models import load_model
from test_audit3_interrupt import (
    USER,
    _after_estimate,
    _interrupt,
    _start,
    _stopped_in_one_line,
    _user_files,
)

SMALL = ["report", "--model", "mlp", "--data", "digits", "--epochs", "3"]


def _never(*args, **kwargs):
    raise AssertionError("training started: the estimate should have refused it before")


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize(("args", "env", "flag"), [
    (["--max-time", "0.001", *SMALL], {}, "--max-time"),
    (SMALL, {"PATHLIFT_MAX_TIME": "1e-6"}, "PATHLIFT_MAX_TIME"),
    (["report", "--model", "mlp", "--data", "digits", "--epochs", "100000000"], {},
     "--max-time"),  # > 1 hour: the default limit
    (["--max-memory", "300K", *SMALL], {}, "--max-memory"),  # a pass fits, 5 copies not
], ids=["max-time", "env", "default-hour", "max-memory"])
def test_report_over_a_limit_is_refused_in_one_line_before_any_training(args, env, flag,
                                                                          monkeypatch, tmp_path):
    monkeypatch.setattr(measure, "_train", _never)
    monkeypatch.setattr(measure, "certified_network", _never)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    user = _user_files(out)
    result = invoke(*args, "--out", str(out))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert flag in lines[0] and "Traceback" not in result.output, lines[0]
    assert ", ," not in lines[0]  # once "a smaller --model or --data, , or raise"
    assert ("more than the time limit" if flag != "--max-memory" else
            "the report's copies of the model") in lines[0]
    assert _files(out) == sorted(USER)  # nothing of the report written
    assert all(path.read_bytes() == data for path, data in user.items())


@pytest.mark.serial  # two wall-clock times compared: alone, not beside the parallel run
def test_report_states_its_estimate_first_and_it_bounds_the_time_taken():
    """The estimate line is the first line out, and it is a lower bound: the report's
    measuring (``Report.seconds``, timed by the report itself) takes at least as long."""
    lines: list[str] = []
    split = load_data("digits")
    model, shape = load_model("mlp", None, None, data_shape=split.input_shape)
    estimate = measure.report_estimate(model, shape, split, 2, 64)
    assert estimate.at_least and estimate.seconds > 0
    assert f"2 epoch(s) of training and 223 of the certified network (mlp-small), on " \
        f"{len(split.train):,} samples" in estimate.line()
    report, _ = measure.measure_report(model, shape, split, epochs=2, on_estimate=lines.append)
    assert len(lines) == 1 and lines[0].startswith("estimate: 2 epoch(s) of training")
    assert estimate.seconds <= report.seconds, (estimate, report.seconds)


def test_report_without_data_states_its_passes(tmp_path):
    result = invoke("report", "--model", "mlp", "--input-shape", "64", "--out",
                    str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("estimate: no training, 3 path-norm passes over 17,226 weights, "
                            "at least "), first


def test_ctrl_c_inside_report_training_stops_within_a_second_keeping_the_users_files(
        tmp_path):
    out = tmp_path / "out"
    user = _user_files(out)
    process = _start([*SMALL[:-1], "300", "--out", str(out)], tmp_path)
    _after_estimate(process)
    seconds, err = _interrupt(process)
    _stopped_in_one_line(process, seconds, err)
    assert _files(out) == sorted(USER)  # no report file beside them
    assert all(path.read_bytes() == data for path, data in user.items())
