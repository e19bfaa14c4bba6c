"""Test configuration: under CI (CI=true) hypothesis runs a fixed, reproducible set of
examples, so a green or red CI does not depend on the draw."""

import os

import torch
from hypothesis import settings

import cpu_torchvision  # noqa: F401  (before anything imports torchvision)

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# One intra-op thread for the whole run: the suite is many small ops, where a second
# thread costs more in synchronisation than it gains (several times slower on 2 cores).
torch.set_num_threads(1)
