"""The compression certificate end to end (pathlift.bounds.compression): every term
recomputed independently from the coded network it reports (decoded from its own code
word), the trained network inside the box of Q, and every training error of the trained
network inside the event that the bound counts."""

import math

import pytest
import torch
from torch import nn

from pathlift.bounds.box import box_margins
from pathlift.bounds.code import architecture_of, decode, encode, quantized_tensors
from pathlift.bounds.compression import (
    CompressionSearch,
    EventGrid,
    compression_bound,
    input_scale,
    logit_margins,
)
from pathlift.bounds.kl import kl_inverse
from pathlift.data import synthetic
from pathlift.errors import InvalidParameterError
from pathlift.graph import copy_model, graph_of
from pathlift.graph.normalize import normalize
from pathlift.lift import path_metric


def _trained(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    data = synthetic(n_train=400, n_test=10, input_shape=(6,), num_classes=3, seed=seed)
    x, y = data.train.tensors
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    opt = torch.optim.Adam(model.parameters(), 0.02)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval(), x, y


def _materialise(model: nn.Module, coded) -> nn.Module:
    """The network Q a coded network stands for, written into a copy of the model."""
    q = copy_model(model).double()
    graph = graph_of(q, (6,))
    with torch.no_grad():
        for (name, module, pname, _), value in zip(quantized_tensors(graph), coded.values(),
                                                    strict=True):
            graph.handler(next(n for n in graph.parametric_nodes()
                               if n.target == name.rsplit(".", 1)[0])).write_quantized_(
                module, {pname: value})
    return q


@pytest.mark.parametrize("transfers", [("path-metric",), ("box",)])
def test_every_term_of_the_certificate_recomputed(transfers):
    model, x, y = _trained()
    other = nn.Sequential(nn.Linear(6, 9), nn.ReLU(), nn.Linear(9, 3))
    family = [architecture_of(other, (6,)), architecture_of(model, (6,))]
    grid = EventGrid(per_octave=4, lowest=-60, highest=20)
    search = CompressionSearch(rescalings=("none", "l2"), prune_fractions=(0.0, 0.3),
                               offsets=(2, 4, 6, 8), refine=1, transfers=transfers,
                               subsample=200)
    cert = compression_bound(model, (6,), x, y, family=family, delta=0.1, events=grid,
                             search=search)
    n = len(x)
    assert cert.transfer == transfers[0] and cert.n == n and cert.family_size == 2
    # the code word: its length, and the network it decodes to
    word = encode(cert.coded, family)
    assert len(word.bits) == cert.length.total and cert.length.architecture == 1
    assert decode(word.bits, family)[0] == cert.coded
    # the Occam budget and the kl inverse
    budget = (cert.length.total * math.log(2) + math.log(grid.size) + math.log(10)) / n
    assert cert.occam.budget == pytest.approx(budget, rel=1e-12)
    assert cert.value == kl_inverse(cert.occam.empirical, cert.occam.budget)
    assert cert.occam.events == grid.size == 82
    # the event, recounted on Q rebuilt from the decoded code word
    q = _materialise(model, cert.coded)
    m_q, _ = logit_margins(q, x, y)
    m_theta, _ = logit_margins(model, x, y)
    scale = input_scale(x)
    rescaled = model if cert.rescaling == "none" else normalize(
        model, (6,), {"l1": 1.0, "l2": 2.0}[cert.rescaling], power_of_two=True)
    if cert.transfer == "path-metric":
        metric = path_metric(rescaled, q.float(), (6,))
        assert metric.exact and metric.upper_log10 == pytest.approx(cert.d_log10, abs=1e-9)
        assert cert.tau >= 10**cert.d_log10 and cert.tau / 2**0.25 < 10**cert.d_log10
        event = m_q <= cert.tau * scale
    else:
        boxes = {}
        for (name, _, _, value), (low, high) in zip(
                quantized_tensors(graph_of(rescaled, (6,))), cert.coded.box(), strict=True):
            assert bool(((low <= value.double()) & (value.double() <= high)).all())
            layer, pname = name.rsplit(".", 1)
            boxes.setdefault(layer, {})[pname] = (low, high)
        event = box_margins(model, (6,), x, y, boxes) <= 0
    assert cert.occam.empirical == pytest.approx(float(event.double().mean()), abs=1e-12)
    # the transfer on the training set itself: theta's errors lie in the event
    assert bool(event[m_theta <= 0].all())
    assert cert.train_error == pytest.approx(float((m_theta <= 0).double().mean()))
    assert cert.quantized_error == pytest.approx(float((m_q <= 0).double().mean()))
    terms = cert.terms()
    assert terms["L (bits)"] == cert.length.total and terms["bound"] == cert.value
    assert "valid for every network" in cert.statement()
    assert repr(cert).startswith(f"CompressionBound({cert.value:.4f}")


def test_event_grid_and_refusals():
    grid = EventGrid(per_octave=8, lowest=-16, highest=8)
    assert grid.size == 26
    assert grid.tau_index(1.0) == 0 and grid.tau(grid.tau_index(1.01)) >= 1.01
    assert grid.tau_index(1e-9) == -16 and grid.tau_index(100.0) is None
    model, x, y = _trained()
    with pytest.raises(InvalidParameterError, match="not in the family"):
        compression_bound(model, (6,), x, y, family=[architecture_of(
            nn.Sequential(nn.Linear(6, 3)), (6,))])
    with pytest.raises(InvalidParameterError):
        CompressionSearch(rescalings=("l3",))
    with pytest.raises(InvalidParameterError):
        CompressionSearch(transfers=("nearest",))
