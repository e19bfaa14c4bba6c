"""A forward with optional arguments after its input (timm's vision transformers:
``forward(x, attn_mask=None, is_causal=False)``, a user's ``forward(x, mask=None,
scale=1.0)``) is traced as ``model(x)`` runs it, its optional arguments at their defaults:
measured exactly when inside the theory, refused naming its operations when not, never
refused for its signature."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from torch import Tensor, nn

from activation_checks import assert_norms_equal_enumeration, randomised
from pathlift.errors import UnsupportedModelError
from pathlift.graph import trace
from pathlift.lift import path_norm


class Masked(nn.Module):
    """A block whose optional arguments change what it computes when given."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
                scale: float = 0.5, *, skip: bool = True) -> Tensor:
        h = F.relu(self.fc1(x))
        if mask is not None:
            h = h * mask
        if causal:
            h = h.flip(-1)
        out = self.fc2(h) * scale
        return out + self.fc2(h) if skip else out


class Plain(nn.Module):
    """``Masked`` at its defaults, written out."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.fc1(x))
        return self.fc2(h) * 0.5 + self.fc2(h)


def test_optional_arguments_are_traced_at_their_defaults_exactly():
    net = randomised(Masked(), seed=3)
    plain = randomised(Plain(), seed=0)
    plain.load_state_dict(net.state_dict())
    graph = trace(net, (4,))
    assert [n.op for n in graph.graph.nodes].count("placeholder") == 1
    assert_norms_equal_enumeration(net, (4,))
    for q in (1.0, 2.0):
        assert path_norm(net, (4,), q=q).log10 == pytest.approx(
            path_norm(plain, (4,), q=q).log10, abs=1e-12)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return F.relu(self.fc(x)) + y


def test_a_second_input_without_a_default_is_still_refused_naming_the_inputs():
    with pytest.raises(UnsupportedModelError, match="forward takes 2 inputs"):
        path_norm(TwoInputs(), (4,))


class Attention(nn.Module):
    """A transformer block as timm writes one, with an optional attention mask."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.norm, self.qkv, self.fc = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), \
            nn.Linear(dim, dim)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return x + F.gelu(self.fc(h))


def test_an_attention_block_with_optional_arguments_is_refused_naming_its_operations():
    with pytest.raises(UnsupportedModelError) as info:
        path_norm(Attention(), (5, 8))
    message = str(info.value)
    assert "forward signature" not in message
    for op in ("(layernorm)", "scaled_dot_product_attention", "gelu"):
        assert op in message.lower()
