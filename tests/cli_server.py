"""A warm ``pathlift`` for the docs' bash blocks (tests/test_readme.py).

A fresh ``pathlift`` process spends about 1.5 s of CPU importing torch before its command
starts, and the docs' blocks run about 30 command lines. Here one process (``serve``)
imports torch and pathlift once; every command line is a fork of it that runs the console
script's entry, ``pathlift.cli:main``, with the command line's arguments, environment,
working folder and standard streams, and its exit status (or the signal that ended it) is
the command line's. ``client_script`` is the executable that stands at ``.venv/bin/pathlift``
in a block's folder, so the blocks run as written, torchrun's ranks included; the console
script itself is run in fresh processes by tests/test_install.py and tests/test_cli.py.

Only the standard library is imported here at module level: the client starts in
milliseconds.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

#: what the command lines import, imported once: pathlift's command line imports them when a
#: command needs them, and torch some of its own on first use (measured: ``-X importtime``
#: of ``bounds``, ``metric`` on a pruned checkpoint, ``summary``)
PRELOAD = ("torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "typer._adapters",
           "pathlift.bounds", "pathlift.data", "pathlift.jobs",
           "pathlift.jobs.report.certificate", "pathlift.lift", "pathlift.models",
           "pathlift.prune", "pathlift.quant", "pathlift.summary", "pathlift.symmetry",
           "pathlift.train")
_SIZE = struct.Struct("!Q")
_STATUS = struct.Struct("!i")


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm pathlift process closed the connection")
        data += chunk
    return data


def request(address: str) -> int:
    """Run this process's command line (``sys.argv``) in a fork of the warm process at
    ``address``, with this process's environment, folder and standard streams; SIGINT,
    SIGTERM and SIGHUP are passed on to it. Returns its exit status; a fork ended by a
    signal ends this process by the same signal."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        payload = json.dumps({"argv": sys.argv, "env": dict(os.environ),
                              "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [_SIZE.pack(len(payload))], [0, 1, 2])
        sock.sendall(payload)
        (pid,) = _STATUS.unpack(_read(sock, _STATUS.size))
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, lambda received, _: os.kill(pid, received))
        (status,) = _STATUS.unpack(_read(sock, _STATUS.size))
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def client_script(address: str) -> str:
    """The text of an executable ``pathlift`` that runs its command line by ``request``."""
    return (f"#!{sys.executable}\n"
            f'"""pathlift, run in a fork of the tests\' warm process (tests/cli_server.py)."""\n'
            f"import sys\n\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from cli_server import request  # noqa: E402\n\n"
            f"sys.exit(request({address!r}))\n")


def _standard_streams() -> None:
    """sys.stdin, stdout and stderr made anew on file descriptors 0, 1 and 2 as Python
    makes them at start-up (the server's were made on its own files)."""
    for number, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        kept = getattr(sys, name)
        stream = io.TextIOWrapper(open(number, mode + "b", closefd=False),  # noqa: SIM115
                                  encoding=kept.encoding, errors=kept.errors,
                                  line_buffering=name == "stderr" or os.isatty(number))
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


def _accept(listener: socket.socket) -> None:
    """Serve connections until the process that started this one ends; returns only in a
    fork that is to run a command line, set up as that command line's process."""
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
            os.chdir(command["cwd"])
            os.environ.clear()
            os.environ.update(command["env"])
            sys.argv = command["argv"]
            _standard_streams()
            return
        for fd in fds:
            os.close(fd)
        conn.sendall(_STATUS.pack(pid))
        _, status = os.waitpid(pid, 0)
        conn.sendall(_STATUS.pack(status))
        os._exit(0)


def serve(address: str) -> None:
    """Import pathlift's command line, listen at ``address`` (it appears once the imports
    are done), and run each command line that ``request`` sends in a fork, as the console
    script would run it."""
    import importlib

    from pathlift.cli import main

    for name in PRELOAD:
        importlib.import_module(name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(address + ".binding")
        listener.listen(64)
        os.rename(address + ".binding", address)
        _accept(listener)
    sys.path[0] = str(Path(sys.executable).parent)  # as for the console script
    sys.exit(main())


if __name__ == "__main__":
    serve(sys.argv[1])
