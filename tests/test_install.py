"""A lean install: the library core needs only torch, numpy and safetensors; the extras
(cli, plots, data, lab) add the rest; CI installs Torch-Pruning so its test runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

EXTRAS = ("scipy", "sklearn", "matplotlib", "typer", "rich", "click", "PIL", "torch_pruning",
          "lightning", "torchvision")

CORE = """
import sys
for name in {extras}:
    sys.modules[name] = None          # as if not installed: importing it raises ImportError
import numpy as np
import torch
import pathlift
from pathlift.bounds import generalization_bounds
from pathlift.data import load_data, loaders
from pathlift.lift import path_norm
from pathlift.bounds import lipschitz_input
from pathlift.models import load_model, save_checkpoint
from pathlift.prune import global_path_magnitude, path_magnitude_scores
from pathlift.quant import quantize
from pathlift.bounds import certified_error
from pathlift.jobs.report import measure_report
from pathlift.summary import summary
from pathlift.symmetry import normalize, random_rescale

model, shape = load_model("small_cnn", seed=0)
rng = np.random.default_rng(0)
np.savez("d.npz", x=rng.random((40, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 10, 40))
split = load_data("d.npz")
bounds = generalization_bounds(model, shape, *loaders(split, 16, 0))
report, _ = measure_report(model, shape, split)
assert report.bounds.path_norm_log10 == path_norm(model, shape).log10 == bounds.path_norm_log10
print(summary(model, shape), certified_error(model, quantize(model, shape, bits=8), shape))
"""


def test_the_core_runs_without_any_extra(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", CORE.format(extras=EXTRAS)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Summary(" in done.stdout


def test_an_extra_missing_says_which_to_install(tmp_path) -> None:
    code = ("import sys; sys.modules['PIL'] = None\n"
            "from pathlift.data import load_data\n"
            "import pathlib; [pathlib.Path(f'i/{c}').mkdir(parents=True) for c in 'ab']\n"
            "load_data('i')")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True)
    assert "pip install 'pathlift[data]'" in done.stderr


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI installs torch-pruning (make install)")
def test_ci_installs_torch_pruning_so_its_importance_is_tested() -> None:
    assert importlib.util.find_spec("torch_pruning") is not None


def test_the_command_line_without_its_extra_says_which_to_install(tmp_path) -> None:
    code = "import sys; sys.modules['typer'] = None; import pathlift.cli"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == ("pathlift's command line needs typer: pip install "
                                   "'pathlift[cli]'")
