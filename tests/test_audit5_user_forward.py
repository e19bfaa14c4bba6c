"""Issue 40, "misleading": an ordinary exception of the user's own forward (a missing dict
key, a list index, a missing attribute, a TypeError, a division by zero) was reported as
"data-dependent control flow" (the file and line right, the cause wrong). The tracer now
calls the forward plainly on its meta example: the same exception at the same line of the
user's code is theirs, raised as it is; the CLI names it on one line, status 2. A branch on
a traced tensor's value is still control flow."""

from __future__ import annotations

import traceback

import pytest
import torch

from cli_runner import invoke
from pathlift.errors import UnsupportedModelError
from pathlift.lift.path_norm import path_norm

USER_CODE = """\
import torch.nn as nn
from torch.nn import functional as F


class Base(nn.Module):
    extra = []

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.input_shape = (4,)


class Keyed(Base):
    def forward(self, x):
        return F.relu(self.fc({"a": x}["b"]))


class Indexed(Base):
    def forward(self, x):
        return self.fc([x][1])


class Attribute(Base):
    def forward(self, x):
        return self.head(self.fc(x))


class Typed(Base):
    def forward(self, x):
        return self.fc(x)[:, :self.fc.out_features + None]


class Divided(Base):
    def forward(self, x):
        return self.fc(x) * (1 / len(self.extra))


class Branch(Base):
    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)
"""

ERRORS = ["Keyed", "Indexed", "Attribute", "Typed", "Divided"]


def _module(tmp_path, name):
    path = tmp_path / f"userforward_{name}.py"  # a fresh module for every case
    path.write_text(USER_CODE)
    namespace: dict = {}
    exec(compile(USER_CODE, str(path), "exec"), namespace)
    return path, namespace[name]()


def _plain(model):
    """The exception the forward raises on a real input, and the line of the user's code."""
    with pytest.raises(Exception) as info:
        model(torch.zeros(2, 4))
    line = next(f.lineno for f in reversed(traceback.extract_tb(info.value.__traceback__))
                if f.filename.endswith(".py") and "userforward_" in f.filename)
    return info.value, line


@pytest.mark.parametrize("name", ERRORS)
def test_the_cli_names_the_user_s_exception_in_one_line(name, tmp_path):
    path, model = _module(tmp_path, name)
    plain, line = _plain(model)
    result = invoke("norm", f"{path}:{name}")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: your code raised {type(plain).__name__} "
                               f"({path}:{line}, in forward): {plain}; fix it there"), lines[0]
    assert "control flow" not in lines[0] and not result.stdout.strip()


@pytest.mark.parametrize("name", ERRORS)
def test_python_raises_the_user_s_own_exception(name, tmp_path):
    _, model = _module(tmp_path, name)
    plain, _ = _plain(model)
    with pytest.raises(type(plain)) as info:
        path_norm(model)
    assert str(info.value) == str(plain)


def test_a_branch_on_a_tensor_value_is_still_control_flow(tmp_path):
    path, model = _module(tmp_path, "Branch")
    assert model(torch.ones(1, 4)).shape == (1, 3)  # it runs on real tensors: no bug there
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(model)
    assert info.value.problems[0].op == "data-dependent control flow"
    result = invoke("norm", f"{path}:Branch")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "(data-dependent control flow)" in lines[0] and "if x.sum() > 0:" in lines[0]
    assert "your code raised" not in lines[0]
