"""Issue 40, "pathlift removes only what it created": a command refused or interrupted
after making its default folder ``runs/COMMAND-TIME`` removes that folder and the ``runs``
folder it made for it (``cli_support.new_out``), never a ``runs`` folder that was there
before, empty or holding another run."""

from __future__ import annotations

import pytest

from cli_runner import invoke
from pathlift.jobs.prune import experiment

REFUSED = {
    "prune over the time limit": ("--max-time", "1e-6", "prune", "--model", "mlp", "--seeds",
                                  "1", "--amount", "0.5", "--method", "magnitude-global",
                                  "--epochs", "3"),
    "report over the time limit": ("--max-time", "1e-9", "report", "--model", "mlp",
                                   "--input-shape", "64"),
    "kron-design over the time limit": ("--max-time", "1e-9", "kron-design", "64", "64"),
}


@pytest.mark.parametrize("args", REFUSED.values(), ids=REFUSED)
def test_a_refused_run_removes_the_runs_folder_it_made(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2 and "more than the time limit" in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []  # neither runs/COMMAND-TIME nor runs


@pytest.mark.parametrize("args", REFUSED.values(), ids=REFUSED)
def test_a_refused_run_keeps_a_runs_folder_that_existed(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert invoke(*args).exit_code == 2
    assert (tmp_path / "runs").is_dir() and list((tmp_path / "runs").iterdir()) == []
    (tmp_path / "runs" / "prune-old").mkdir()
    (tmp_path / "runs" / "prune-old" / "runs.csv").write_bytes(b"another run's rows\n")
    assert invoke(*args).exit_code == 2
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["prune-old"]
    assert (tmp_path / "runs" / "prune-old" / "runs.csv").read_bytes() == b"another run's rows\n"


def test_an_interrupted_prune_removes_the_runs_folder_it_made(tmp_path, monkeypatch):
    """Ctrl-C once the run folder is open (the protocol starting): status 130, no folder."""
    def interrupted(*args, folder, **kwargs):
        with folder:  # as the protocol holds it
            folder.open({"settings": 1})
            assert (folder.path / "manifest.json").is_file()
            raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiment, "prune_rewind_retrain", interrupted)
    result = invoke("prune", "--model", "mlp", "--seeds", "1", "--epochs", "3")
    assert result.exit_code == 130, result.output
    assert list(tmp_path.iterdir()) == []
