"""``reproducible``: torch's deterministic switch on inside the block and back after it,
without loading TorchInductor (whose config import loads torch._dynamo, about 1 s of every
training command's start) unless something already has, in which case inductor's switch
follows too."""

from __future__ import annotations

import subprocess
import sys

import torch

from pathlift.data.training import reproducible

_CHILD = """
import sys, torch
from pathlift.data.training import reproducible
with reproducible(threads=1):
    inside = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads())
after = torch.are_deterministic_algorithms_enabled()
print(inside, after, sorted(m for m in ("torch._dynamo", "torch._inductor.config")
                            if m in sys.modules))
"""


def test_the_switch_is_set_and_restored_without_loading_inductor() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split("\n")[0] == "(True, True, 1) False []", done.stdout


def test_a_loaded_inductor_gets_the_switch_too() -> None:
    import torch._inductor.config as inductor

    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), inductor.deterministic)
    torch.use_deterministic_algorithms(False)
    try:
        with reproducible():
            assert inductor.deterministic and torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not inductor.deterministic and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        inductor.deterministic = before[2]
