"""Hostile and careless inputs of issue 29 (part B): every one gives the exact number or a
typed error, on one line with exit status 2 at the command line, never a wrong number.

Classes, each with several instances (the issue's, and some it does not list):

1. Networks at the edges of the float range: every pass (path-norms, the product of layer
   norms, the path-metric, path-magnitude scores, magnitude gradients, the differentiable
   path-norm) at x1e+-150, x1e+-300 and subnormal weights (float64 networks; float32
   networks at x1e+-15, x1e+-30 and subnormal), q in {0.5, 1, 2, 4}, against a pure-Python
   log-domain computation (``_Oracle``: sums of logs with math.fsum, never a float
   product) and the explicit path enumeration ``NeuronDAG``.
2. Data files and datasets: checked when loaded (``load_data``), one line naming the file:
   encodings (a byte-order mark is read, Latin-1 refused), header-only and ragged CSVs,
   non-finite, complex, text and object inputs, labels that are not class indices (checked
   before any cast), one class, every zip and Pillow error, items that are not pairs.
3. Run folders: a changed ``forward`` is named on resume, hand-edited rows and files of
   the wrong kind are refused before anything is computed, a network is written before
   its row (a SIGKILL between them loses nothing), ``--csv`` never appends under another
   table's header.
4. Command lines: every broken input is one line on stderr with exit status 2 (counts of
   0, NaN bounds, input shapes too small, inconsistent torchrun variables, a dead rank 0,
   a full or closed standard output), and what no check foresaw one line with status 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cli_runner import invoke
from nets import residual_cnn
from pathlift.data import load_data
from pathlift.errors import InvalidParameterError, PathliftError, PrecisionError
from pathlift.jobs.prune import PruneConfig, RunFolder, prune_rewind_retrain
from pathlift.jobs.prune.results import COLUMNS, ResultsFileError, RunRecord
from pathlift.lift import path_norm
from pathlift.lift.differentiable import differentiable_path_norm, magnitude_gradients
from pathlift.lift.layer_norm import layer_norm_product
from pathlift.lift.path_metric import path_metric
from pathlift.prune import path_magnitude_scores
from pathlift.testing.neurons import NeuronDAG

LN10 = math.log(10.0)
QS = (0.5, 1.0, 2.0, 4.0)
#: factors applied to every parameter; the last one of each dtype makes them subnormal
FACTORS = {torch.float64: (1e150, 1e-150, 1e300, 1e-300, 1e-310),
           torch.float32: (1e15, 1e-15, 1e30, 1e-30, 1e-40)}
TOLERANCE = 1e-9  # on the natural log of every number: 1e-9 relative


# --------------------------------------------------------------------------- 1. numbers
class UserMLP(nn.Module):
    """Written as users write them: layers in a ModuleList, functional ReLU."""

    def __init__(self, widths: tuple[int, ...] = (3, 4, 3, 2), bias: bool = True):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(a, b, bias=bias)
                                for a, b in itertools.pairwise(widths))

    def forward(self, x):
        for layer in self.fc[:-1]:
            x = F.relu(layer(x))
        return self.fc[-1](x)


def _mlp(factor: float, dtype: torch.dtype, seed: int = 0, bias: bool = True) -> UserMLP:
    torch.manual_seed(seed)
    model = UserMLP(bias=bias).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)
    assert all(bool(torch.isfinite(p).all() and (p != 0).any()) for p in model.parameters())
    return model


def _ln(x: float) -> float:
    return math.log(abs(x)) if x else -math.inf


def _lse(logs: list[float]) -> float:
    """ln sum e^v, the sum by math.fsum of the terms scaled by the largest."""
    top = max(logs, default=-math.inf)
    if top == -math.inf:
        return top
    return top + math.log(math.fsum(math.exp(v - top) for v in logs))


class _Oracle:
    """Everything about an MLP's path-lifting in pure Python, in logs: the stored weights
    read exactly (``tolist``), ln |w| summed along paths, sums by ``_lse``.

    ``forward[l][j]`` = ln sum over the paths p ending at unit j of layer l of |Phi_p|^q
    (l = 0: the inputs, 0); ``backward[l][j]`` = ln sum over the paths from unit j of
    layer l (l >= 1) to an output of the product of their |w|^q (outputs: 0).
    """

    def __init__(self, model: UserMLP, q: float):
        self.q = q
        self.w = [m.weight.tolist() for m in model.fc]
        self.b = [m.bias.tolist() if m.bias is not None else [0.0] * len(w)
                  for m, w in zip(model.fc, self.w, strict=True)]
        self.forward = [[0.0] * len(self.w[0][0])]
        for w, b in zip(self.w, self.b, strict=True):
            prev = self.forward[-1]
            self.forward.append([_lse([q * _ln(b[j])] + [q * _ln(w[j][k]) + prev[k]
                                                          for k in range(len(prev))])
                                 for j in range(len(w))])
        self.backward = [[0.0] * len(self.w[-1])]
        for w in reversed(self.w[1:]):
            after = self.backward[0]
            self.backward.insert(0, [_lse([q * _ln(w[j][k]) + after[j] for j in range(len(w))])
                                     for k in range(len(w[0]))])
        self.backward.insert(0, [])  # layer l's outputs at index l, like ``forward``

    def norm(self) -> float:
        """ln ||Phi||_q."""
        return _lse(self.forward[-1]) / self.q

    def per_output(self) -> list[float]:
        """ln ||Phi^{->v}||_q for each output v."""
        return [v / self.q for v in self.forward[-1]]

    def product(self) -> float:
        """ln Pi_{q,q} (Def. 3.3.1): M_v = ||theta^{->v}||_q^q max_u M_u + |b_v|^q."""
        m = [0.0] * len(self.w[0][0])
        for w, b in zip(self.w, self.b, strict=True):
            top = max(m)
            m = [_lse([q_w + top, self.q * _ln(b[j])]) for j, q_w in
                 enumerate(_lse([self.q * _ln(x) for x in row]) for row in w)]
        return _lse(m) / self.q

    def edge(self, layer: int, j: int, k: int) -> float:
        """ln d||Phi||_q^q / d|w|^q for the weight w of unit j of fc[layer] from unit k."""
        return self.forward[layer][k] + self.backward[layer + 1][j]


def _close(got: float, expected: float, what: object) -> None:
    assert abs(got - expected) <= TOLERANCE, (what, got, expected)


def _logs(t: torch.Tensor) -> list[float]:
    return [_ln(v) for v in t.reshape(-1).tolist()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("index", range(5), ids=["e+150", "e-150", "e+300", "e-300", "subnormal"])
def test_path_norms_and_products_at_the_edges_of_the_float_range(dtype, index):
    """x1e+300 once gave log10 ||Phi||_2 = nan, x1e-300 -inf, subnormals an OverflowError."""
    factor = FACTORS[dtype][index]
    model = _mlp(factor, dtype)
    for q in QS:
        oracle = _Oracle(model, q)
        for mantissa in (torch.float64, dtype):
            got = path_norm(model, (3,), q=q, r=q, dtype=mantissa)
            tolerance = TOLERANCE if mantissa == torch.float64 else 1e-5
            assert abs(got.log10 * LN10 - oracle.norm()) <= tolerance, (factor, q, mantissa)
        for got_v, want_v in zip(path_norm(model, (3,), q=q, r=1.0).per_output_log10,
                                 oracle.per_output(), strict=True):
            _close(got_v * LN10, want_v, (factor, q, "per output"))
        _close(layer_norm_product(model, (3,), q=q, r=q).log10 * LN10, oracle.product(),
               (factor, q, "Pi"))
        # a second oracle: explicit enumeration of the paths (NeuronDAG)
        _close(NeuronDAG.from_module(model, (3,)).path_norm_log10(q, q) * LN10, oracle.norm(),
               (factor, q, "NeuronDAG"))


@pytest.mark.parametrize("factor", [1e150, 1e-150, 1e300, 1e-300, 1e-310])
def test_conv_pool_batchnorm_network_at_the_edges_equals_enumeration(factor):
    """Conv, eval BatchNorm, max-pool, a residual sum and average pooling at every scale."""
    model = residual_cnn()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(factor)
    dag = NeuronDAG.from_module(model, (2, 4, 4))
    for q in QS:
        _close(path_norm(model, (2, 4, 4), q=q, r=q).log10 * LN10,
               dag.path_norm_log10(q, q) * LN10, (factor, q))


#: a float64 scale holds values within e^+-700 of the largest (and keeps 1e-9 near the
#: bottom of that range only above ~e^-690, where subnormals start losing digits)
_HELD = 690.0


def _entries_or_refusal(compute, expected: list[float], what: object):
    """``compute()`` -> (logs of the entries, in order), compared with ``expected`` entry
    by entry; or a PrecisionError, which is only right when ``expected`` spans more than
    one float scale holds."""
    spread = max(expected) - min(expected)
    try:
        got = compute()
    except PrecisionError as err:
        assert spread > _HELD, (what, spread, str(err))
        return
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if e > max(expected) - _HELD:
            _close(g, e, (what, i))


@pytest.mark.parametrize("index", range(4), ids=["e+150", "e-150", "e+300", "e-300"])
def test_scores_gradients_and_penalty_at_the_edges_of_the_float_range(index):
    """Path-magnitude scores (q = 1), magnitude gradients and the differentiable
    path-norm with its gradient, entry by entry against the oracle: exact, or refused
    (PrecisionError) exactly when the entries span more than one float64 scale."""
    model = _mlp(FACTORS[torch.float64][index], torch.float64)
    one = _Oracle(model, 1.0)
    expected = [_ln(w) + one.edge(layer, j, k) for layer in range(len(model.fc))
                for j, row in enumerate(one.w[layer]) for k, w in enumerate(row)]
    expected += [_ln(b) + one.backward[layer + 1][j] for layer in range(len(model.fc))
                 for j, b in enumerate(one.b[layer])]

    def scores() -> list[float]:
        found = path_magnitude_scores(model, (3,), include_biases=True)
        shift = found.log10_scale * LN10
        return [v + shift for part in ("weight", "bias") for layer in range(len(model.fc))
                for v in _logs(found.tensors[f"fc.{layer}.{part}"])]

    _entries_or_refusal(scores, expected, "scores")
    for q in (1.0, 2.0):
        oracle = _Oracle(model, q)
        wanted = [oracle.edge(layer, j, k) for layer in range(len(model.fc))
                  for j, row in enumerate(oracle.w[layer]) for k in range(len(row))]
        wanted += [v for layer in range(len(model.fc)) for v in oracle.backward[layer + 1]]

        def gammas(q: float = q) -> list[float]:
            found = magnitude_gradients(model, (3,), q=q)
            return [v + found.log_scale for part in ("weight", "bias") for fc in model.fc
                    for v in _logs(found.mantissas[getattr(fc, part)])]

        _entries_or_refusal(gammas, wanted, ("gammas", q))
        model.zero_grad()
        value = differentiable_path_norm(model, (3,), q=q)
        value.backward()
        _close(value.item(), oracle.norm(), ("penalty", q))
        total = q * oracle.norm()  # d ln||Phi||_q / dw = sign(w) |w|^(q-1) e^(edge - total)
        for layer, fc in enumerate(model.fc):
            grads = fc.weight.grad.tolist()
            for j, row in enumerate(oracle.w[layer]):
                for k, w in enumerate(row):
                    want = (q - 1) * _ln(w) + oracle.edge(layer, j, k) - total
                    if want > -_HELD:  # float64 holds it with 1e-9
                        _close(_ln(grads[j][k]), want, ("gradient", q, layer, j, k))
                        assert math.copysign(1, grads[j][k]) == math.copysign(1, w)


@pytest.mark.parametrize("q", [1.0, 2.0, 4.0])
def test_an_output_that_underflows_is_computed_again_or_refused(q):
    """A hidden unit whose incoming weights are 1e-300 times its layer's largest, read by
    one output with weight 1e+300: per-layer units cannot hold both, and that output comes
    out 0 although its paths weigh ~1. It is computed again on the normalised copy (Alg.
    3.2.1), exactly; with incoming weights too small to normalise (1e-320), PrecisionError,
    never 0."""
    model = _mlp(1.0, torch.float64, seed=4, bias=False)
    with torch.no_grad():
        model.fc[0].weight[0].mul_(1e-300)
        model.fc[1].weight[:, 0].mul_(1e300)
    oracle = _Oracle(model, q)
    assert all(v > -50 for v in oracle.per_output())
    _close(path_norm(model, (3,), q=q, r=q).log10 * LN10, oracle.norm(), q)
    for got, want in zip(path_norm(model, (3,), q=q, r=1.0).per_output_log10,
                         oracle.per_output(), strict=True):
        _close(got * LN10, want, (q, "per output"))
    if q == 1.0:
        return  # 1e-320 is a subnormal, not 0, at q = 1: its few digits are the limit
    with torch.no_grad():
        model.fc[0].weight[0].mul_(1e-20)  # now subnormal: 1/||.|| overflows
        model.fc[1].weight[:, 0].mul_(1e8)
        model.fc[1].weight[:, 1:].zero_()  # only the lost unit reaches the outputs
    with pytest.raises(PrecisionError, match="cannot normalise it exactly"):
        path_norm(model, (3,), q=q, r=q)


def test_a_zero_bias_keeps_its_magnitude_gradient():
    """gamma_b = d||Phi||_2^2 / d|b|^2 does not depend on b: a BatchNorm whose folded bias
    c is 0 (zero running mean and bias, as at initialisation) once got gamma 0, and
    Path-SGD never moved its bias. Expected: the sum over its neurons' outgoing paths,
    here the squared Linear weights reading each channel (2 x 2 positions)."""
    for shift in (0.0, 1e-3):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(),
                              nn.Flatten(), nn.Linear(12, 2)).double().eval()
        with torch.no_grad():
            model[1].bias.fill_(shift)
        found = magnitude_gradients(model, (1, 4, 4), q=2.0)
        expected = model[4].weight.detach().pow(2).reshape(2, 3, 4).sum(dim=(0, 2))
        torch.testing.assert_close(found.mantissas[model[1].bias] * math.exp(found.log_scale),
                                   expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("factor", [1e150, 1e-150, 1e300, 1e-300, 1e-310])
def test_path_metric_at_the_edges_of_the_float_range(factor):
    """The exact case (Lemma 3.4.1): theta' = theta with the output layer's weights halved,
    d = (1/2) sum over the paths through them of |Phi_p(theta)|."""
    model = _mlp(factor, torch.float64)
    pruned = _mlp(factor, torch.float64)
    with torch.no_grad():
        pruned.fc[-1].weight.mul_(0.5)
    found = path_metric(model, pruned, (3,))
    oracle = _Oracle(model, 1.0)
    last = len(model.fc) - 1
    expected = math.log(0.5) + _lse([_ln(w) + oracle.forward[last][k]
                                     for row in oracle.w[last] for k, w in enumerate(row)])
    if expected - oracle.norm() > math.log(1e-12):  # float64 resolves it: exact
        assert found.exact
        _close(found.lower_log10 * LN10, expected, factor)
    else:  # d / ||Phi||_1 ~ 1e-150 at x1e-150 (the output bias dominates): never "d = 0"
        assert not found.exact and "precision" in found.reason
        assert found.lower_log10 * LN10 <= expected <= found.upper_log10 * LN10


@pytest.mark.parametrize("q", QS)
def test_layers_at_opposite_ends_of_the_range(q):
    """Not in the issue: each layer far from 1 but Phi near it (x1e+300 then x1e-300, and
    the reverse), and a bias 1e+300 times its weights: the scaling is per tensor."""
    for first, second in ((1e300, 1e-300), (1e-300, 1e300), (1e-170, 2e-170)):
        model = _mlp(1.0, torch.float64, seed=3)
        with torch.no_grad():
            model.fc[0].weight.mul_(first)
            model.fc[1].weight.mul_(second)
            model.fc[2].bias.mul_(1 / first)
        oracle = _Oracle(model, q)
        _close(path_norm(model, (3,), q=q, r=q).log10 * LN10, oracle.norm(), (first, q))
        _close(layer_norm_product(model, (3,), q=q, r=q).log10 * LN10, oracle.product(),
               (first, q, "Pi"))


# --------------------------------------------------------------------------- 2. data files
def _xy(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)), np.arange(n) % 3


def _csv_text(x: np.ndarray, y: np.ndarray, header: bool = True) -> str:
    rows = [",".join(["a", "b", "c", "d", "label"])] if header else []
    rows += [",".join([*(repr(float(v)) for v in xi), str(yi)]) for xi, yi in zip(x, y,
                                                                                strict=True)]
    return "\n".join(rows) + "\n"


def test_a_csv_with_a_byte_order_mark_gives_the_same_split_as_without(tmp_path):
    """Once: the label column was not found, the last pixel became the label (17 classes)."""
    x, y = _xy()
    (tmp_path / "plain.csv").write_text(_csv_text(x, y), encoding="utf-8")
    (tmp_path / "bom.csv").write_text(_csv_text(x, y), encoding="utf-8-sig")
    assert (tmp_path / "bom.csv").read_bytes()[:3] == b"\xef\xbb\xbf"
    plain, bom = load_data(str(tmp_path / "plain.csv")), load_data(str(tmp_path / "bom.csv"))
    assert bom.num_classes == plain.num_classes == 3 and bom.input_shape == (4,)
    for a, b in ((plain.train, bom.train), (plain.test, bom.test)):
        assert torch.equal(a.tensors[0], b.tensors[0])
        assert torch.equal(a.tensors[1], b.tensors[1])
    assert sorted(torch.cat([bom.train.tensors[1], bom.test.tensors[1]]).tolist()) == \
        sorted(y.tolist())


def _write(path: Path, content: object) -> str:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        np.savez(path, **content)
    return str(path)


_X, _Y = _xy()
_NAN_TEST = {"x_train": _X, "y_train": _Y, "x_test": np.where(np.eye(40, 4) > 0, np.nan, _X),
             "y_test": _Y}
#: (file name, content, what the one-line error says); bytes and str are written as they
#: are, a dict with numpy.savez
BAD_FILES = {
    "latin-1 csv": ("a.csv", "caf\xe9,b,label\n1,2,0\n3,4,1\n".encode("latin-1"), "not UTF-8"),
    "cp1252 csv": ("b.csv", "x,\u2019y,label\n1,2,0\n3,4,1\n".encode("cp1252"), "not UTF-8"),
    "header-only csv": ("c.csv", "a,b,label\n", "header and no samples"),
    "ragged csv": ("d.csv", "a,b,label\n1,2,0\n3,1\n", "line 3: 2 fields"),
    "string labels csv": ("e.csv", "a,b,label\n1,2,cat\n3,4,dog\n", "'cat' is not a number"),
    "NaN in the test inputs": ("f.npz", _NAN_TEST, "NaN or inf"),
    "inf inputs": ("g.npz", {"x": np.full((40, 4), np.inf), "y": _Y}, "NaN or inf"),
    "inputs beyond float32": ("h.npz", {"x": _X * 1e300, "y": _Y}, "beyond float32"),
    "label 1e300": ("i.npz", {"x": _X, "y": np.where(_Y == 2, 1e300, _Y)}, "integer class"),
    "negative label": ("j.npz", {"x": _X, "y": _Y - 1}, "integer class"),
    "fractional label": ("k.npz", {"x": _X, "y": _Y + 0.5}, "integer class"),
    "string labels npz": ("l.npz", {"x": _X, "y": _Y.astype(str)}, "labels are text"),
    "one class": ("m.npz", {"x": _X, "y": np.zeros(40)}, "at least two classes"),
    "one-class csv": ("n.csv", _csv_text(_X, np.ones(40, dtype=int)), "at least two classes"),
    "complex inputs": ("o.npz", {"x": _X + 1j, "y": _Y}, "complex"),
    "text inputs": ("p.npz", {"x": _X.astype(str), "y": _Y}, "inputs are text"),
    "object arrays": ("q.npz", {"x": np.array([[1, "a"]] * 40, dtype=object), "y": _Y},
                      "not a readable .npz"),
    "0-d arrays": ("r.npz", {"x": np.array(5.0), "y": np.array(1)}, "one array of values"),
    "one value per sample": ("s.npz", {"x": _X[:, 0], "y": _Y}, "one array of values"),
    "zero-byte npz": ("t.npz", b"", "not a readable .npz"),
    "not a zip": ("u.npz", b"PK\x03\x04 this is not a zip file at all", "not a readable .npz"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_data_files_are_one_typed_line_naming_the_file(case, tmp_path):
    name, content, says = BAD_FILES[case]
    spec = _write(tmp_path / name, content)
    with pytest.raises(InvalidParameterError) as err:
        load_data(spec)
    assert says in str(err.value) and name in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_truncated_npz_is_one_line(tmp_path):
    np.savez_compressed(tmp_path / "full.npz", x=_X, y=_Y)
    data = (tmp_path / "full.npz").read_bytes()
    for cut in (len(data) // 3, len(data) - 30):
        (tmp_path / "cut.npz").write_bytes(data[:cut])
        with pytest.raises(InvalidParameterError, match=r"cut\.npz' is not a readable \.npz"):
            load_data(str(tmp_path / "cut.npz"))


def _image_folder(root: Path) -> Path:
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (6, 6), dtype=np.uint8), mode="L").save(
                root / f"class{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("damage", ["zero-byte", "truncated", "corrupt", "text"])
def test_every_pillow_error_is_one_line_naming_the_image(damage, tmp_path):
    root = _image_folder(tmp_path / "images")
    victim = root / "class1" / "2.png"
    data = victim.read_bytes()
    victim.write_bytes({"zero-byte": b"", "truncated": data[:len(data) // 2],
                        "corrupt": data[:16] + bytes(len(data) - 16),
                        "text": b"hello, not an image"}[damage])
    with pytest.raises(InvalidParameterError, match=r"2\.png' is not a readable image"):
        load_data(str(root))
    assert load_data(str(_image_folder(tmp_path / "good"))).num_classes == 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def test_a_decompression_bomb_image_is_one_line(tmp_path):
    """A 30000 x 30000 PNG header (900M pixels) over a few bytes: refused when opened,
    before anything is decoded."""
    root = _image_folder(tmp_path / "images")
    header = struct.pack(">IIBBBBB", 30000, 30000, 1, 0, 0, 0, 0)
    (root / "class0" / "bomb.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _chunk(b"IEND", b""))
    with pytest.raises(InvalidParameterError,
                       match=r"bomb\.png' is refused as a decompression bomb"):
        load_data(str(root))


class _Dicts(torch.utils.data.Dataset):
    """A dataset whose items are dicts, as Hugging Face datasets give them."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"image": torch.ones(4) * i, "label": i % 2}


