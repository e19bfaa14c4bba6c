"""A warm Python for the tests' child processes: one process (``serve``) imports torch and
pathlift once, and each command line sent to it runs in a fork of it.

A fresh process spends about 1.5 s of CPU importing torch before its first line runs, and
the tests start about a hundred: the docs' bash blocks run about 30 ``pathlift`` command
lines (tests/test_readme.py), the hostile-file and kernel-cache checks about 30 ``python
-c`` children, the Ctrl-C checks their command lines, the torchrun checks a launcher and
two ranks each (tests/test_distributed.py: the client is the ranks' program). Each runs
here in a fork that is set up as the command line's own process: its arguments,
environment, working folder, standard streams and resource limits (those of the client,
so a ``preexec_fn`` that sets ``ulimit -v`` applies to it), a fresh ``__main__``; its exit
status, or the signal that ended it, is the command line's. The client
(``client_script``) is a small executable without torch that stands where the command
would: ``.venv/bin/pathlift`` in a docs block, ``python()`` in place of ``sys.executable``
(``-c CODE``, ``-m MODULE`` or a script). SIGINT, SIGTERM and SIGHUP sent to the client
are passed on; a client that ends (a timeout's kill) takes its fork with it.

What a fork cannot show stays in fresh processes: which modules a command imports, start-up
time, a kill at a random moment, a closed standard stream. The console script itself runs
fresh in tests/test_install.py and tests/test_cli.py.

Only the standard library is imported here at module level: the client starts in
milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

#: what the command lines import, imported once: pathlift's command line imports them when a
#: command needs them, and torch some of its own on first use (measured: ``-X importtime``
#: of ``bounds``, ``metric`` on a pruned checkpoint, ``summary``)
PRELOAD = ("torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "typer._adapters",
           "pathlift.bounds", "pathlift.data", "pathlift.jobs",
           "pathlift.jobs.report.certificate", "pathlift.lift", "pathlift.models",
           "pathlift.prune", "pathlift.quant", "pathlift.summary", "pathlift.symmetry",
           "pathlift.train")
#: the limits a client passes on to its fork (``ulimit -v``, ``-t``, ``-d``, ``-f``)
LIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE")
_SIZE = struct.Struct("!Q")
_STATUS = struct.Struct("!i")


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm process closed the connection")
        data += chunk
    return data


def request(address: str, mode: str) -> int:
    """Run this process's command line (``sys.argv``: ``pathlift ARGS`` in mode "cli",
    ``python ARGS`` in mode "python") in a fork of the warm process at ``address``, with
    this process's environment, folder, standard streams and limits; SIGINT, SIGTERM and
    SIGHUP are passed on to it. Returns its exit status; a fork ended by a signal ends
    this process by the same signal."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        payload = json.dumps({
            "mode": mode, "argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
            "limits": {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS},
        }).encode()
        socket.send_fds(sock, [_SIZE.pack(len(payload))], [0, 1, 2])
        sock.sendall(payload)
        (pid,) = _STATUS.unpack(_read(sock, _STATUS.size))
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, lambda received, _: os.kill(pid, received))
        (status,) = _STATUS.unpack(_read(sock, _STATUS.size))
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two without a handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def client_script(address: str, mode: str = "cli") -> str:
    """The text of an executable that runs its command line by ``request``."""
    return (f"#!{sys.executable}\n"
            f'"""A command line run in a fork of the tests\' warm process (tests/'
            f'warm_process.py)."""\n'
            f"import sys\n\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from warm_process import request  # noqa: E402\n\n"
            f"sys.exit(request({address!r}, {mode!r}))\n")


