"""Test configuration: under CI (CI=true) hypothesis runs a fixed, reproducible set of
examples, so a green or red CI does not depend on the draw."""

import os
import sys
import types

# torchvision and timm install here with --no-deps (their wheels are built for a CUDA torch):
# torchvision's compiled operators do not load against the CPU torch, and only its
# _meta_registrations module needs them. A stand-in for that module, before the first
# `import torchvision`, makes torchvision's and timm's model definitions importable; they
# run on the CPU torch as plain Python. Without torchvision installed this changes nothing.
sys.modules.setdefault("torchvision._meta_registrations",
                       types.ModuleType("torchvision._meta_registrations"))

import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# One intra-op thread for the whole run: the suite is many small ops, where a second
# thread costs more in synchronisation than it gains (several times slower on 2 cores).
torch.set_num_threads(1)
