"""A Ctrl-C that lands inside an import can surface as the ImportError of a later import
(the module was left half-initialised) raised while the KeyboardInterrupt unwinds: the
command line still says "Interrupted (Ctrl-C)" and exits 130, not "internal error"
(CI once met it: frontier interrupted while MNIST-1D's package was being imported)."""

from __future__ import annotations

import pytest
import typer

from pathlift.cli_support import INTERRUPTED, run

app = typer.Typer()


@app.command()
def load(chained: bool = True) -> None:
    try:
        raise KeyboardInterrupt
    finally:
        if chained:  # an import in a clean-up, raised while the interrupt unwinds
            raise ImportError("cannot import name 'x' from partially initialized module")


@app.command()
def other() -> None:
    raise ImportError("a bug of ours")


def test_an_import_error_raised_by_a_ctrl_c_is_an_interruption(capsys):
    with pytest.raises(SystemExit) as done:
        run(app, ["load"])
    assert done.value.code == INTERRUPTED
    err = capsys.readouterr().err
    assert err.startswith("Interrupted (Ctrl-C)") and err.count("\n") == 1


def test_an_import_error_of_its_own_stays_a_bug(capsys):
    with pytest.raises(SystemExit) as done:
        run(app, ["other"])
    assert done.value.code == 1
    assert "internal error" in capsys.readouterr().err
