"""Kronecker-sparse models are portable: the chain of every ``KSLinear`` is in its state, so a
model saved after ``replace_linears`` loads in a fresh process with an empty cache (and
with the other instruction-set build of the fused kernel) from the checkpoint alone,
nothing timed or written, with the saved weights and outputs bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.errors import InvalidParameterError
from pathlift.kron import KSLinear, KSPattern, design, load_state, monarch, replace_linears
from pathlift.kron import layer as layer_module
from pathlift.models import mlp, save_checkpoint

ARCH = {"in_features": 16, "hidden": [32, 32], "num_classes": 8}

# A fresh process: load the checkpoint (nothing may be timed), the outputs with the
# algorithms "auto" picks there and with bmm everywhere, the state_dict, the cache's files.
CHILD = """
import json, sys, torch
from pathlift.kron import KSLinear
from pathlift.kron import layer as layer_module
from pathlift.models import load_model

def refuse(*args):
    raise AssertionError("loading timed something")

layer_module._measure_fastest = refuse
model, shape = load_model(sys.argv[1])
x = torch.load(sys.argv[2])
with torch.no_grad():
    auto = model(x)
    for m in model.modules():
        if isinstance(m, KSLinear):
            m.algorithm = "bmm"
    bmm = model(x)
torch.save({"auto": auto, "bmm": bmm, "state": model.state_dict()}, sys.argv[3])
print(json.dumps({"shape": list(shape), "layers": [type(m).__name__ for m in model]}))
"""


def designed_model() -> tuple[nn.Module, nn.Module]:
    """A dense MLP and its copy with layer 1 the fastest chain a design finds on this
    machine and layer 3 a Monarch product (both tuned here)."""
    torch.manual_seed(0)
    dense = mlp(**ARCH)
    found = design(16, 32, budget=0.5, batch=8, top_k=2, repeats=1).best_chain.patterns
    out = replace_linears(dense, include=["1", "3"],
                          design={"1": found, "3": monarch(32, 32, 4)})
    for m in out.model.modules():
        if isinstance(m, KSLinear):
            m.tune(8, repeats=1)
    return dense, out.model


@pytest.mark.parametrize("cflags", ["", "-mno-avx512f"], ids=["native", "avx2-build"])
def test_a_saved_designed_model_loads_anywhere_bit_for_bit(cflags, tmp_path):
    dense, model = designed_model()
    path = save_checkpoint(model, tmp_path / "net.safetensors", "mlp", input_shape=(16,),
                           **ARCH)
    x = torch.randn(11, 16, generator=torch.Generator().manual_seed(3))
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = model(x)
        for m in model.modules():
            if isinstance(m, KSLinear):
                m.algorithm = "bmm"
        expected_bmm = model(x)
    empty = tmp_path / "empty-cache"
    env = os.environ | {"PATHLIFT_CACHE_DIR": str(empty), "PATHLIFT_KRON_CFLAGS": cflags,
                        "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(tmp_path / "x.pt"),
                           str(tmp_path / "out.pt")], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.splitlines()[-1])
    assert info["shape"] == [16]
    assert info["layers"] == ["Flatten", "KSLinear", "ReLU", "KSLinear", "ReLU", "Linear"]
    got = torch.load(tmp_path / "out.pt")
    saved = model.state_dict()
    assert saved.keys() == got["state"].keys()
    assert all(torch.equal(saved[k], got["state"][k]) for k in saved)
    assert torch.equal(got["bmm"], expected_bmm)  # same algorithm: bit for bit
    # other algorithms round differently: the same function up to float32 rounding
    torch.testing.assert_close(got["auto"], expected, rtol=1e-5, atol=1e-6)
    assert not empty.exists() or not any(empty.rglob("*")), "loading needs no cache"
    assert isinstance(dense[1], nn.Linear)  # the caller's model was not modified


def test_load_state_rebuilds_the_layers_from_the_state_alone():
    dense, model = designed_model()
    state = model.state_dict()
    assert state["1.chain"].tolist() == [list(p.as_tuple()) for p in model[1].patterns]
    loaded = load_state(dense, state)
    assert [type(m) for m in loaded] == [type(m) for m in model]
    assert loaded[3].patterns == monarch(32, 32, 4)
    x = torch.randn(4, 16)
    loaded[1].algorithm = model[1].algorithm = loaded[3].algorithm = model[3].algorithm = "bmm"
    assert torch.equal(loaded(x), model(x))
    assert isinstance(dense[1], nn.Linear) and isinstance(dense[3], nn.Linear)
    # into a model whose KSLinear has another chain: that layer is rebuilt
    other = replace_linears(dense, include=["3"], design={"3": [(1, 2, 2, 16), (16, 2, 2, 1)]})
    again = load_state(other.model, state)
    assert again[3].patterns == monarch(32, 32, 4) and torch.equal(again(x), model(x))


def test_loading_another_chain_into_a_layer_says_what_to_do():
    a = KSLinear(monarch(16, 16, 4))
    b = KSLinear([KSPattern(1, 2, 2, 8), KSPattern(8, 2, 2, 1)])
    with pytest.raises(RuntimeError, match=r"pathlift\.kron\.load_state"):
        b.load_state_dict(a.state_dict())
    state = a.state_dict()
    del state["chain"]  # saved before the chain was stored: still loads where it fits
    fresh = KSLinear(monarch(16, 16, 4))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.factors[0], a.factors[0])
    with pytest.raises(InvalidParameterError, match="layer '1'"):
        load_state(mlp(**ARCH), {"1.chain": torch.zeros(2, 3, dtype=torch.int64)})


def test_construction_times_nothing(monkeypatch):
    def refuse(*args):
        raise AssertionError("timed at construction")

    monkeypatch.setattr(layer_module, "_FASTEST", {})
    monkeypatch.setattr(layer_module, "_measure_fastest", refuse)
    layer = KSLinear([KSPattern(1, 5, 7, 3)], algorithm="auto")  # never measured here
    assert layer.algorithms() == (layer_module.DEFAULT_ALGORITHM,)
    layer(torch.randn(2, 21))


def test_replace_linears_reports_each_layer():
    dense = mlp(**ARCH)
    out = replace_linears(dense, design={"1": None, "3": monarch(32, 32, 4), "5": None})
    assert [c.replaced for c in out.layers] == [False, True, False]
    assert out.layers[1].params == sum(p.nnz for p in monarch(32, 32, 4))
    assert "kept dense" in str(out) and "3 32x32" in str(out)
    with pytest.raises(InvalidParameterError, match="layer '5'"):
        replace_linears(dense, design={"1": None, "3": None})
    with pytest.raises(InvalidParameterError, match=r"layer '1'.*shape"):
        replace_linears(dense, include=["1"], design={"1": monarch(32, 32, 4)})


def test_a_plain_torch_save_of_the_state_dict_is_enough(tmp_path):
    """A plain torch.save of the state_dict (no pathlift checkpoint) is enough too."""
    dense, model = designed_model()
    torch.save(model.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    loaded = load_state(dense, state)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
