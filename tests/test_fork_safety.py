"""Tracing and measuring take no lock shared across processes: a run killed while holding
one (``kill -9``, a fault test's random kill) would leave every process forked from the
same parent waiting forever. tqdm's lock is such a lock (a multiprocessing semaphore made
once, inherited by every fork): torch.fx's ``Interpreter.run`` takes it for its progress
bar even when the bar is disabled."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from pathlift.graph import graph_of
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores

tqdm = pytest.importorskip("tqdm").tqdm


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(27, 4)).eval()


@pytest.mark.parametrize("work", [
    lambda m: graph_of(m, (1, 8, 8)), lambda m: path_norm(m, (1, 8, 8), q=2),
    lambda m: path_magnitude_scores(m, (1, 8, 8))], ids=["graph_of", "path_norm", "scores"])
def test_a_held_tqdm_lock_does_not_stop_a_measurement(work):
    torch.manual_seed(0)
    lock = tqdm.get_lock()
    done = threading.Event()

    def measure() -> None:
        work(_net())  # a new model: traced and validated anew
        done.set()

    lock.acquire()  # as a sibling process killed while holding it leaves it
    try:
        worker = threading.Thread(target=measure, daemon=True)
        worker.start()
        finished = done.wait(timeout=120)
    finally:
        lock.release()
    worker.join(timeout=120)
    assert finished, "the measurement waited for tqdm's lock"
