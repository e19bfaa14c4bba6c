"""A tape written out as straight-line code (pathlift.lift.program): the generated function
gives the walked pass's numbers (ln ||Phi||_q, Thm 3.1.1, to 1e-12 against the LayerGraph
walked at each call, which chooses its scales anew) on networks whose calls take lists
(a foreach |W|, torch.cat), nest their arguments (a conv's stride) or give several
outputs; it frees what no later call reads, logs each call for the transpose, and is
generated once per tape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nets import residual_cnn, step_
from pathlift.graph import graph_of
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.lift.program import straight_line
from pathlift.lift.replay import _PLANS
from pathlift.models import mlp, small_cnn
from user_zoo import densenet_bc


class SplitNet(nn.Module):
    """Functional style with a call of several outputs (chunk) and a concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 4 * 4, 4)

    def forward(self, x):
        a, b = F.relu(self.conv(x)).chunk(2, dim=1)
        h = torch.cat([F.max_pool2d(a, 2), F.avg_pool2d(b, 2)], 1)
        return {"out": self.fc(h.flatten(1))}


NETS = {"mlp": (lambda: mlp(64, (16, 8), 5), (1, 8, 8)), "small_cnn": (small_cnn, (1, 8, 8)),
        "residual_cnn": (residual_cnn, (2, 4, 4)), "densenet_bc (cat)": (densenet_bc, (3, 8, 8)),
        "chunk and cat, dict output": (SplitNet, (1, 8, 8))}


def _tapes(model: nn.Module) -> list:
    return [tape for _, tape, _ in _PLANS[model].values() if tape is not None]


@pytest.mark.parametrize("name", list(NETS))
@pytest.mark.parametrize("q", [1.0, 2.0, 3.5])
def test_the_straight_line_pass_equals_the_walk(name: str, q: float) -> None:
    torch.manual_seed(0)
    build, shape = NETS[name]
    model = build().double().eval()
    differentiable_path_norm(model, shape, q)  # recorded
    magnitude_gradients(model, shape, q)
    step_(model, 1)  # new values: the replay reads the parameters anew
    graph = graph_of(model, shape, as_eval=True)
    with torch.no_grad():
        replayed = differentiable_path_norm(model, shape, q)
        walked = differentiable_path_norm(graph, q=q)
    assert float(replayed) == pytest.approx(float(walked), rel=1e-12)  # scales chosen anew
    for tape in _tapes(model):
        env = tape.run()
        program = tape._program
        kept = set(tape.peaks) | {s for s in tape.result_slots() if s is not None}
        freed = {s for done in tape.frees for s in done}
        assert freed and not freed & kept
        assert all(env[s] is None for s in freed)
        assert all(env[s] is not None for s in kept)
        tape.run()
        assert tape._program is program  # generated once


def test_the_logged_program_records_every_call_and_keeps_every_slot() -> None:
    torch.manual_seed(0)
    model = SplitNet().double().eval()
    differentiable_path_norm(model, (1, 8, 8), 2.0)
    (tape,) = _tapes(model)
    calls: list = []
    with torch.no_grad():
        env = straight_line(tape, calls=True)(calls)
        plain = tape.run()
    assert len(calls) == len(tape.ops)
    for (func, *_), (args, kwargs, out) in zip(tape.ops, calls, strict=True):
        again = func(*args, **kwargs)  # each logged call gives its logged output again
        for got, want in zip(*(o if isinstance(o, (list, tuple)) else [o]
                               for o in (again, out)), strict=True):
            assert torch.equal(got, want)
    assert all(v is not None for v in env[:len(tape.inputs)])
    assert [float(env[s]) for s in tape.result_slots()] == \
        [float(plain[s]) for s in tape.result_slots()]
