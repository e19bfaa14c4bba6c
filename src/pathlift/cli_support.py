"""Plumbing of the ``pathlift`` command shared by every subcommand; no torch imported here.

- ``run``: the console-script entry point around the Typer app. List options take their
  values as written (``--input-shape 3 224 224``, and the repeated form); a user's error
  (pathlift's typed errors, missing files, bad values, an exception raised in the user's
  own model or data code) prints one line on stderr and exits with status 2;
  ``pathlift --debug`` (or PATHLIFT_DEBUG=1) shows the traceback instead. Every message and
  warning is printed with its control characters escaped (text from a file may hold
  terminal escape sequences); on standard output, ``new_console`` reads no markup and
  ``shown`` escapes what a terminal would act on, line by line.
- Output folders default to ``runs/<command>-<timestamp>`` under the current directory.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import sys
import sysconfig
import traceback
import typing
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import pathlift
from pathlift.cli_domains import constrain
from pathlift.errors import PathliftError

# torch's C++ layer prints its warnings straight to stderr (a rank that lost another: a
# stack of C++ frames before the command's own one-line error); errors still show
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

__all__ = ["INTERRUPTED", "RUNS", "USAGE_EXIT", "default_out", "new_console", "new_out",
           "one_line", "output_folder", "printable", "progress_bar", "run", "shown",
           "spread_list_values", "version_callback", "working"]

#: where commands that write files make their default folder (``default_out``)
RUNS = Path("runs")

#: Exceptions that are the user's doing: one line and exit status 2 unless --debug.
USER_ERRORS = (PathliftError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
               PermissionError)
USAGE_EXIT = 2
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


#: each app's click tree with its domains (``constrain``) and the registrations it was built from
_TREES: weakref.WeakKeyDictionary[typer.Typer, tuple[tuple[int, int], Any]] = \
    weakref.WeakKeyDictionary()


def _click_tree(app: typer.Typer) -> Any:
    """The click command tree of ``app`` with its domains, built on the first command line
    that a process runs (25-40 ms of signatures read) and reused by the next ones (a test
    suite or a notebook running several), again when a command has been registered."""
    registered = (len(app.registered_commands), len(app.registered_groups))
    built = _TREES.get(app)
    if built is None or built[0] != registered:
        built = _TREES[app] = (registered, constrain(typer.main.get_command(app)))
    return built[1]


def run(app: typer.Typer, args: Sequence[str] | None = None) -> None:
    """Run the command line ``args`` (default ``sys.argv[1:]``) and exit with its status.

    Usage errors and user errors print ``Error: ...`` on one line of stderr (exit status 2)
    unless --debug is given; --help and a missing command print the help (status 0 / 2).
    A standard output that is closed, full or a broken pipe is a user error too (nothing
    is computed when it is closed at the start), and so is an exception raised in the
    user's own code (``user_code_error``). Any other exception is a bug: one line saying
    so, exit status 1, the traceback with --debug. Messages and warnings are one line with
    control characters escaped (``printable``).
    """
    args = list(sys.argv[1:] if args is None else args)
    known = _loaded_files()  # what runs later from elsewhere is the user's code
    warnings.formatwarning = _one_line_warning
    if hasattr(sys.stdout, "reconfigure"):  # a path that is not UTF-8 prints as its bytes
        sys.stdout.reconfigure(errors="surrogateescape")
    command = _click_tree(app)
    debug = "--debug" in args or os.environ.get("PATHLIFT_DEBUG", "") not in ("", "0")
    if _closed(sys.stdout):
        typer.echo("Error: standard output is closed, so nothing could be printed; redirect "
                   "it to a file or /dev/null instead", err=True)
        sys.exit(USAGE_EXIT)
    try:
        code = command.main(spread_list_values(args, _list_options(command, args)),
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
        typer.echo(f"Error: {user_code_error(err, known) or one_line(err)}", err=True)
        sys.exit(USAGE_EXIT)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except SystemExit as err:  # the user's code ending the process (sys.exit, argparse)
        yours = None if debug else user_code_error(err, known)
        if yours is None:
            raise
        typer.echo(f"Error: {yours}", err=True)
        sys.exit(USAGE_EXIT)
    except OSError as err:
        if debug or not _output_failed(err):
            raise
        typer.echo(f"Error: cannot write to standard output ({err.strerror or err}); the "
                   "results were not printed", err=True)
        sys.exit(USAGE_EXIT)
    except Exception as err:
        if _interrupted(err):  # Ctrl-C inside an import, turned into its ImportError
            code = INTERRUPTED
        elif debug:
            raise
        else:
            _report(err, known)
    if code == INTERRUPTED:  # Typer's status for Ctrl-C, said on one line
        typer.echo("Interrupted (Ctrl-C): the files written so far are whole and kept "
                   "(prune --out DIR resumes from them when run again)", err=True)
    sys.exit(code if isinstance(code, int) else 0)


def _interrupted(err: BaseException) -> bool:
    """Whether ``err`` was raised while handling a Ctrl-C (a KeyboardInterrupt in its
    chain of causes): an import interrupted half-way leaves an ImportError behind."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _report(err: Exception, known: frozenset[str]) -> None:
    """Exit for an exception no handler above took: the user's own code's (status 2), or
    a bug (status 1), each on one line."""
    yours = user_code_error(err, known)
    if yours:
        typer.echo(f"Error: {yours}", err=True)
        sys.exit(USAGE_EXIT)
    typer.echo(f"Error: internal error, not your input ({type(err).__name__}: "
               f"{one_line(err)[:300]}); please report it with the command line "
               "(pathlift --debug ... shows where)", err=True)
    sys.exit(1)


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


