"""Plumbing of the ``pathlift`` command shared by every subcommand.

- List options take their values as written: ``--input-shape 3 224 224`` (and the
  repeated form ``--input-shape 3 --input-shape 224 ...``).
- Help reads like a well-kept CLI: no type on flags, ``MODEL`` in usage lines, paragraphs
  reflowed to the terminal.
- Errors that are the user's (pathlift's typed errors, missing files, bad values) print one
  line on stderr and exit with status 2; ``pathlift --debug`` shows the traceback instead.
- Output folders default to ``runs/<command>-<timestamp>`` under the current directory.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from pathlift.errors import PathliftError

__all__ = ["PathliftCommand", "PathliftGroup", "PathliftTyper", "UserError", "default_out",
           "spread_list_values", "version_callback", "working"]

#: Exceptions that are the user's doing: one line and exit status 2 unless --debug.
USER_ERRORS = (PathliftError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               PermissionError)
USAGE_EXIT = 2
LIST_HELP = ("Options typed <...>... ({}) take one or more values separated by spaces, up to "
             "the next option, as in --input-shape 3 224 224; repeating the option works too.")


class UserError(typer.TyperException):
    """A user's mistake, reported in one line with exit status 2."""

    exit_code = USAGE_EXIT


class _HelpStyle:
    """Help of a command or group: flags without a type, list options typed ``<int>...``,
    arguments by upper-case name, paragraphs reflowed to the terminal."""

    params: list[Any]
    callback: Callable[..., Any] | None
    help: str | None
    epilog: str | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hints = typing.get_type_hints(self.callback) if self.callback else {}
        self._list_items: dict[str, type] = {}
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.metavar = param.metavar or param.name.upper()
            elif isinstance(param, TyperOption) and param.is_flag:
                param.metavar = ""  # a flag takes no value: no <bool> type
            elif isinstance(param, TyperOption) and param.multiple:
                item = _list_item(hints[param.name])
                param.metavar = param.metavar or f"<{item.__name__}>..."
                self._list_items.update(dict.fromkeys(param.opts, item))
        self.help = _reflow(self.help)
        if self._list_items and not self.epilog:
            self.epilog = LIST_HELP.format(", ".join(self._list_items))

    def get_help_option(self, ctx: typer.Context) -> TyperOption | None:
        """The --help flag, shown without a type like every other flag."""
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class PathliftCommand(_HelpStyle, TyperCommand):
    """A typer command whose list options read every value up to the next option, and
    whose user errors end in one line (see the module docstring)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        """``[OPTIONS] MODEL [OTHER]``: arguments by name, optional ones in brackets."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument) and not param.hidden:
                name = param.metavar + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        """Parse after spreading ``--opt a b c`` into ``--opt a --opt b --opt c``."""
        return super().parse_args(ctx, spread_list_values(args, self._list_items))

    def invoke(self, ctx: typer.Context) -> Any:
        """Run the command; a user's error becomes one line and exit status 2."""
        try:
            return super().invoke(ctx)
        except USER_ERRORS as err:
            if ctx.find_root().params.get("debug"):
                raise
            raise UserError(_one_line(err)) from err


class PathliftGroup(_HelpStyle, TyperGroup):
    """The ``pathlift`` group: every error message on one line of stderr."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """Run the command line; usage errors and user errors print ``Error: ...`` only."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.TyperException as err:
            message = _one_line(err.format_message())
            context = getattr(err, "ctx", None)
            if message and context is not None:
                message += f" (see '{context.command_path} --help')"
            if message:  # empty: no_args_is_help has printed the help
                typer.echo(f"Error: {message}", err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class PathliftTyper(typer.Typer):
    """``typer.Typer`` whose commands are PathliftCommands and whose group is a PathliftGroup."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=PathliftGroup, **kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """``Typer.command`` with PathliftCommand as the default class."""
        return super().command(name, cls=cls or PathliftCommand, **kwargs)


def spread_list_values(args: Sequence[str], items: dict[str, type]) -> list[str]:
    """``--opt a b c`` -> ``--opt a --opt b --opt c`` for each list option in ``items``
    (option string -> item type). Values are read up to the next option, ``--``, or, for
    numeric items, the first word that is not a number (so a positional argument may follow
    ``--input-shape 3 32 32``)."""
    out: list[str] = []
    tokens = iter(args)
    current: str | None = None
    for token in tokens:
        if token == "--":
            out.append(token)
            out.extend(tokens)
            break
        if current is not None and _is_value(token, items[current]):
            out += [current, token]
            continue
        out.append(token)
        option, equals, _ = token.partition("=")
        current = option if option in items else None
        if current is not None and not equals:
            first = next(tokens, None)  # the option's own value, taken as click takes it
            if first is not None:
                out.append(first)
    return out


def _list_item(hint: Any) -> type:
    """``int`` for ``list[int]`` or ``list[int] | None``."""
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0]
    return next(_list_item(arg) for arg in typing.get_args(hint) if arg is not type(None))


def _is_value(token: str, item: type) -> bool:
    """Whether ``token`` continues a list option of ``item``s (a number may be negative)."""
    if item in (int, float):
        try:
            float(token)
        except ValueError:
            return False
        return True
    return not token.startswith("-")


def _one_line(error: BaseException | str) -> str:
    """A message on one line: its lines joined by '; ' (by a space after a line that ends a
    sentence), surrounding whitespace dropped."""
    text = str(error)
    if isinstance(error, OSError) and error.filename is not None:
        text = f"{error.strerror}: '{error.filename}'"
    out = ""
    for line in (line.strip() for line in text.splitlines() if line.strip()):
        out += ("" if not out else " " if out[-1] in ".:;," else "; ") + line
    return out


def _reflow(text: str | None) -> str | None:
    """Docstring help with the source line breaks removed inside each paragraph."""
    if text is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def version_callback(show: bool) -> None:
    """``--version``: print pathlift's, torch's and Python's versions, then exit."""
    if not show:
        return
    import torch

    import pathlift

    python = ".".join(map(str, sys.version_info[:3]))
    typer.echo(f"pathlift {pathlift.__version__} (torch {torch.__version__}, Python {python})")
    raise typer.Exit()


def default_out(command: str) -> Path:
    """A new folder ``runs/<command>-<YYYYmmdd-HHMMSS>[-n]`` under the current directory
    (never the source tree's committed results), created here."""
    stem = Path("runs") / f"{command}-{datetime.now():%Y%m%d-%H%M%S}"
    path, n = stem, 1
    while True:
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            n += 1
            path = stem.with_name(f"{stem.name}-{n}")
            continue
        return path


@contextmanager
def working(console: Console, description: str) -> Iterator[Callable[[str], None]]:
    """A spinner with the elapsed time while a long step runs; yields a function that
    changes the description. Nothing is left on screen afterwards, and nothing at all is
    written when the console is not a terminal (a pipe, a log file)."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=None)
        yield lambda text: progress.update(task, description=text)
