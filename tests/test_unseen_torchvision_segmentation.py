"""torchvision's segmentation models through torchvision itself (issue 38, models the
engine was not written against): FCN-ResNet50 and DeepLabV3-ResNet50 (dilated backbones,
FCNHead and ASPP with Dropout, identity in eval, the pooling branch upsampled bilinearly,
``{"out": ...}`` outputs) are measured; the MobileNetV3 ones are refused in one line
(Hardswish, and LR-ASPP's sigmoid gate).

Each measured model is checked at q = 1 as returned (its final bilinear upsampling has
weights w >= 0 summing to 1, so the all-ones |theta| pass of ``abs_pow_oracle`` is exact
there), and its network before that upsampling (backbone and head: ASPP's upsampling from
1 x 1 copies with weight 1) at q = 1, 2 with path-magnitude scores and a random rescaling
(``timm_scan.check_measured``). Built at 32 x 32, float64; slow (ResNet-50 backbones;
15 s each here). The refusals run by default (under a second each).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

seg = pytest.importorskip("torchvision.models.segmentation")

import timm_scan  # noqa: E402
from abs_pow_oracle import abs_pow_log10  # noqa: E402
from pathlift.errors import UnsupportedModelError  # noqa: E402
from pathlift.lift import path_norm  # noqa: E402

SHAPE = (3, 32, 32)


def _build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(seg, name)(weights=None, weights_backbone=None, num_classes=3,
                              aux_loss=False).eval().double()


class BeforeUpsampling(nn.Module):
    """A torchvision segmentation model's backbone and classifier, without the final
    bilinear upsampling to the input size."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone, self.classifier = model.backbone, model.classifier

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.backbone(x)["out"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fcn_resnet50", "deeplabv3_resnet50"])
def test_torchvision_segmentation_models_are_exact(name: str) -> None:
    model = _build(name)
    assert path_norm(model, SHAPE).log10 == pytest.approx(abs_pow_log10(model, SHAPE, 1.0),
                                                          abs=1e-12)
    worst = timm_scan.check_measured(BeforeUpsampling(model), SHAPE)
    assert max(worst.values()) <= timm_scan.RTOL, worst


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large",
                                  "deeplabv3_mobilenet_v3_large"])
def test_torchvision_mobilenet_segmentation_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(_build(name), SHAPE)
    line = timm_scan.check_refused(info.value)
    assert "(Hardswish)" in line
