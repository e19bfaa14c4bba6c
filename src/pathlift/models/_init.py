"""torchvision's weight initialisation, so random reference models match torchvision's."""

from __future__ import annotations

from torch import nn


def init_like_torchvision(model: nn.Module, linear_std: float | None) -> None:
    """Kaiming-normal (fan_out, ReLU gain) convs with zero bias, BatchNorm at (1, 0); Linear
    layers drawn from N(0, linear_std^2) with zero bias, or PyTorch's default if None.
    A model on the meta device holds no values: nothing to draw (and torch's meta normal_
    is a Python reference whose first call imports torch._dynamo, about 1 s)."""
    if any(p.is_meta for p in model.parameters()):
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0.0, linear_std)
            nn.init.zeros_(m.bias)