def _list_options(group: Any, args: Sequence[str]) -> dict[str, type]:
    """Option string -> item type of every list option of the group and of the command
    ``args`` name (``--threads`` is a list in kron-bench, one number in kron-design)."""
    items: dict[str, type] = {}
    named = next((group.commands[a] for a in args if a in group.commands), None)
    for command in [group] + ([named] if named is not None else []):
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
    sentence), surrounding whitespace dropped, control characters escaped (``printable``)."""
    text = str(error)
    if isinstance(error, OSError) and error.filename is not None:
        text = f"{error.strerror}: '{error.filename}'"
    out = ""
    for line in (line.strip() for line in text.splitlines() if line.strip()):
        out += ("" if not out else " " if out[-1] in ".:;," else "; ") + line
    return printable(out)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (ESC, BEL, backspace, a
    carriage return, bidirectional overrides, a file name's undecodable bytes) written as
    its Python escape (``\\x1b``; an undecodable byte of a name, which ``os.fsdecode``
    holds as U+DC80-U+DCFF, as the byte: ``\\xff``): names and text from a file reach the
    terminal inert."""
    return "".join(c if c.isprintable() else
                   f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else
                   ascii(c)[1:-1] for c in text)


def shown(text: object) -> str:
    """``text`` for standard output: each line ``printable`` (the line breaks kept). The
    command's console reads no markup (``new_console``), so a name such as ``[red]x[/red]``
    or ``[bold`` prints as it is written."""
    return "\n".join(map(printable, str(text).split("\n")))


def progress_bar(console: Console, **options: Any) -> Progress:
    """rich's default progress bar on ``console`` (``options`` as ``Progress`` takes them),
    its description read as written: rich's own reads it as markup and emoji codes. A
    transient bar is off where the console is not a terminal: rich writes it there as an
    empty line, which left a refusal after it two lines long."""
    if options.get("transient") and not console.is_terminal:
        options["disable"] = True
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                    TaskProgressColumn(), TimeRemainingColumn(), console=console, **options)


def new_console(width: int | None = None) -> Console:
    """The command's console on standard output: no markup and no emoji codes read from
    the text it prints (names come from files and users), ``width`` columns (default: the
    terminal's, else ``COLUMNS``, else 80)."""
    return Console(markup=False, emoji=False, width=width)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    """``warnings.formatwarning`` of the command line: where, the category and the message
    on one line, escaped (a warning may quote a file's text)."""
    return f"{printable(filename)}:{lineno}: {category.__name__}: {one_line(str(message))}\n"


