"""The real torchvision zoo through torchvision itself (issue 38), not the reference copies:
every classification model torchvision lists is built with ``weights=None`` and classified
by pathlift at a small input. Every one it measures is exact as the reference copies are
(tests/test_zoo.py): ||Phi||_q at q = 1, 2 and each output's against the independent
|theta|^q pass of the model's own forward (``abs_pow_oracle``, Thm 3.1.1, <= 1e-12 in
float64), path-magnitude scores against autograd of that pass, invariance under a random
rescaling; every one it refuses is refused in one line naming the op and the module.
The families the reference copies stand for must stay measured. Large models are
``slow``; one model of most families runs by default.
"""

from __future__ import annotations

import pytest
import torch

tv = pytest.importorskip("torchvision.models")

import timm_scan  # noqa: E402
from pathlift.models import get_model, load_model  # noqa: E402

NAMES = tv.list_models(module=tv)
#: the torchvision families pathlift's reference copies stand for (pathlift.models)
MEASURED_TODAY = ("alexnet", "resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2",
                  "vgg11", "vgg11_bn", "vgg16", "vgg16_bn", "mobilenet_v2")
#: cheap enough for the default selection (a few million parameters)
DEFAULT = {"resnet18", "mobilenet_v2", "squeezenet1_0", "mnasnet0_5", "shufflenet_v2_x0_5",
           "googlenet", "regnet_x_400mf", "efficientnet_b0", "mobilenet_v3_small"}


def _build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": True} if name in ("googlenet",
                                                                     "inception_v3") else {}
    return tv.get_model(name, weights=None, num_classes=10, **kwargs).eval().double()


def _params(names):
    return [pytest.param(n, id=n, marks=() if n in DEFAULT else (pytest.mark.slow,))
            for n in names]


@pytest.mark.parametrize("name", _params(NAMES))
def test_every_torchvision_classifier_is_measured_exactly_or_refused_in_one_line(name):
    model = _build(name)
    verdict = timm_scan.verdict(name, "torchvision", model)
    if name in MEASURED_TODAY:
        assert verdict.status == "measured", verdict.reason
    if verdict.status == "measured":
        worst = timm_scan.check_measured(model, verdict.shape)
        assert max(worst.values()) <= timm_scan.RTOL, (name, worst)
    else:
        assert verdict.status == "refused" and verdict.error is not None, verdict
        timm_scan.check_refused(verdict.error)


def test_torchvision_names_load_with_their_documented_input():
    model, shape = load_model("resnet18", seed=0)
    assert type(model).__module__ == "pathlift.models.resnet"  # pathlift's own name wins
    model, shape = load_model("resnext50_32x4d", seed=0)
    assert type(model).__module__.startswith("torchvision.models")
    assert shape == (3, 224, 224) and "torchvision" in shape.source
    with torch.device("meta"):
        inception = get_model("inception_v3", init_weights=False)
    from pathlift.graph.input_shape import declared_input_shape
    assert declared_input_shape(inception) == (3, 299, 299)
