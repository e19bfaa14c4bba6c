"""The certified network of the report and of ``pathlift bounds --unlabeled``
(pathlift.jobs.report.certificate): the route's numbers against independent counts, the
verdict against chance, the CLI flag and its refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from cli_runner import invoke
from pathlift.bounds.kl import kl_inverse
from pathlift.data import load_data
from pathlift.jobs.report.certificate import (
    certified_network,
    certified_route,
    recipe_network,
    surrogate_epochs,
)
from pathlift.train.recipes import fit
from pathlift.train.surrogate import predictions

USER_MODEL = '''
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(40, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.hidden(x).relu())


def net():
    return Net()
'''


def signals(n: int, gen: torch.Generator, classes: int = 4, length: int = 40):
    """A bump whose position gives the class, shifted by up to 3 steps, under noise."""
    y = torch.randint(classes, (n,), generator=gen)
    t = torch.arange(length, dtype=torch.float32)
    centre = 6 + 9 * y + torch.randint(-3, 4, (n,), generator=gen)
    x = torch.exp(-((t - centre[:, None]) / 2.0) ** 2 / 2)
    return x + 0.4 * torch.randn(n, length, generator=gen), y


def test_surrogate_epochs():
    assert [surrogate_epochs(n) for n in (100, 1347, 10_000, 50_000)] == [150, 149, 20, 20]


def test_report_certified_network_against_independent_counts():
    """On the digits: the model's bound through the recipe network is the recipe's
    certificate plus kl^-1 of the share of test inputs where the two top classes differ
    (counted here by argmax), and the recipe network beats chance."""
    split = load_data("digits", seed=0)
    x, y = split.train.tensors
    xt, yt = split.test.tensors
    torch.manual_seed(0)
    target = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    fit(target, x, y, torch.optim.Adam(target.parameters(), 3e-3),
        lambda a, b: F.cross_entropy(target(a), b), 10, 64, torch.Generator().manual_seed(0))
    recipe = recipe_network(split.input_shape, x, y, 10)
    c = certified_network(target, split.input_shape, x, y, xt, 10, test=(xt, yt),
                          recipe=recipe)
    with torch.no_grad():
        top_r, top_t = recipe(xt).topk(2, 1), target(xt).topk(2, 1)
    unique = (top_r.values[:, 0] > top_r.values[:, 1]) & (top_t.values[:, 0] > top_t.values[:, 1])
    # they agree where both have a unique top class and it is the same one (a quantised
    # network can tie)
    agree = unique & (top_r.indices[:, 0] == top_t.indices[:, 0])
    differ = float((~agree).double().mean())
    assert c["disagreement"] == pytest.approx(differ, abs=0)
    budget = np.log(1 / 0.025) / len(xt)
    assert c["disagreement_bound"] == kl_inverse(differ, c["disagreement_budget"])
    assert c["disagreement_budget"] == pytest.approx(budget, rel=1e-12)
    assert c["target_bound"] == pytest.approx(min(1.0, c["recipe_bound"]
                                                  + c["disagreement_bound"]), rel=1e-15)
    assert c["recipe_test_error"] < c["recipe_bound"] < c["chance"] < 0.91
    assert c["recipe_verdict"].startswith("beats chance")
    assert c["route"] == "disagreement" and "m = 450" in c["statement"]


def test_cli_bounds_with_unlabeled_inputs(tmp_path):
    """`pathlift bounds MODEL --unlabeled u.npz`: a user's MLP trained with plain Adam gets
    the disagreement route, the same number as certified_route in this process; bad
    --unlabeled files are refused in one line."""
    gen = torch.Generator().manual_seed(0)
    x, y = signals(3000, gen)
    xt, yt = signals(1000, gen)
    u, _ = signals(2000, gen)
    (tmp_path / "usernet.py").write_text(USER_MODEL)
    np.savez(tmp_path / "data.npz", x_train=x.numpy(), y_train=y.numpy(), x_test=xt.numpy(),
             y_test=yt.numpy())
    np.savez(tmp_path / "u.npz", x=u.numpy())
    import importlib.util
    spec = importlib.util.spec_from_file_location("usernet", tmp_path / "usernet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    target = module.net()
    fit(target, x, y, torch.optim.Adam(target.parameters(), 3e-3),
        lambda a, b: F.cross_entropy(target(a), b), 5, 64, torch.Generator().manual_seed(0))
    save_file(target.state_dict(), tmp_path / "w.safetensors")
    args = ["bounds", f"{tmp_path / 'usernet.py'}:net", "--weights",
            str(tmp_path / "w.safetensors"), "--data", str(tmp_path / "data.npz"),
            "--input-shape", "40", "--no-compression"]
    result = invoke(*args, "--unlabeled", str(tmp_path / "u.npz"))
    assert result.exit_code == 0, result.output
    assert "tightest route: disagreement" in result.stdout
    printed = float(re.search(r"disagreement via mlp-small \(prune-retrain 0.5, distilled\)"
                              r" (\d\.\d{4})", result.stdout).group(1))
    expected = certified_route(target.eval(), (40,), x, y, u, 4, direct=False)
    assert printed == pytest.approx(expected.value, abs=5e-5)
    test_error = float((predictions(target, xt) != yt).double().mean())
    assert test_error < expected.value < 0.75  # below chance for 4 classes
    np.savez(tmp_path / "nox.npz", y=u[:, 0].numpy())
    np.savez(tmp_path / "short.npz", x=u[:, :30].numpy())
    for name, message in (("nox.npz", "no array named x"), ("short.npz", "samples of 30"),
                          ("missing.npz", "give an .npz file")):
        bad = invoke(*args, "--unlabeled", str(tmp_path / name))
        assert bad.exit_code != 0
        assert message in bad.stderr and "Traceback" not in bad.output
