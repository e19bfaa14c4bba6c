"""A call that pathlift must refuse for its size, run in a child of its own: a fork of the
warm process (tests/warm_process.py), whose resident memory is measured from the fork on
(tests/test_hostile_files.py, tests/test_faults.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import warm_process

# The child: ``{call}`` under the memory limit ``{limit}`` must raise a PathliftError; it
# prints "kind|MB grown|message" (the message on one line). ``model`` is a small conv net.
_CHILD = """
import resource, sys
import torch
import pathlift, pathlift.models, pathlift.data, pathlift.lift
from torch import nn
from pathlift.lift.path_norm import path_norm
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
pathlift.set_memory_limit({limit!r})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    {call}
except pathlift.PathliftError as err:
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(type(err).__name__, grown // 1024, str(err).replace("\\n", " "), sep="|")
"""


def refused(call: str, cwd: Path, limit: str | None = None) -> tuple[str, int, str]:
    """(error class, MB the child's resident memory grew, message) of ``call`` under the
    memory limit ``limit`` (None: pathlift's default)."""
    proc = subprocess.run([warm_process.python(), "-c", _CHILD.format(call=call, limit=limit)],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    kind, grown, message = proc.stdout.strip().splitlines()[-1].split("|", 2)
    return kind, int(grown), message
