"""The warm process the tests run child command lines in (tests/warm_process.py) behaves as
the fresh process it stands for: arguments, folder, environment, standard streams, exit
status, a traceback on an error, ``ulimit`` limits from the caller, ``-m``, and a client
killed by a timeout takes its fork with it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warm_process

CODE = """
import os, resource, sys
print(sys.argv, os.getcwd(), os.environ["PROBE"], __name__, sys.path[0] == "",
      resource.getrlimit(resource.RLIMIT_AS)[0], sep="|")
print(sys.stdin.read().upper(), file=sys.stderr)
sys.exit(int(os.environ["STATUS"]))
"""


def _both(args: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, ...]:
    return tuple(subprocess.run([python, *args], capture_output=True, text=True, timeout=120,
                                **kwargs)
                 for python in (warm_process.python(), sys.executable))


@pytest.mark.parametrize("status", [0, 3])
def test_a_child_sees_what_a_fresh_one_sees(tmp_path: Path, status: int) -> None:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    warm, fresh = _both(["-c", CODE, "a b", "--c"], cwd=tmp_path, input="typed",
                        env=os.environ | {"PROBE": "seen", "STATUS": str(status)},
                        preexec_fn=limit)
    assert (warm.returncode, warm.stdout, warm.stderr) == \
        (fresh.returncode, fresh.stdout, fresh.stderr)
    assert warm.returncode == status
    assert warm.stdout.strip() == "|".join(
        [str(["-c", "a b", "--c"]), str(tmp_path), "seen", "__main__", "True", str(3 << 30)])
    assert warm.stderr == "TYPED\n"


def test_an_error_is_a_traceback_and_status_1_and_m_runs_a_module(tmp_path: Path) -> None:
    warm, fresh = _both(["-c", "import sys\nraise KeyError(sys.argv[1])", "nothing"])
    assert warm.returncode == fresh.returncode == 1
    assert warm.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == \
        "KeyError: 'nothing'"
    warm, fresh = _both(["-m", "json.tool"], input='{"a": [1]}')
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout) == \
        (0, '{\n    "a": [\n        1\n    ]\n}\n')


def test_a_client_killed_by_a_timeout_ends_its_fork(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    code = f"import time, pathlib\ntime.sleep(3)\npathlib.Path({str(marker)!r}).touch()"
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([warm_process.python(), "-c", code], capture_output=True, timeout=1)
    assert time.monotonic() - start < 2.5  # the streams closed with the fork, not at its end
    time.sleep(3)
    assert not marker.exists()


@pytest.mark.parametrize("number", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_ended_by_a_signal_ends_its_client_by_it(number: int) -> None:
    warm, fresh = _both(["-c", f"import os\nos.kill(os.getpid(), {int(number)})"])
    assert warm.returncode == fresh.returncode == -number


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_pythonunbuffered_makes_the_streams_write_through_as_in_python_u(unbuffered: str
                                                                          ) -> None:
    code = "import sys\nprint(sys.stdout.write_through, sys.stderr.write_through)"
    warm, fresh = _both(["-c", code], env=os.environ | {"PYTHONUNBUFFERED": unbuffered})
    assert warm.stdout == fresh.stdout == f"{bool(unbuffered)} {bool(unbuffered)}\n"