def _standard_streams() -> None:
    """sys.stdin, stdout and stderr made anew on file descriptors 0, 1 and 2 as Python
    makes them at start-up (the server's were made on its own files), unbuffered under
    PYTHONUNBUFFERED (``python -u``)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for number, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        kept = getattr(sys, name)
        stream = io.TextIOWrapper(open(number, mode + "b", closefd=False),  # noqa: SIM115
                                  encoding=kept.encoding, errors=kept.errors,
                                  line_buffering=name == "stderr" or os.isatty(number),
                                  write_through=unbuffered and mode == "w")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reap(*_: object) -> None:
    """Wait for the per-connection forks that ended (waited for, their CPU time and their
    command's count in this process's children's, as ``time`` reports it)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _wait(pid: int, conn: socket.socket) -> int:
    """The wait status of ``pid``, killed first if the client at ``conn`` ends before it
    (a timeout's kill: the fork holds the client's streams, which its caller reads to
    their end)."""
    pidfd = os.pidfd_open(pid)
    ready, _, _ = select.select([conn, pidfd], [], [])
    if pidfd not in ready:  # the client sends nothing more: readable means it ended
        os.kill(pid, signal.SIGKILL)
    os.close(pidfd)
    return os.waitpid(pid, 0)[1]


def _accept(listener: socket.socket) -> dict:
    """Serve connections until the process that started this one ends; returns only in a
    fork that is to run a command line (its request), set up as that command line's
    process."""
    signal.signal(signal.SIGCHLD, _reap)
    parent = os.getppid()
    listener.settimeout(5)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the tests that started it were killed: end too
                os._exit(0)
            continue
        if os.fork():
            conn.close()
            continue
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this fork waits for its worker
        listener.close()
        header, fds, _, _ = socket.recv_fds(conn, _SIZE.size, 3)
        command = json.loads(_read(conn, _SIZE.unpack(header)[0]))
        pid = os.fork()
        if pid == 0:
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            for name, limits in command["limits"].items():
                resource.setrlimit(getattr(resource, name), tuple(limits))
            os.chdir(command["cwd"])
            os.environ.clear()
            os.environ.update(command["env"])
            _standard_streams()
            return command
        for fd in fds:
            os.close(fd)
        conn.sendall(_STATUS.pack(pid))
        status = _wait(pid, conn)
        with contextlib.suppress(OSError):  # the client ended
            conn.sendall(_STATUS.pack(status))
        os._exit(0)


def _run_python(argv: list[str]) -> None:
    """``python -c CODE ARGS``, ``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` in this
    process, as a fresh interpreter runs them: a new ``__main__``, ``sys.argv`` and
    ``sys.path[0]`` as Python sets them; an exception ends the process with a traceback
    and status 1."""
    import runpy
    import warnings

    if argv[0] not in ("-c", "-m"):
        sys.argv, sys.path[0] = argv, os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
        return
    option, target, *args = argv
    if option == "-m":
        sys.argv, sys.path[0] = [target, *args], os.getcwd()  # runpy puts the file first
        # a module this process imported (pathlift.cli) runs again as __main__, as in a
        # fresh interpreter, without runpy's warning that it was imported
        warnings.filterwarnings("ignore", f"'{target}' found in sys.modules", RuntimeWarning)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    main = types.ModuleType("__main__")
    sys.modules["__main__"], sys.argv, sys.path[0] = main, ["-c", *args], ""
    exec(compile(target, "<string>", "exec"), main.__dict__)


def serve(address: str) -> None:
    """Import pathlift's command line, listen at ``address`` (it appears once the imports
    are done), and run each command line that ``request`` sends in a fork, as the console
    script ("cli") or the interpreter ("python") would run it."""
    import importlib

    from pathlift.cli import main

    for name in PRELOAD:
        importlib.import_module(name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(address + ".binding")
        listener.listen(64)
        os.rename(address + ".binding", address)
        command = _accept(listener)
    if command["mode"] == "python":
        _run_python(command["argv"][1:])
        return
    sys.argv = command["argv"]
    sys.path[0] = str(Path(sys.executable).parent)  # as for the console script
    sys.exit(main())


class WarmProcess:
    """A warm process started by this one, ended with every command line still running in
    it (``close``)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="pathlift-warm-")  # a socket: 107 bytes at most
        self.address = os.path.join(self.folder, "warm.sock")
        self._proc = subprocess.Popen([sys.executable, __file__, self.address],
                                      start_new_session=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.address):
            assert self._proc.poll() is None and time.monotonic() < deadline, \
                "the warm process did not start"
            time.sleep(0.05)
        self.python = os.path.join(self.folder, "python")
        Path(self.python).write_text(client_script(self.address, "python"))
        os.chmod(self.python, 0o755)

    def close(self) -> None:
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


_STARTED: list[WarmProcess] = []


def warm() -> WarmProcess:
    """This process's warm process, started on first use and ended at its exit."""
    if not _STARTED:
        _STARTED.append(WarmProcess())
        atexit.register(_STARTED[0].close)
    return _STARTED[0]


def python() -> str:
    """An executable that runs ``python ARGS`` (``-c CODE``, ``-m MODULE`` or ``SCRIPT``) in a
    fork of the warm process: in place of ``sys.executable`` for a child that needs a fresh
    ``__main__`` but not a fresh interpreter."""
    return warm().python


if __name__ == "__main__":
    serve(sys.argv[1])