CALLABLES = {
    "dicts": ("(_Dicts(), _Dicts())", "item 0 is a dict"),
    "triples": ("([(torch.ones(4), 0, 'x')] * 4, [(torch.ones(4), 1, 'x')] * 4)",
                "item 0 is a tuple of 3"),
    "lone tensors": ("([torch.ones(4)] * 4, [torch.ones(4)] * 4)", "item 0 is a Tensor"),
    "fractional labels": ("([(torch.ones(4), 0.5)] * 4, [(torch.ones(4), 1)] * 4)",
                          "integer class"),
    "complex tensors": ("(TensorDataset(torch.ones(4, 2, dtype=torch.cfloat), "
                        "torch.tensor([0, 1, 0, 1])),) * 2", "complex"),
    "NaN in a Split": ("Split(TensorDataset(torch.ones(4, 2), torch.tensor([0, 1, 0, 1])), "
                       "TensorDataset(torch.full((2, 2), float('nan')), torch.tensor([0, 1])),"
                       " (2,), 2)", "NaN or inf"),
    "ragged inputs": ("([(torch.ones(4), 0), (torch.ones(3), 1)],) * 2", "every input needs"),
}


@pytest.mark.parametrize("case", list(CALLABLES))
def test_datasets_whose_items_are_not_pairs_are_one_line(case, tmp_path, monkeypatch):
    body, says = CALLABLES[case]
    module = f"hostile_data_{list(CALLABLES).index(case)}"  # one module name per case
    (tmp_path / f"{module}.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "from pathlift.data import Split\n"
        "from test_hostile_inputs import _Dicts\n"
        f"def load():\n    return {body}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(PathliftError) as err:
        load_data(f"{module}:load")
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


# --------------------------------------------------------------------------- 3. run folders
GRID = PruneConfig(amounts=(0.5, 0.7), methods=("magnitude-global",), seeds=(0,), epochs=2,
                   rewind_epoch=1, rescaled=(False,))


class Twin(nn.Module):
    """One set of parameters, two forwards (``variant``): the user edits forward between
    a run and its resume."""

    variant = "relu"

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 16), nn.Linear(16, 10)

    def forward(self, x):
        h = self.a(x.flatten(1))
        return self.b(F.relu(h) if self.variant == "relu" else F.relu(-h))


