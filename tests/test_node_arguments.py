"""``node_arguments``, the argument fetch of every pass: the same (args, kwargs) as torch.fx's
own ``fetch_args_kwargs_from_env`` on every node of graphs written as users write them
(lists of tensors, keyword arguments, slices, dtypes, shapes, nested tuples)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from pathlift.graph.layer_graph import node_arguments


class UserNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(8 * 2, 5)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = torch.cat([h, h * 2.0], dim=1)[:, :, 1:3, ::2]
        h = h.to(torch.float64).to(dtype=torch.float32)
        h = torch.amax(h, dim=(2,), keepdim=False).reshape(x.shape[0], -1)
        parts = torch.split(h, [10, 6], dim=1)
        return {"y": self.fc(torch.cat((parts[1], parts[0]), 1)), "pair": (h, parts[0])}


class _Recorder(fx.Interpreter):
    """fx's Interpreter, checking at every node that both fetches agree."""

    checked = 0

    def run_node(self, n):
        ours = node_arguments(self.env, n)
        theirs = self.fetch_args_kwargs_from_env(n)
        assert _same(ours[0], theirs[0]) and _same(ours[1], theirs[1]), n.format_node()
        _Recorder.checked += 1
        return super().run_node(n)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, dict):
        return type(b) in (dict, fx.immutable_collections.immutable_dict) and \
            a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_node_arguments_are_fx_s_own_on_every_node():
    torch.manual_seed(0)
    model = UserNet()
    x = torch.randn(2, 3, 4, 4)
    module = fx.symbolic_trace(model)
    _Recorder.checked = 0
    assert torch.equal(_Recorder(module).run(x)["y"], model(x)["y"])
    assert _Recorder.checked == len(module.graph.nodes)
