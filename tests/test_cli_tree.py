"""The click tree of a Typer app is built once per process and reused by the next command
lines run in it (``cli_support._click_tree``): each run still checks its options' domains
and sees every command, also one registered after the first run."""

from __future__ import annotations

import typer

from cli_runner import invoke
from pathlift.cli import app
from pathlift.cli_support import _click_tree, run


def test_the_tree_is_reused_and_still_checks_domains() -> None:
    tree = _click_tree(app)
    assert _click_tree(app) is tree
    for _ in range(2):  # a domain refusal and a run, twice on the same tree
        refused = invoke("norm", "mlp", "-q", "-1")
        assert refused.exit_code == 2 and "-q" in refused.stderr, refused.output
        assert invoke("norm", "mlp", "-q", "1").exit_code == 0
    assert _click_tree(app) is tree


def test_a_command_registered_later_is_found(capsys) -> None:
    own = typer.Typer()

    @own.command()
    def first() -> None:
        print("first ran")

    @own.command()
    def second() -> None:
        print("second ran")

    for name in ("first", "second"):
        try:
            run(own, [name])
        except SystemExit as done:
            assert done.code in (0, None)
    before = _click_tree(own)

    @own.command()
    def third() -> None:
        print("third ran")

    try:
        run(own, ["third"])
    except SystemExit as done:
        assert done.code in (0, None)
    assert _click_tree(own) is not before
    assert capsys.readouterr().out.split() == ["first", "ran", "second", "ran", "third", "ran"]