#: where the interpreter's and the installed packages' modules live
_LIBRARY_DIRS = tuple({os.path.realpath(sysconfig.get_path(key)) + os.sep
                       for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_PATHLIFT_DIR = os.path.dirname(os.path.realpath(pathlift.__file__)) + os.sep


def _loaded_files() -> frozenset[str]:
    """The source files of every module imported so far (pathlift, its libraries)."""
    return frozenset(_resolved(file) for module in list(sys.modules.values())
                     if isinstance(file := getattr(module, "__file__", None), str))


@functools.cache
def _resolved(file: str) -> str:
    """``os.path.realpath`` of an imported module's file, once per file: a process that runs
    many command lines (``cli_runner.invoke`` in the tests: 4,000 modules loaded, 0.17 s
    of ``lstat`` per command) resolves each module once."""
    return os.path.realpath(file)


def _is_users(file: str, known: Collection[str]) -> bool:
    """Whether ``file`` is the user's code: a Python file imported after the command
    started (a model or data callable it named), outside pathlift and the libraries."""
    path = os.path.realpath(file)
    return not _is_library(file) and path not in known and not path.startswith(_PATHLIFT_DIR)


def _is_library(file: str) -> bool:
    """Whether ``file`` is the interpreter's or an installed package's (torch, click), or
    has no file (<frozen importlib._bootstrap>, <string>)."""
    return file.startswith("<") or os.path.realpath(file).startswith(_LIBRARY_DIRS)


def user_code_error(err: BaseException, known: Collection[str]) -> str | None:
    """One line naming the file, line and exception when ``err`` was raised in the user's
    own code (the innermost frame outside the libraries is theirs; a SyntaxError in their
    file; a pathlift error caused by an exception their code raised itself), else None.
    ``known``: the files loaded before the command ran."""
    if isinstance(err, PathliftError):  # pathlift's words, unless it wraps the user's raise
        cause = err.__cause__
        raised = cause is not None and _frames(cause)[-1:]
        if not raised or not _is_users(raised[0][0], known):
            return None
        err = cause
    if isinstance(err, SyntaxError) and err.filename and _is_users(err.filename, known):
        where = f"{err.filename}:{err.lineno}"
        text = err.msg
    else:
        innermost = next((f for f in reversed(_frames(err)) if not _is_library(f[0])), None)
        if innermost is None or not _is_users(innermost[0], known):
            return None  # raised in pathlift (or code loaded before the command)
        where = f"{innermost[0]}:{innermost[1]}, in {innermost[2]}"
        text = f"{err.strerror}: '{err.filename}'" if isinstance(err, OSError) and \
            err.filename is not None else _ended(err) if isinstance(err, SystemExit) else \
            str(err)
    return one_line(f"your code raised {type(err).__name__} ({where}): {text or 'no message'};"
                    " fix it there (pathlift --debug ... shows the traceback)")


def _ended(err: SystemExit) -> str:
    """What a ``SystemExit`` from the user's code says: pathlift's call was cut short, so
    nothing was computed, whatever its status (``sys.exit(0)`` once exited 0, silent)."""
    return (f"it called sys.exit({err.code!r}), so nothing was computed; a model or data "
            "callable must return its result")


def _frames(err: BaseException) -> list[tuple[str, int | None, str]]:
    """(file, line, function) of each frame of ``err``'s traceback, outermost first."""
    return [(frame.f_code.co_filename, line, frame.f_code.co_name)
            for frame, line in traceback.walk_tb(err.__traceback__)]


def version_callback(show: bool) -> None:
    """``--version``: print pathlift's, torch's and Python's versions, then exit."""
    if not show:
        return
    import torch

    python = ".".join(map(str, sys.version_info[:3]))
    typer.echo(f"pathlift {pathlift.__version__} (torch {torch.__version__}, Python {python})")
    raise typer.Exit()


def default_out(command: str, made: list[Path] | None = None) -> Path:
    """A new folder ``runs/<command>-<YYYYmmdd-HHMMSS>[-n]`` under the current directory
    (never the source tree's committed results), created here; ``runs`` is appended to
    ``made`` when this call created it too."""
    stem = RUNS / f"{command}-{datetime.now():%Y%m%d-%H%M%S}"
    with contextlib.suppress(FileExistsError):
        RUNS.mkdir()
        if made is not None:
            made.append(RUNS)
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
def new_out(out: str | None, command: str) -> Iterator[str | Callable[[], Path]]:
    """``out`` as given, else a callable making a new ``default_out(command)`` folder (a
    command calls it once its input is checked, and removes that folder again when it
    fails before writing anything). On leaving the block, a ``runs`` folder that the
    callable created is removed again when it is empty (``rmdir``): a refused or
    interrupted run leaves no folder it made, never removes one that existed."""
    if out is not None:
        yield out
        return
    made: list[Path] = []
    try:
        yield lambda: default_out(command, made)
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()  # fails, and so removes nothing, unless the folder is empty


@contextmanager
def output_folder(out: str | None, command: str) -> Iterator[Path]:
    """``out``, else a new ``default_out(command)`` folder created now that is removed
    again when the block fails or is interrupted and the folder is still empty (and
    ``runs`` with it, as ``new_out``), so that a failed run leaves no empty
    ``runs/COMMAND-TIMESTAMP`` behind. A folder the user named, and one holding anything,
    is never removed."""
    with new_out(out, command) as target:
        if not callable(target):
            yield Path(target)
            return
        path = target()
        try:
            yield path
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise


@contextmanager
def working(console: Console, description: str) -> Iterator[Callable[[str], None]]:
    """A spinner with the elapsed time while a long step runs; yields a function that
    changes the description. Nothing is left on screen afterwards, and nothing at all is
    written when the console is not a terminal (a pipe, a log file)."""
    columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task(shown(description), total=None)
        yield lambda text: progress.update(task, description=shown(text))
