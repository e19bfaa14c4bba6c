"""Small hand-written networks shared by the tests of the model boundary and the cache.

    from nets import SHAPE, residual_cnn, tied_mlp, pruned_copy, dense_equivalent
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

SHAPE = (2, 4, 4)
TIED_SHAPE = (5,)


class ResidualCNN(nn.Module):
    """conv-BN-ReLU, max-pool, a residual block, average pool, two Linear layers: every
    kind of node the transformations care about, small enough to enumerate."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.pool = nn.MaxPool2d(2)
        self.a = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.b = nn.Conv2d(3, 3, 1)
        self.head = nn.Linear(3, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.pool(F.relu(self.bn(self.stem(x))))
        h = F.relu(h + self.b(F.relu(self.a(h))))
        h = F.avg_pool2d(h, 2).flatten(1)
        return self.out(F.relu(self.head(h)))


def residual_cnn(seed: int = 0) -> ResidualCNN:
    """An eval-mode ``ResidualCNN`` with random BatchNorm statistics, float64."""
    torch.manual_seed(seed)
    model = ResidualCNN().double()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.5, 0.5)
    return model.eval()


class TiedMLP(nn.Module):
    """A hidden layer called twice (weight tying through a repeated call)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(5, 6)
        self.shared = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = F.relu(self.shared(h))
        h = F.relu(self.shared(h))
        return self.out(h)


def tied_mlp(seed: int = 0) -> TiedMLP:
    torch.manual_seed(seed)
    return TiedMLP().double().eval()


def pruned_copy(model: nn.Module) -> nn.Module:
    """A copy pruned with torch.nn.utils.prune on every Linear/Conv weight (and one bias),
    never run forward since: its cached ``weight`` attributes are not graph leaves."""
    out = type(model)().to(next(model.parameters()).dtype)
    out.load_state_dict(model.state_dict())
    out.eval()
    torch.manual_seed(1)
    for module in out.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            prune.random_unstructured(module, "weight", amount=0.4)
    prune.l1_unstructured(out.head, "bias", amount=0.5)
    return out


def dense_equivalent(pruned: nn.Module, fresh: nn.Module) -> nn.Module:
    """``fresh`` (a model of the same architecture) holding what the pruned one computes:
    each parameter ``name_orig * name_mask`` (masks folded in), everything else copied."""
    state = pruned.state_dict()
    dense = {}
    for key, value in state.items():
        if key.endswith("_orig"):
            dense[key[:-5]] = value * state[key[:-5] + "_mask"]
        elif not key.endswith("_mask"):
            dense[key] = value
    fresh.load_state_dict(dense)
    return fresh.eval()


def step_(model: nn.Module, seed: int, size: float = 1e-2) -> None:
    """An in-place update of every parameter, as an optimiser's step (seeded)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(size * torch.randn(p.shape, generator=g, dtype=p.dtype))
