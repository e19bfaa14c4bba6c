"""Issue 40, "misleading": a user's model class needing constructor arguments, named on the
command line without them, said "bad arguments {} ... missing 1 required positional
argument" without a word of ``--model-kwargs``. Now the one line names the arguments left
out and the ``--model-kwargs`` JSON to pass (with those already given), and that JSON,
filled in, is taken."""

from __future__ import annotations

import json

import pytest

from cli_runner import invoke
from pathlift.errors import InvalidParameterError
from pathlift.models import get_model

USER_CODE = """\
from torch import nn


class Wide(nn.Module):
    input_shape = (4,)

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(4, width)

    def forward(self, x):
        return self.fc(x)


class Deep(nn.Module):
    input_shape = (4,)

    def __init__(self, depth, width, bias=True):
        super().__init__()
        self.layers = nn.Sequential(*[
            nn.Sequential(nn.Linear(4 if i == 0 else width, width, bias=bias), nn.ReLU())
            for i in range(depth)])

    def forward(self, x):
        return self.layers(x)
"""

CASES = [
    ("Wide", {}, ["width"]),
    ("Deep", {}, ["depth", "width"]),
    ("Deep", {"depth": 2}, ["width"]),
    ("Deep", {"bias": False}, ["depth", "width"]),
]


@pytest.mark.parametrize(("name", "given", "missing"), CASES)
def test_missing_constructor_arguments_say_to_pass_them_with_model_kwargs(name, given, missing,
                                                                          tmp_path):
    path = tmp_path / f"userkwargs_{name}_{len(given)}.py"  # a fresh module for every case
    path.write_text(USER_CODE)
    spec = f"{path}:{name}"
    result = invoke("norm", spec, *(["--model-kwargs", json.dumps(given)] if given else []))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: model '{spec}' needs {', '.join(missing)}, not given:"
                               " pass "), lines[0]
    assert "bad arguments" not in lines[0]
    suggested = lines[0].split("--model-kwargs '")[1].split("'")[0]
    values = {"width": 3, "depth": 2}
    filled = json.loads(suggested.replace("...", "0"))
    assert sorted(filled) == sorted([*given, *missing])  # the given ones kept, the missing added
    filled = {**filled, **given, **{m: values[m] for m in missing}}
    taken = invoke("norm", spec, "--model-kwargs", json.dumps(filled))
    assert taken.exit_code == 0, taken.output  # the advice, followed, works


def test_python_names_the_missing_arguments_and_other_bad_arguments_stay_as_they_were(
        tmp_path):
    path = tmp_path / "userkwargs_python.py"
    path.write_text(USER_CODE)
    with pytest.raises(InvalidParameterError, match="needs depth, width, not given"):
        get_model(f"{path}:Deep")
    with pytest.raises(InvalidParameterError, match="unexpected keyword argument 'colour'"):
        get_model(f"{path}:Deep", depth=1, width=2, colour=3)
    assert get_model(f"{path}:Deep", depth=3, width=2).layers[2][0].weight.shape == (2, 2)
