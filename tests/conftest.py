"""Test configuration: under CI (CI=true) hypothesis runs a fixed, reproducible set of
examples, so a green or red CI does not depend on the draw."""

import os
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import settings

import cpu_torchvision  # noqa: F401  (before anything imports torchvision)

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# A suite started in the background of a shell script (`nohup make test &`) inherits SIGINT
# ignored, and so would every command line a test starts, which Python then leaves ignored:
# the Ctrl-C tests would see their child finish or time out. Ignored here means a handler
# again, so the children start with SIGINT at its default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One intra-op thread for the whole run: the suite is many small ops, where a second
# thread costs more in synchronisation than it gains (several times slower on 2 cores).
# The processes the tests start (command lines, kernel builds, the docs' bash blocks) too,
# unless the caller chose: beside the other xdist worker, a child's second OpenMP thread
# spins at every barrier (ResNet-18's `pathlift normalize`: 4.5 s of CPU with one
# thread, 13 s with two at load 7).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _process_limits_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command line run in the test process (``pathlift --max-memory 10M ...`` through
    cli_runner.invoke) sets pathlift's process-wide memory and time limits, as it should
    in its own process: each test gets them back as they were, so no limit leaks into
    the tests that run after it in the same worker."""
    import pathlift.memory

    monkeypatch.setattr(pathlift.memory, "_limit", pathlift.memory._limit)
    monkeypatch.setattr(pathlift.memory, "_time_limit", pathlift.memory._time_limit)


_KRON_CACHE = pytest.StashKey[Path]()


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin made its factory
def pytest_configure(config: pytest.Config) -> None:
    """``PATHLIFT_CACHE_DIR``, the Kronecker kernel and measurement cache, set for the
    whole run before collection (the Kronecker tests' vector widths come from the kernel
    this machine builds) to a folder of the run's temporary one, never the user's
    ~/.cache/pathlift: the xdist workers share it (beside their own folders), so each
    kernel is built once a run, not once a worker (6 of 14 builds were the other worker's
    again). The cache's writes are atomic and its libraries named by their digest, as for
    a user's concurrent processes."""
    base = config._tmp_path_factory.getbasetemp()  # pytest's own, as xdist uses it
    folder = (base.parent if hasattr(config, "workerinput") else base) / "pathlift-cache"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.environ["PATHLIFT_CACHE_DIR"] = str(folder)
    config.stash[_KRON_CACHE] = folder


@pytest.fixture(scope="session")
def kron_cache_dir(pytestconfig: pytest.Config) -> Path:
    """The Kronecker kernel and measurement cache of the run (``pytest_configure``), which
    ``kron_fixtures.isolated_kron_cache`` sets again for the tests that change the
    environment."""
    return pytestconfig.stash[_KRON_CACHE]
