"""The tracer's values on shape-only (meta) tensors (pathlift.graph.trace): found only when
a shape is asked, they specialise the graph exactly as values found op by op would; an op
that cannot run on meta tensors leaves its value unknown, and a refusal that follows names
that op and its error; any other error (an assertion, a user's own exception) is not
swallowed but named."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from activation_checks import assert_norms_equal_enumeration
from pathlift.errors import UnsupportedModelError
from pathlift.graph import trace
from pathlift.lift import path_norm


class CpuCopy(nn.Module):
    """Moves the activation to the CPU (no meta kernel can: meta tensors hold no data)
    and then branches on its width."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc(x)).cpu()
        if h.shape[-1] > 2:
            h = h * 2
        return h


def test_a_refusal_names_the_op_that_could_not_run_on_meta_tensors():
    """Before, the meta tracer swallowed every exception and the refusal only said that a
    symbolic value reached control flow: it now names `cpu` and torch's reason, and
    chains the original error."""
    try:
        trace(CpuCopy(), (4,))
    except UnsupportedModelError as err:
        message, problems, cause = str(err), err.problems, err.__cause__
    else:
        raise AssertionError("a branch on an unknown shape was traced")
    assert "`cpu`" in message and "Cannot copy out of meta tensor" in message, message
    assert "NotImplementedError" in message and len(problems) == 1, message
    assert "\n" not in str(problems[0])
    assert isinstance(cause, NotImplementedError)
    assert "test_trace_meta.py" in message  # the user's line of code that branches


@fx.wrap
def _needs_values(x: Tensor) -> Tensor:
    """A user's function that asserts on what meta tensors cannot give."""
    assert not x.is_meta, "_needs_values reads the activations' values"
    return x


class Asserting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = _needs_values(self.fc(x))
        return h[:, : h.shape[-1] // 2]


def test_an_error_that_is_not_an_op_failing_on_meta_tensors_is_named_not_swallowed():
    try:
        trace(Asserting(), (4,))
    except UnsupportedModelError as err:
        message, problems = str(err), err.problems
    else:
        raise AssertionError("an assertion inside the traced forward was swallowed")
    assert "_needs_values reads the activations' values" in message, message
    assert "test_trace_meta.py" in message and len(problems) == 1, message
    assert "\n" not in str(problems[0])


class LateShape(nn.Module):
    """Asks for a shape only after several layers (everything before it runs then, in
    order, in-place ReLU included), then pools by a kernel computed from it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 4, 3, stride=2)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv2(F.relu(self.conv1(x), inplace=True))
        h = F.max_pool2d(h, kernel_size=h.shape[-1])  # global max pool at any shape
        return self.fc(h.flatten(1))


def test_values_found_late_specialise_each_shape_exactly():
    """Each shape's graph equals path enumeration of the network at that shape, outputs
    and path-norms (a global max-pool's window is the map's own size: 3x3 at 8x8, 4x4 at
    10x10, so one graph for both would be wrong at one of them)."""
    torch.manual_seed(0)
    model = LateShape().eval().double()
    for shape in ((2, 8, 8), (2, 10, 10)):
        assert_norms_equal_enumeration(model, shape)
    assert path_norm(model, (2, 8, 8)).log10 != path_norm(model, (2, 10, 10)).log10


def test_the_garbage_collector_is_left_as_it_was_after_a_trace_or_a_refusal():
    """Tracing pauses Python's cyclic collector; it comes back as the caller had it,
    also when the trace is refused."""
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            trace(LateShape().eval(), (2, 8, 8))  # a new model object: a trace runs
            assert gc.isenabled() is enabled
            with pytest.raises(UnsupportedModelError):
                trace(CpuCopy(), (4,))
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