def _twin() -> nn.Module:
    return Twin()


def _no_training(model: nn.Module, epochs: int, phase) -> None:
    for _ in phase.epochs(epochs):
        pass


def _run(out: Path, model_fn=_twin, train=_no_training, evaluate=lambda m: 0.5, **kwargs):
    return prune_rewind_retrain(model_fn, (1, 8, 8), train, evaluate, GRID,
                                folder=RunFolder(out), **kwargs)


def test_a_changed_forward_is_named_on_resume(tmp_path, monkeypatch):
    """Once: the manifest held the class and parameter shapes only, and the runs of two
    different networks were mixed in one runs.csv."""
    _run(tmp_path / "out")
    before = (tmp_path / "out" / "runs.csv").read_bytes()
    monkeypatch.setattr(Twin, "variant", "flipped")
    with pytest.raises(InvalidParameterError, match="other settings: forward was") as err:
        _run(tmp_path / "out")
    assert "Twin: " in str(err.value) and "\n" not in str(err.value)
    assert (tmp_path / "out" / "runs.csv").read_bytes() == before
    monkeypatch.setattr(Twin, "variant", "relu")  # the original forward resumes
    assert len(_run(tmp_path / "out").runs) == 2


#: (column, value written, what the error says): values a hand edit may leave
EDITS = {
    "accuracy inf": ("accuracy", "inf", "accuracy inf is not in [0, 1]"),
    "accuracy -5": ("accuracy", "-5.0", "accuracy -5.0 is not in [0, 1]"),
    "accuracy nan": ("dense_accuracy", "nan", "dense_accuracy nan is not in [0, 1]"),
    "sparsity 2": ("sparsity", "2.0", "sparsity 2.0 is not in [0, 1]"),
    "world_size 7": ("world_size", "7", "world_size 7 differs from the folder's 1"),
    "amount outside the grid": ("amount", "0.9", "amount 0.9 is not one of the folder's"),
    "seed outside the grid": ("seed", "3", "seed 3 is not one of the folder's seeds"),
    "unknown method": ("method", "random", "method 'random' is not one of"),
    "other spread": ("spread", "runs", "spread 'runs' differs"),
    "other rounds": ("rounds", "4", "rounds 4 differs"),
    "overlap 500": ("overlap", "500.0", "overlap 500.0 is not a percentage"),
    "digest": ("mask_digest", "xyz", "mask_digest 'xyz' is not 16 hex digits"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_hand_edited_rows_are_refused_before_anything_is_computed(edit, tmp_path):
    column, value, says = EDITS[edit]
    out = tmp_path / "out"
    _run(out)
    lines = (out / "runs.csv").read_text().splitlines()
    cells = lines[2].split(",")
    cells[COLUMNS.index(column)] = value
    lines[2] = ",".join(cells)
    (out / "runs.csv").write_text("\n".join(lines) + "\n")
    before = (out / "runs.csv").read_bytes()
    calls = []
    with pytest.raises(ResultsFileError) as err:
        _run(out, train=lambda *a: calls.append(a))
    assert f"runs.csv' line 3: {says}" in str(err.value) and "\n" not in str(err.value)
    assert not calls and (out / "runs.csv").read_bytes() == before
    with pytest.raises(ResultsFileError, match="line 3"):
        RunFolder(out).records()  # read without opening: checked against the manifest too


@pytest.mark.parametrize("name", ["runs.csv", "manifest.json", "dense"])
def test_a_results_file_of_the_wrong_kind_fails_before_any_training(name, tmp_path):
    """Once: runs.csv replaced by a folder recomputed every run, then failed at the first
    row."""
    out = tmp_path / "out"
    _run(out)
    target = out / name
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    target.mkdir() if name != "dense" else target.write_text("not a folder")
    calls = []
    with pytest.raises(ResultsFileError, match=f"'{target}' is not a") as err:
        _run(out, train=lambda *a: calls.append(a))
    assert not calls and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [95.0, math.nan, -0.1, "0.5", None])
def test_an_evaluate_that_is_not_an_accuracy_is_refused_before_it_is_written(value, tmp_path):
    with pytest.raises(InvalidParameterError, match="must return an accuracy"):
        _run(tmp_path / "out", evaluate=lambda m: value)
    assert not (tmp_path / "out" / "runs.csv").exists()


def _killed_at_the_row(out: Path, row: int) -> int:
    """Run the protocol with --save-models in a forked child that SIGKILLs itself when it
    is about to write its ``row``-th row (its network written just before): the exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            written = []
            real = RunFolder.append

            def append(self, record):
                written.append(record)
                if len(written) == row:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(self, record)

            RunFolder.append = append
            _run(out, save_models=True)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _every_row_has_its_network(out: Path) -> list[RunRecord]:
    folder = RunFolder(out)
    records = folder.records()
    assert all(folder.model_path(r).is_file() for r in records)
    return records


def test_a_kill_between_a_network_and_its_row_loses_nothing(tmp_path):
    """Once: the row was written first, and a kill before the network lost it for good
    (resume saw the row and skipped the run)."""
    out = tmp_path / "out"
    assert _killed_at_the_row(out, 2) == -signal.SIGKILL
    assert len(_every_row_has_its_network(out)) == 1
    result = _run(out, save_models=True)
    assert len(result.runs) == 2 and len(_every_row_has_its_network(out)) == 2
    # a folder left by the old order (a row without its network): that run is redone
    lost = RunFolder(out).model_path(result.runs[0])
    lost.unlink()
    again = _run(out, save_models=True)
    assert [r.to_row() for r in again.runs] == [r.to_row() for r in result.runs]
    assert lost.is_file() and len(_every_row_has_its_network(out)) == 2


def test_finished_runs_whose_dense_weights_were_deleted_are_one_line(tmp_path):
    """Once: an AttributeError traceback when the summary plot reloaded seed 0's network."""
    from pathlift.jobs.prune import prune_experiment

    config = dataclasses.replace(GRID, amounts=(0.5,))
    prune_experiment("mlp", "digits", config, tmp_path / "out")
    (tmp_path / "out" / "dense" / "seed0-trained.safetensors").unlink()
    with pytest.raises(ResultsFileError, match=r"seed0-trained\.safetensors' \(or its rewind "
                       r"file\) is missing: the runs of seed 0 are finished") as err:
        prune_experiment("mlp", "digits", config, tmp_path / "out")
    assert "\n" not in str(err.value)


def test_a_csv_under_another_header_is_refused_not_appended(tmp_path):
    """``--csv`` once appended depth or quantisation rows under any file's header."""
    from pathlift.files import append_rows

    table = tmp_path / "mine.csv"
    table.write_text("name,score\nalice,3\n")
    with pytest.raises(InvalidParameterError, match="holds another table"):
        append_rows(table, ["model", "depth"], [["mlp", 3]])
    assert table.read_text() == "name,score\nalice,3\n"
    result = invoke("depth", "--model", "C10k-B12c", "--depths", "4", "--seeds", "1",
                    "--samples", "16", "--csv", str(table))
    assert result.exit_code == 2 and "holds another table" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    append_rows(tmp_path / "new.csv", ["model", "depth"], [["mlp", 3]])
    append_rows(tmp_path / "new.csv", ["model", "depth"], [["mlp", 4]])  # its own: appended
    assert (tmp_path / "new.csv").read_text() == "model,depth\nmlp,3\nmlp,4\n"


# --------------------------------------------------------------------------- 4. one line
def _one_line(result, says: str, status: int = 2) -> None:
    """Exit ``status`` with one 'Error: ...' line holding ``says`` and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == status, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], lines
    assert "Traceback" not in result.output


#: command lines that once printed a traceback, an empty table or nan (exit 0)
BROKEN = {
    "depth --seeds 0 (empty table)": (["depth", "--model", "C10k-B12c", "--depths", "4",
                                       "--seeds", "0", "--samples", "16"], "'--seeds': 0 is not"),
    "depth --samples 0": (["depth", "--model", "C10k-B12c", "--depths", "4", "--seeds", "1",
                           "--samples", "0"], "'--samples': 0 is not"),
    "quantize --samples 0": (["quantize", "mlp", "--samples", "0"], "'--samples': 0 is not"),
    "quantize --samples -5": (["quantize", "mlp", "--samples", "-5"], "'--samples': -5 is not"),
    "rescale --samples 0": (["rescale", "mlp", "--samples", "0"], "'--samples': 0 is not"),
    "normalize --samples 0": (["normalize", "mlp", "--samples", "0"], "'--samples': 0 is not"),
    "identify --samples 0": (["identify", "mlp", "--samples", "0"], "'--samples': 0 is not"),
    "lipschitz --x-inf nan (printed nan)": (["lipschitz", "mlp", "--x-inf", "nan"],
                                            "'--x-inf': nan is not a finite number"),
    "lipschitz --x-inf -1": (["lipschitz", "mlp", "--x-inf", "-1"], "'--x-inf': -1.0 is not"),
    "identify --scale nan": (["identify", "mlp", "--scale", "nan"], "'--scale': nan is not"),
    "equivalent --tolerance nan": (["equivalent", "mlp", "mlp", "--tolerance", "nan"],
                                   "'--tolerance': nan is not"),
    "equivalent --tolerance -1": (["equivalent", "mlp", "mlp", "--tolerance", "-1"],
                                  "'--tolerance': -1.0 is not"),
    "kron-bench --repeats 0": (["kron-bench", "--repeats", "0"], "'--repeats': 0 is not"),
    "kron-bench --every 0": (["kron-bench", "--every", "0"], "'--every': 0 is not"),
    "kron-bench --max-dense 1": (["kron-bench", "--max-dense", "1"], "no pattern of the grid"),
    "kron-design --batch 0": (["kron-design", "64", "64", "--batch", "0"], "'--batch': 0 is not"),
    "input shape too small for pooling": (["norm", "small_cnn", "--input-shape", "1", "1",
                                           "1"], "'features.2' (MaxPool2d) cannot take"),
    "vgg11 at 8x8": (["summary", "vgg11", "--input-shape", "3", "8", "8"], "MaxPool2d"),
    "rescale --factor 1e308 (read as NaN weights)": (["rescale", "mlp", "--factor", "1e308"],
                                                     "rescaling takes '1.weight' out of"),
    "rescale --factor 1e-320": (["rescale", "mlp", "--factor", "1e-320"], "out of torch."),
    "digits --test-fraction 0.999": (["bounds", "mlp", "--data", "digits", "--test-fraction",
                                      "0.999"], "quantile of the training margins"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_command_lines_are_one_line_with_status_2(case):
    args, says = BROKEN[case]
    _one_line(invoke(*args), says)


@pytest.mark.parametrize(("env", "says"), [
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 with WORLD_SIZE=2"),  # once: read as a timeout
    ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not an integer"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 with WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
])
def test_an_inconsistent_torchrun_environment_is_one_line_at_once(env, says, monkeypatch,
                                                                   tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = invoke("prune", "--model", "mlp", "--epochs", "2", "--rewind-epoch", "1",
                    "--seeds", "1", "--amount", "0.5", "--out", str(tmp_path / "out"))
    _one_line(result, says)
    assert not (tmp_path / "out").exists()


def _pathlift(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pathlift.cli", *args], text=True,
                          stderr=subprocess.PIPE, timeout=300, **kwargs)


def test_a_full_or_closed_standard_output_is_one_line():
    """Once: /dev/full ended in a traceback, a closed stdout exited 0 having printed
    nothing."""
    with open("/dev/full", "w") as full:
        done = _pathlift("summary", "mlp", stdout=full)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "Error: cannot write to standard output (No space left on " \
                                  "device); the results were not printed"
    closed = _pathlift("summary", "mlp", stdout=subprocess.DEVNULL,
                       preexec_fn=lambda: os.close(1))
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr.strip().startswith("Error: standard output is closed")


DYING = """
import os
from pathlift.distributed import launched
with launched():
    os._exit(3)  # rank 0 is killed right after the rendezvous
"""


def test_the_surviving_rank_of_a_dead_rank_0_is_one_line(tmp_path):
    """Once: gloo's "Connection closed by peer" ended the surviving rank in a traceback."""
    (tmp_path / "dying.py").write_text(DYING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.pathsep.join(str(Path(p).resolve()) for p in  # the pathlift under test
                           os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": here}
    rank0 = subprocess.Popen([sys.executable, "dying.py"], cwd=tmp_path,
                             env={**env, "RANK": "0", "LOCAL_RANK": "0"})
    try:
        rank1 = subprocess.run(
            [sys.executable, "-m", "pathlift.cli", "--timeout", "60", "prune", "--model",
             "mlp", "--epochs", "2", "--rewind-epoch", "1", "--seeds", "1", "--amount", "0.5",
             "--out", str(tmp_path / "out")], cwd=tmp_path, env={**env, "RANK": "1",
                                                                 "LOCAL_RANK": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        rank0.wait(timeout=60)
    lines = rank1.stderr.strip().splitlines()
    assert rank1.returncode == 2 and len(lines) == 1, rank1.stderr
    assert lines[0].startswith("Error: rank 1: lost the connection to rank 0 (")


def test_an_unexpected_exception_is_one_line_saying_it_is_a_bug(monkeypatch):
    """The last net: what no check foresaw is one line with status 1 (a bug, not the
    user's input), and --debug shows the traceback."""
    import pathlift.lift as module

    def broken(*args, **kwargs):
        raise KeyError("an internal table")

    monkeypatch.setattr(module, "path_norms", broken)
    _one_line(invoke("norm", "mlp"), "internal error, not your input (KeyError", status=1)
    with pytest.raises(KeyError):
        from pathlift.cli import app
        from pathlift.cli_support import run
        run(app, ["--debug", "norm", "mlp"])
