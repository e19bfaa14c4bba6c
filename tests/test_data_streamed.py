"""``pathlift bounds --data FILE.npz`` reads the inputs a batch at a time
(``pathlift.data.load_streamed``, issue 39 "At scale"): the same rows in the same order
as ``load_data`` (so the same certificate), the same one-line refusals, NaN in the last
chunk included, and a file larger than the memory limit certified as the in-memory path
certifies it, in a fraction of its peak memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from cli_runner import invoke
from pathlift import set_memory_limit
from pathlift.data import FileRows, labels_of, load_data, load_streamed, streamed
from pathlift.errors import InvalidParameterError, PathliftError
from pathlift.memory import MemoryLimitError

ROOT = Path(__file__).resolve().parents[1]


def _rows(part) -> tuple[torch.Tensor, torch.Tensor]:
    items = part.__getitems__(list(range(len(part)))) if isinstance(part, FileRows) else \
        [part[i] for i in range(len(part))]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, ">f4", np.uint8, np.int16])
def test_the_streamed_split_is_load_datas_row_for_row(tmp_path, dtype):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(203, 2, 3, 4)) * 50).astype(dtype)
    y = rng.integers(0, 4, 203).astype(np.int32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    for shape in (None, (2, 12), (24,)):
        a = load_data(str(tmp_path / "d.npz"), input_shape=shape, seed=3)
        b = load_streamed(str(tmp_path / "d.npz"), input_shape=shape, seed=3)
        assert isinstance(b.train, FileRows) and isinstance(a.train, TensorDataset)
        assert (b.input_shape, b.num_classes) == (a.input_shape, a.num_classes)
        for p, q in ((a.train, b.train), (a.test, b.test)):
            assert torch.equal(_rows(q)[0], p.tensors[0]) and torch.equal(labels_of(q),
                                                                           p.tensors[1])
            assert torch.equal(_rows(q)[1], p.tensors[1])


def test_a_file_cut_short_after_its_checks_is_one_line(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.ones((40, 5)), y=np.arange(40) % 2)
    split = load_streamed(str(tmp_path / "d.npz"))
    with open(tmp_path / "d.npz", "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(InvalidParameterError, match="the file changed after it was checked"):
        split.train.__getitems__(list(range(len(split.train))))


def test_a_files_own_split_and_the_in_memory_fallbacks(tmp_path):
    rng = np.random.default_rng(1)
    parts = {"x_train": rng.normal(size=(50, 6)), "y_train": rng.integers(0, 2, 50),
             "x_test": rng.normal(size=(20, 6)), "y_test": rng.integers(0, 2, 20)}
    np.savez(tmp_path / "own.npz", **parts)
    b = load_streamed(str(tmp_path / "own.npz"))
    assert torch.equal(_rows(b.test)[0], torch.from_numpy(parts["x_test"]).float())
    assert torch.equal(labels_of(b.train), torch.from_numpy(parts["y_train"]))
    np.savez_compressed(tmp_path / "packed.npz", **parts)  # compressed: read in memory
    assert isinstance(load_streamed(str(tmp_path / "packed.npz")).train, TensorDataset)
    np.savez(tmp_path / "own.npz", **parts)
    standard = load_streamed(str(tmp_path / "own.npz"), normalize="standard")
    assert isinstance(standard.train, TensorDataset)
    assert isinstance(load_streamed("digits").train, TensorDataset)


def _message(load, path, **kw) -> str:
    with pytest.raises(PathliftError) as err:
        load(str(path), **kw)
    return f"{type(err.value).__name__}: {err.value}"


@pytest.mark.parametrize("bad", ["nan last", "inf first", "float32 overflow", "labels",
                                 "counts", "too few", "one class", "shape", "1-d"])
def test_every_refusal_is_load_datas(tmp_path, monkeypatch, bad):
    """NaN in the last row with the checks' chunks of one row (so in the last chunk read):
    refused before any split is made, in load_data's words."""
    monkeypatch.setattr(streamed, "_CHUNK", 1)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 3, 2)), rng.integers(0, 3, 40)
    kw = {}
    if bad == "nan last":
        x[-1, 2, 1] = np.nan
    elif bad == "inf first":
        x[0, 0, 0], x[9, 1, 1] = np.inf, -np.inf
    elif bad == "float32 overflow":
        x[17, 0, 0] = 1e39
    elif bad == "labels":
        y = y.astype(float)
        y[-1] = 0.5
    elif bad == "counts":
        y = y[:-1]
    elif bad == "too few":
        x, y = x[:1], y[:1]
    elif bad == "one class":
        y = np.zeros_like(y)
    elif bad == "shape":
        kw = {"input_shape": (5,)}
    else:
        x = x[:, 0, 0]
    np.savez(tmp_path / "bad.npz", x=x, y=y)
    expected = _message(load_data, tmp_path / "bad.npz", **kw)
    assert _message(load_streamed, tmp_path / "bad.npz", **kw) == expected
    assert "\n" not in expected


