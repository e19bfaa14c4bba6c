"""Plumbing of the ``pathlift`` command shared by every subcommand; no torch imported here.

- ``run``: the console-script entry point around the Typer app. List options take their
  values as written (``--input-shape 3 224 224``, and the repeated form); a user's error
  (pathlift's typed errors, missing files, bad values) prints one line on stderr and exits
  with status 2; ``pathlift --debug`` (or PATHLIFT_DEBUG=1) shows the traceback instead.
- Output folders default to ``runs/<command>-<timestamp>`` under the current directory.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
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

import pathlift
from pathlift.errors import PathliftError

# torch's C++ layer prints its warnings straight to stderr (a rank that lost another: a
# stack of C++ frames before the command's own one-line error); errors still show
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

__all__ = ["USAGE_EXIT", "default_out", "one_line", "run", "spread_list_values",
           "version_callback", "working"]

#: Exceptions that are the user's doing: one line and exit status 2 unless --debug.
USER_ERRORS = (PathliftError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               PermissionError)
USAGE_EXIT = 2


def run(app: typer.Typer, args: Sequence[str] | None = None) -> None:
    """Run the command line ``args`` (default ``sys.argv[1:]``) and exit with its status.

    Usage errors and user errors print ``Error: ...`` on one line of stderr (exit status 2)
    unless --debug is given; --help and a missing command print the help (status 0 / 2).
    A standard output that is closed, full or a broken pipe is a user error too (nothing
    is computed when it is closed at the start). Any other exception is a bug: one line
    saying so, exit status 1, the traceback with --debug.
    """
    args = list(sys.argv[1:] if args is None else args)
    if hasattr(sys.stdout, "reconfigure"):  # a path that is not UTF-8 prints as its bytes
        sys.stdout.reconfigure(errors="surrogateescape")
    command = typer.main.get_command(app)
    debug = "--debug" in args or os.environ.get("PATHLIFT_DEBUG", "") not in ("", "0")
    if _closed(sys.stdout):
        typer.echo("Error: standard output is closed, so nothing could be printed; redirect "
                   "it to a file or /dev/null instead", err=True)
        sys.exit(USAGE_EXIT)
    try:
        code = command.main(spread_list_values(args, _list_options(command)),
                            prog_name="pathlift", standalone_mode=False)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
    except typer.TyperException as err:  # click's usage errors: bad option, bad value
        message = one_line(err.format_message())
        context = getattr(err, "ctx", None)
        if message and context is not None:
            message += f" (see '{context.command_path} --help')"
        if message:  # empty: no_args_is_help has printed the help
            typer.echo(f"Error: {message}", err=True)
        sys.exit(getattr(err, "exit_code", USAGE_EXIT))
    except USER_ERRORS as err:
        if debug:
            raise
        typer.echo(f"Error: {one_line(err)}", err=True)
        sys.exit(USAGE_EXIT)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except OSError as err:
        if debug or not _output_failed(err):
            raise
        typer.echo(f"Error: cannot write to standard output ({err.strerror or err}); the "
                   "results were not printed", err=True)
        sys.exit(USAGE_EXIT)
    except Exception as err:
        if debug:
            raise
        typer.echo(f"Error: internal error, not your input ({type(err).__name__}: "
                   f"{one_line(err)[:300]}); please report it with the command line "
                   "(pathlift --debug ... shows where)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _closed(stream: typing.TextIO | None) -> bool:
    """Whether ``stream`` is gone (Python sets sys.stdout to None when descriptor 1 was
    closed before it started) or its descriptor is no longer open."""
    if stream is None:
        return True
    try:
        os.fstat(stream.fileno())
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False  # not a file descriptor: a test's buffer
    except OSError:
        return True
    return False


#: what writing to a full disk, a closed pipe or a failing device raises; pathlift's own
#: files raise FileSystemError naming the path, so such an error without a file name is
#: the standard output's
_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EFBIG)


def _output_failed(err: OSError) -> bool:
    """Whether ``err`` is standard output failing; if so it is pointed at /dev/null, so that
    the interpreter's own flush at exit prints no second error."""
    if err.errno not in _OUTPUT_ERRNOS or err.filename is not None:
        return False
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    return True


def _list_options(group: Any) -> dict[str, type]:
    """Option string -> item type of every list option of every command (and the group)."""
    items: dict[str, type] = {}
    for command in [group, *group.commands.values()]:
        hints = typing.get_type_hints(command.callback) if command.callback else {}
        for param in command.params:
            if getattr(param, "multiple", False):
                items.update(dict.fromkeys(param.opts, _list_item(hints[param.name])))
    return items


def _list_item(hint: Any) -> type:
    """``int`` for ``list[int]`` or ``list[int] | None``."""
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0]
    return next(_list_item(arg) for arg in typing.get_args(hint) if arg is not type(None))


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


def _is_value(token: str, item: type) -> bool:
    """Whether ``token`` continues a list option of ``item``s (a number may be negative)."""
    if item in (int, float):
        try:
            float(token)
        except ValueError:
            return False
        return True
    return not token.startswith("-")


def one_line(error: BaseException | str) -> str:
    """A message on one line: its lines joined by '; ' (by a space after a line that ends a
    sentence), surrounding whitespace dropped."""
    text = str(error)
    if isinstance(error, OSError) and error.filename is not None:
        text = f"{error.strerror}: '{error.filename}'"
    out = ""
    for line in (line.strip() for line in text.splitlines() if line.strip()):
        out += ("" if not out else " " if out[-1] in ".:;," else "; ") + line
    return out


def version_callback(show: bool) -> None:
    """``--version``: print pathlift's, torch's and Python's versions, then exit."""
    if not show:
        return
    import torch

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
