"""Conserved quantities of gradient flow (thesis Sec. 7.1.2) on short small-step runs."""

from __future__ import annotations

import torch
from torch import nn

from pathlift.symmetry import analyse, rescale
from pathlift.symmetry.conserved import conserved_quantities
from test_rescale import Residual, mlp


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(6 * 4 * 4, 8), nn.ReLU(), nn.Linear(8, 3))


class PlainResidual(nn.Module):
    """A residual block without BatchNorm: the stream channels form one tied group."""

    def __init__(self):
        super().__init__()
        self.stem, self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 7), nn.Linear(7, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.head(torch.relu(h + self.b(torch.relu(self.a(h)))))


def drift(model: nn.Module, shape, steps: int = 100, lr: float = 1e-3) -> float:
    """Largest relative drift of the conserved quantities over ``steps`` SGD steps."""
    start = conserved_quantities(model, shape)
    initial = [p.detach().clone() for p in model.parameters()]
    g = torch.Generator().manual_seed(0)
    x = torch.randn((32, *shape), dtype=torch.float64, generator=g)
    with torch.no_grad():
        target = model(x) + 0.5 * torch.randn(model(x).shape, dtype=torch.float64, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        ((model(x) - target) ** 2).mean().backward()
        opt.step()
    end = conserved_quantities(model, shape)
    scale = start.incoming + start.outgoing
    moved = sum((a - b).abs().sum() for a, b in zip(model.parameters(), initial, strict=True))
    assert moved > 1e-3  # the parameters did move
    return float(((end.values - start.values).abs() / scale).max())


def test_mlp_quantities_are_conserved():
    torch.manual_seed(0)
    assert drift(mlp().double(), (6,)) < 1e-3


def test_cnn_channel_quantities_are_conserved():
    torch.manual_seed(1)
    assert drift(cnn().double(), (2, 8, 8)) < 1e-3


def test_tied_residual_group_is_conserved():
    torch.manual_seed(2)
    model = PlainResidual().double()
    q = conserved_quantities(model, (5,))
    assert len(q.groups) == 7 + 6  # a's 7 units + the 6 tied stream channels (stem ~ b)
    assert drift(model, (5,)) < 1e-3


def test_quantity_by_hand_and_a_rescaling_changes_it():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).double()
    q = conserved_quantities(model, (2,))
    w1, b1, w2 = model[0].weight, model[0].bias, model[2].weight
    expected = (w1.pow(2).sum(1) + b1.pow(2) - w2.pow(2).sum(0)).detach()
    assert torch.allclose(q.values, expected, rtol=1e-14)
    lam = torch.tensor([2.0, 0.5, 3.0], dtype=torch.float64)
    q2 = conserved_quantities(rescale(model, {"0": lam}, (2,)), (2,))
    moved = (w1.pow(2).sum(1) + b1.pow(2)) * lam**2 - w2.pow(2).sum(0) / lam**2
    assert torch.allclose(q2.values, moved.detach(), rtol=1e-14)


def test_batchnorm_readers_are_left_out():
    model = Residual().double().eval()
    q = conserved_quantities(model, (3, 8, 8))
    cmap = analyse(model, (3, 8, 8))
    conv_groups = cmap.group[cmap.producer("a1").neurons]  # read by abn1 only
    assert not torch.isin(conv_groups, q.groups).any()
    bn_groups = cmap.group[cmap.producer("abn1").neurons]  # read by the conv a2
    assert torch.isin(bn_groups, q.groups).all()
