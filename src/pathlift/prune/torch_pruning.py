"""Channel Path-Mag as a Torch-Pruning ``Importance`` (optional: ``pip install 'pathlift[prune]'``).

Torch-Pruning removes channels physically, with every layer that depends on them (its
``Group``). A group's importance here is the sum, over the layers whose output channels
the group removes, of the channel Path-Mag (``pathlift.prune.structured``): the l1 mass
of the paths entering those channels, invariant under rescalings (paper 002 Lemma 4.2).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch_pruning as tp
from torch import Tensor, nn

from pathlift.prune.scores import path_magnitude_scores
from pathlift.prune.structured import channel_scores


class PathMagnitudeImportance(tp.importance.GroupMagnitudeImportance):
    """Per-channel importance of a Torch-Pruning group from Path-Mag scores of ``model``.

    The scores are computed on the whole network in eval mode and recomputed whenever a
    layer's weight changed shape (after Torch-Pruning removed channels). They are
    mantissas sharing one scale factor, so groups of different layers compare directly.
    """

    def __init__(self, model: nn.Module, input_shape: Sequence[int]):
        super().__init__(p=1, group_reduction="sum", normalizer=None)
        self.model, self.input_shape = model, tuple(input_shape)
        self._shapes: dict[str, torch.Size] = {}
        self._channels: dict[int, Tensor] = {}

    def _refresh(self) -> None:
        layers = {n: m for n, m in self.model.named_modules()
                  if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))}
        shapes = {n: m.weight.shape for n, m in layers.items()}
        if shapes == self._shapes:
            return
        was_training = self.model.training
        self.model.eval()
        try:
            scores = path_magnitude_scores(self.model, self.input_shape)
        finally:
            self.model.train(was_training)
        self._shapes = shapes
        self._channels = {id(layers[n]): s for n, s in channel_scores(scores).items()}

    @torch.no_grad()
    def __call__(self, group: tp.Group) -> Tensor | None:
        self._refresh()
        imps, roots = [], []
        for i, (dep, idxs) in enumerate(group):
            channels = self._channels.get(id(dep.layer))
            if channels is None or getattr(dep.layer, "transposed", False) or \
                    dep.pruning_fn not in (tp.prune_conv_out_channels,
                                                          tp.prune_linear_out_channels):
                continue
            imps.append(channels[list(idxs)])
            roots.append(group[i].root_idxs)
        if not imps:
            return None
        return self._reduce(imps, roots)
