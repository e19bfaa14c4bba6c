"""A fixed filter a module holds as a buffer and applies by ``F.conv2d(..., groups=C)`` (timm's
``BlurPool2d``, anti-aliased ResNets): a layer of fixed weights, measured as a grouped
convolution with the call's own settings (the module holds no ``groups``), its weights
raised to q like any other (thesis Def. 2.2.2, Thm 3.1.1): checked against enumeration at
q != 1, where a filter left out of |theta|^q would show."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from activation_checks import assert_norms_equal_enumeration, randomised
from pathlift.lift import path_norm
from pathlift.prune import path_magnitude_scores


class BlurPool(nn.Module):
    """Reflect-pad, then the binomial [1, 2, 1] filter per channel, stride 2."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        k = torch.tensor([1.0, 2.0, 1.0])
        self.register_buffer("filt", (k[:, None] * k[None, :] / 16).expand(
            channels, 1, 3, 3).contiguous(), persistent=False)

    def forward(self, x):
        x = F.pad(x, (1, 1, 1, 1), mode="constant")
        return F.conv2d(x, self.filt, stride=2, groups=self.channels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.blur = BlurPool(3)
        self.head = nn.Linear(3 * 2 * 2, 2)

    def forward(self, x):
        return self.head(self.blur(torch.relu(self.conv(x))).flatten(1))


def test_a_buffer_filter_is_a_layer_of_fixed_weights_raised_to_q():
    net = randomised(Net(), seed=0)  # the filter is a buffer: randomised leaves it
    assert_norms_equal_enumeration(net, (2, 4, 4))
    with_filter = path_norm(net, (2, 4, 4), q=2).log10
    plain = randomised(Net(), seed=0)
    plain.blur.filt.fill_(1.0)
    assert abs(path_norm(plain, (2, 4, 4), q=2).log10 - with_filter) > 0.1


def test_a_buffer_is_neither_scored_nor_pruned():
    scores = path_magnitude_scores(randomised(Net(), seed=1), (2, 4, 4))
    assert set(scores.tensors) == {"conv.weight", "head.weight"}
