"""torch.distributed on CPU with gloo: ``torchrun --nproc_per_node 2`` running ``pathlift
prune`` (DDP and spread runs), and the collectives of ``pathlift.distributed``."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

import warm_process
from pathlift import distributed
from pathlift.cli import app
from pathlift.data import load_digits, loaders
from pathlift.data.training import evaluate
from pathlift.distributed import ddp, exit_process, fingerprint, launched, shard
from pathlift.errors import DistributedError
from pathlift.graph import copy_model, unwrap
from pathlift.graph.boundary import prune_masks
from pathlift.jobs.prune import Method, Phase, PruneConfig, RunFolder, prune_rewind_retrain
from pathlift.models import mlp
from pathlift.symmetry import random_rescale
from pathlift.track import PathNormTracker

# torchrun groups of its own: `make test` runs it alone, after the parallel run
pytestmark = pytest.mark.serial

#: where ``_launch`` puts the warm process's python (tests/warm_process.py): torchrun's
#: launcher and each rank (``--no-python``: the client is the rank's program) run in forks
#: of one process that imported torch and pathlift, each still a process of its own and the
#: launcher's child, as torchrun's ``python -u`` (PYTHONUNBUFFERED) would run it, without 2 s
#: of imports each (about 30 s of the serial run's CPU)
WARM = "<the warm python>"
TORCHRUN = [WARM, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--no-python", WARM]
PRUNE = ["prune", "--model", "mlp", "--epochs", "2", "--rewind-epoch", "1", "--amount", "0.8",
         "--method", "path-magnitude-global", "--method", "magnitude-layerwise"]


def _launch(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """Run a command (``WARM``: the warm process's python) in its own session; on a
    timeout kill it with its children. The processes import the pathlift under test (a
    relative PYTHONPATH made absolute)."""
    path = os.pathsep.join(str(Path(p).resolve()) for p in
                           os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    args = [warm_process.python() if arg == WARM else arg for arg in args]
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_torchrun_two_gloo_processes_prune_digits(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, log = _launch([*TORCHRUN, "-m", "pathlift.cli", *PRUNE, "--seeds", "1",
                       "--out", str(out)], tmp_path)
    assert rc == 0, log
    assert [p.relative_to(out) for p in out.rglob("*.csv")] == [Path("runs.csv")]
    text = (out / "runs.csv").read_text()
    rows = _rows(out / "runs.csv")
    assert text.count("seed,method") == 1 and len(rows) == 4  # each run written once
    assert log.count("wrote ") == 1  # rank 0 alone reports
    assert {(r["world_size"], r["spread"]) for r in rows} == {("2", "data")}
    # Every rank checked (all-reduced hash) that it held the masks whose digest rank 0
    # wrote; here the same masks are made again by one process from the trained weights.
    dense = RunFolder(out).load_dense(0)
    trained = mlp()
    trained.load_state_dict(dense.trained)
    config = PruneConfig()
    for r in rows:
        net = random_rescale(trained, config.rescale_factors, 0, (1, 8, 8)) \
            if r["rescaled"] == "True" else copy_model(trained)
        Method.named(r["method"]).prune(net, (1, 8, 8), 0.8, config.last_layer_factor)
        assert fingerprint(prune_masks(net))[:16] == r["mask_digest"]
    # the dense accuracy reported is that of the saved trained weights on the test split
    _, test = loaders(load_digits(), batch_size=64, seed=0)
    assert float(rows[0]["dense_accuracy"]) == pytest.approx(evaluate(trained, test), abs=1e-6)
    assert dense.accuracy > 0.2


def test_spread_runs_agree_with_one_process(tmp_path: Path) -> None:
    rc, log = _launch([*TORCHRUN, "-m", "pathlift.cli", *PRUNE, "--seeds", "2", "--spread",
                       "runs", "--out", str(tmp_path / "two")], tmp_path)
    assert rc == 0, log
    single = CliRunner().invoke(app, [*PRUNE, "--seeds", "2", "--out", str(tmp_path / "one")])
    assert single.exit_code == 0, single.output
    two, one = _rows(tmp_path / "two" / "runs.csv"), _rows(tmp_path / "one" / "runs.csv")
    assert len(two) == len(one) == 8
    for a, b in zip(two, one, strict=True):
        assert (a["world_size"], a["spread"], b["world_size"]) == ("2", "runs", "1")
        for field in a.keys() - {"world_size", "spread"}:
            assert a[field] == b[field], field  # one thread per process: the same floats


FROZEN = """
import os, time
from pathlift.models import mlp

def build():
    if os.environ["RANK"] == "1":
        time.sleep(300)  # frozen: never joins rank 0's first collective
    return mlp()
"""


def test_a_frozen_rank_ends_the_run_after_the_timeout_option(tmp_path: Path) -> None:
    (tmp_path / "frozen.py").write_text(FROZEN)
    start = time.monotonic()
    rc, log = _launch([*TORCHRUN, "-m", "pathlift.cli", "--timeout", "2", "prune", "--model",
                       "frozen.py:build", "--epochs", "2", "--rewind-epoch", "1", "--amount",
                       "0.8", "--seeds", "1", "--out", str(tmp_path / "out")], tmp_path)
    assert rc != 0 and time.monotonic() - start < 120, log  # not the 300 s of the sleep
    assert "Error: rank 0: the other ranks did not answer within 2 s" in log, log
    assert "pathlift --timeout SECONDS" in log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drifting_train(model: torch.nn.Module, epochs: int, phase: Phase) -> None:
    """Steps the plain module on rank-dependent data, bypassing DDP's gradient averaging."""
    net = unwrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in phase.epochs(epochs):
        opt.zero_grad()
        x = torch.full((4, 1, 8, 8), float(phase.world.rank))
        net(x).sum().backward()
        opt.step()


def _worker(rank: int, port: int, out: str) -> None:
    """One of two ranks: what the collectives return, and that a mismatch raises."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    report: dict = {}
    try:
        with launched(timeout=timedelta(seconds=60)) as world:
            report["world"] = [world.rank, world.size]
            report["same"] = world.check_identical("weights", {"w": torch.arange(4.0)})
            report["gather"] = world.gather(rank * 10)
            report["broadcast"] = world.broadcast(f"from {rank}")
            data = DataLoader(TensorDataset(torch.arange(10)), batch_size=3, shuffle=True)
            report["shard"] = [int(i) for (b,) in shard(data, world, seed=0) for i in b]
            report["tracked"] = PathNormTracker((1, 8, 8), sparsity=False)(mlp()) is not None
            try:
                world.check_identical("masks", {"w": torch.full((3,), float(rank))})
            except DistributedError as err:
                report["mismatch"] = str(err)
            try:  # a loop that trains the module under DDP's back: ranks drift apart
                prune_rewind_retrain(lambda: mlp(64, (8,), 10), (1, 8, 8), _drifting_train,
                                     lambda model: 0.0, PruneConfig(
                                         amounts=(0.5,), methods=("magnitude-global",),
                                         seeds=(0,), epochs=2, rewind_epoch=1))
            except DistributedError as err:
                report["drift"] = str(err)
            raise RuntimeError("an error inside the block")
    except RuntimeError:
        report["group destroyed"] = not dist.is_initialized()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    exit_process(0)  # as a script under torchrun ends: never aborted by gloo's threads


def test_collectives_and_the_identity_check_on_two_processes(tmp_path: Path) -> None:
    context = mp.start_processes(_worker, (_free_port(), str(tmp_path)), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the two processes did not finish"
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1))
    assert (r0["world"], r1["world"]) == ([0, 2], [1, 2])
    assert r0["same"] == r1["same"] == fingerprint({"w": torch.arange(4.0)})
    assert r0["gather"] == r1["gather"] == [0, 10]
    assert r0["broadcast"] == r1["broadcast"] == "from 0"
    assert sorted(r0["shard"] + r1["shard"]) == list(range(10))  # disjoint, complete
    assert (r0["tracked"], r1["tracked"]) == (True, False)  # rank 0 alone measures
    assert "masks differ across the 2 ranks" in r0["mismatch"]
    assert "masks differ across the 2 ranks" in r1["mismatch"]
    assert "weights after dense training differ" in r0["drift"]
    assert "weights after dense training differ" in r1["drift"]
    assert r0["group destroyed"] and r1["group destroyed"]


def _ddp_then_exit(rank: int, port: int, out: str) -> None:
    """Train one step under DDP on gloo, leave the group, print, and end the process."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with launched(timeout=timedelta(seconds=60)) as world:
        model = ddp(torch.nn.Linear(3, 2), world)
        model(torch.randn(4, 3)).sum().backward()
    Path(out, f"rank{rank}").write_text("done")
    print(f"rank {rank} printed before leaving")  # flushed by exit_process
    exit_process(3 + rank)


def _run_ddp_then_exit(tmp_path: Path) -> list[int | None]:
    context = mp.start_processes(_ddp_then_exit, (_free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    for p in context.processes:
        p.join(120)
    codes = [p.exitcode for p in context.processes]
    for p in context.processes:
        if p.is_alive():
            p.kill()
    return codes


def test_exit_process_leaves_with_the_status_after_a_ddp_run(tmp_path: Path, capfd) -> None:
    assert _run_ddp_then_exit(tmp_path) == [3, 4]  # os._exit: the status, no SIGABRT
    printed = capfd.readouterr().out
    assert "rank 0 printed before leaving" in printed and "rank 1 printed" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    with pytest.raises(SystemExit) as done:  # no group launched here: sys.exit
        exit_process(5)
    assert done.value.code == 5


@pytest.mark.slow
def test_ddp_runs_end_without_an_abort_forty_times(tmp_path: Path) -> None:
    """Before exit_process, about one run in twenty ended with a rank killed by SIGABRT
    at interpreter exit (gloo's worker freeing DDP's last all-reduce during
    finalisation)."""
    for i in range(40):
        (tmp_path / str(i)).mkdir()
        assert _run_ddp_then_exit(tmp_path / str(i)) == [3, 4], f"run {i}"


KILLED = """
import os, signal, time
from pathlift.models import mlp

def build():
    if os.environ["RANK"] == "1":
        time.sleep(SLEEP_1)
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer or `kill -9`
    time.sleep(SLEEP_0)
    return mlp()
"""


@pytest.mark.parametrize(("sleeps", "said"), [
    ((3, 0), "rank 0: lost the connection to rank 1 ("),  # rank 0 waits in a collective
    ((1, 30), "rank 0: stopped by SIGTERM, which torchrun sends"),  # rank 0 works alone
], ids=["in-a-collective", "working-alone"])
def test_a_killed_rank_ends_the_survivor_in_one_line(tmp_path: Path, sleeps, said) -> None:
    (tmp_path / "killed.py").write_text(
        KILLED.replace("SLEEP_1", str(sleeps[0])).replace("SLEEP_0", str(sleeps[1])))
    logs = tmp_path / "logs"
    start = time.monotonic()
    rc, log = _launch([*TORCHRUN[:3], "--log-dir", str(logs), "--redirects", "3",
                       *TORCHRUN[3:], "-m", "pathlift.cli", "--timeout", "60", "prune",
                       "--model", "killed.py:build", "--epochs", "2", "--rewind-epoch", "1",
                       "--amount", "0.8", "--seeds", "1", "--out", str(tmp_path / "out")],
                      tmp_path)
    assert rc == 1 and time.monotonic() - start < 60, log  # torchrun's own status
    # torchrun's summary: rank 1 killed, rank 0 ended by pathlift with status 2
    assert "ChildFailedError" in log and "exitcode  : -9" in log, log
    assert "exitcode  : 2 " in log, log
    (stderr,) = [p for p in logs.rglob("stderr.log") if p.parent.name == "0"]
    lines = stderr.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {said}"), lines


@pytest.mark.parametrize("ending", [
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                 "peer [127.0.0.1]:29500"),
    RuntimeError("Timed out waiting 2000ms for recv operation to complete"),
    DistributedError("rank 0: lost the connection to rank 1 (...)")],
    ids=["lost", "timed-out", "pathlift's"])
def test_a_sigterm_while_the_rank_ends_by_the_groups_error_lets_that_error_stand(
        monkeypatch, ending) -> None:
    """torchrun sends SIGTERM about 0.1 s after a rank's death, while the survivor unwinds
    the error of its collective: that error says what happened, and stands (it was
    replaced by 'stopped by SIGTERM', or the rank ended without a word, in about one run of
    four of the torchrun check above). With no such error in flight, SIGTERM still stops
    the rank in one line; another error in flight (a user's) does not hold it back."""
    monkeypatch.setenv("RANK", "0")
    previous = distributed._stop_on_sigterm()
    try:
        with pytest.raises(type(ending)) as raised:
            try:
                raise ending
            finally:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs here, between bytecodes
        assert raised.value is ending
        for error in (KeyError("a user's"), None):
            with pytest.raises(DistributedError, match="rank 0: stopped by SIGTERM"):
                try:
                    if error is not None:
                        raise error
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