def test_bounds_on_a_file_prints_what_the_in_memory_path_prints(tmp_path):
    """``pathlift bounds`` on an .npz written by np.savez (streamed) and on the same data
    compressed (read in memory): the same tables, certificates included."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(600, -1)[:, :10].argmax(1)).astype(np.int64)
    for name, save in (("s", np.savez), ("m", np.savez_compressed)):
        (tmp_path / name).mkdir()
        save(tmp_path / name / "d.npz", x=x, y=y)
    outs = []
    for name in ("s", "m"):
        result = invoke("bounds", "mlp", "--data", str(tmp_path / name / "d.npz"))
        assert result.exit_code == 0, result.output
        outs.append(result.stdout.replace(f"/{name}/", "/"))
    assert outs[0] == outs[1] and "compression (Occam" in outs[0]
    x[-1, 0, 7, 7] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=y)
    result = invoke("bounds", "mlp", "--data", str(tmp_path / "nan.npz"))
    assert result.exit_code != 0 and "compression" not in result.stdout
    assert "1 input value(s) are NaN or inf (the first in sample 599)" in result.output


_PEAK = textwrap.dedent("""
    import json, sys
    import torch
    from torch import nn
    from pathlift import set_memory_limit
    from pathlift.bounds import compression_bound
    from pathlift.bounds.compression import CompressionSearch
    from pathlift.data import load_data, load_streamed

    def peak():  # kB, since the last reset (Linux: clear_refs 5 resets VmHWM)
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        return int(status.split()[0])

    load = {"memory": load_data, "stream": load_streamed}[sys.argv[2]]
    if sys.argv[3] != "none":
        set_memory_limit(sys.argv[3])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, 10)).eval()
    quick = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,), offsets=(4,),
                              refine=0, subsample=512)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before = peak()
    split = load(sys.argv[1], seed=1)
    cert = compression_bound(net, (128,), split.train, search=quick)
    print(json.dumps({"bound": cert.value.hex(), "summary": str(cert.summary()),
                      "peak_kb": peak() - before}))
""")


def _peak(path: Path, how: str, limit: str = "none") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _PEAK, str(path), how, limit],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the peak memory is measured through Linux's /proc/self/clear_refs")
def test_a_file_beyond_the_memory_limit_is_certified_as_in_memory(tmp_path):
    """120,000 rows of 128 float64 values (123 MB): in memory its peak RSS grows by more
    than the file; streamed, under a 40 MB limit that load_data refuses, by less than half
    of it, and the certificate is the same, bit for bit."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(120_000, 128))
    y = x[:, :10].argmax(1)
    np.savez(tmp_path / "big.npz", x=x, y=y)
    size = (tmp_path / "big.npz").stat().st_size
    memory = _peak(tmp_path / "big.npz", "memory")
    set_memory_limit("40M")
    try:
        with pytest.raises(MemoryLimitError):
            load_data(str(tmp_path / "big.npz"))
    finally:
        set_memory_limit(None)
    stream = _peak(tmp_path / "big.npz", "stream", "40M")
    assert stream["bound"] == memory["bound"] and stream["summary"] == memory["summary"]
    assert memory["peak_kb"] * 1024 > size and stream["peak_kb"] * 1024 < size / 2
