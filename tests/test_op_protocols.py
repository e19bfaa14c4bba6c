"""Each pass asks a layer for what its own protocol names (a ``typing.Protocol`` next to the
pass), never for its class: every registered layer op implements the protocols of the
|theta|^q pass, the differentiable pass, rescaling, the channel analysis, permutation and
quantisation, every op with parameters the quantisation protocol, and a layer op missing a
method the differentiable pass needs is seen as not implementing it."""

from __future__ import annotations

import pytest

from pathlift.graph.abs_pow import AbsPowLayer
from pathlift.graph.channels import ChannelLayer
from pathlift.graph.factors import RescalableLayer
from pathlift.graph.ops import FUNCTIONS, METHODS, MODULES, Kind
from pathlift.lift.differentiable import LiveLayer
from pathlift.quant.model import QuantizableOp
from pathlift.symmetry.equivalence import PermutableLayer

LAYERS = sorted({h for h in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values())
                 if h.kind is Kind.AFFINE}, key=lambda h: h.name)
PROTOCOLS = [AbsPowLayer, LiveLayer, RescalableLayer, ChannelLayer, PermutableLayer,
             QuantizableOp]
PARAMETRIC = sorted({h for h in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values())
                     if h.parametric}, key=lambda h: h.name)


def test_the_layers_are_found():
    assert {"Linear", "Conv2d", "ConvTranspose1d", "BatchNorm3d", "KSLinear"} <= \
        {h.name for h in LAYERS}


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda h: h.name)
def test_every_layer_op_implements_every_pass_protocol(layer, protocol):
    assert isinstance(layer, protocol)


def test_the_ops_with_parameters_are_found():
    assert {"Linear", "BatchNorm2d", "KSLinear", "PReLU"} <= {h.name for h in PARAMETRIC}


@pytest.mark.parametrize("op", PARAMETRIC, ids=lambda h: h.name)
def test_every_op_with_parameters_is_quantizable(op):
    assert isinstance(op, QuantizableOp)


def test_an_op_without_write_back_is_not_quantizable_nor_a_layer_without_out_dim_permutable():
    class ReadOnly:
        out_dim = 0

        def quantizable(self, module):
            return []

        def permute_(self, module, outputs=None, inputs=None):
            pass

    class NoLayout:
        def permute_(self, module, outputs=None, inputs=None):
            pass

    assert not isinstance(ReadOnly(), QuantizableOp) and isinstance(ReadOnly(), PermutableLayer)
    assert not isinstance(NoLayout(), PermutableLayer)


def test_a_layer_without_live_magnitudes_is_no_live_layer():
    class Frozen:
        channel_dim = 1

        def prepare(self, modules):
            pass

        def units(self, module, exact=False):
            return 1.0, 1.0

        def weight_part(self, x, q, call, bias=None, workspace=None, unit=1.0):
            return x

        def bias(self, module):
            return None

    assert isinstance(Frozen(), AbsPowLayer) and not isinstance(Frozen(), LiveLayer)


def test_every_trait_of_an_op_is_documented_on_handler():
    from typing import get_type_hints

    from pathlift.graph.ops import Handler

    traits = [name for name, hint in get_type_hints(Handler).items()
              if "ClassVar" in str(hint) and "bool" in str(hint)]
    assert {"layer_on_path", "maxpool", "absorbs_folds", "dense_rows", "derived"} <= set(traits)
    missing = [name for name in traits if f"``{name}``" not in Handler.__doc__]
    assert not missing, f"traits without a line in Handler's docstring: {missing}"


def test_the_structure_traits_answer_for_each_layer_family():
    from pathlift.graph.ops.kron import KSLinearHandler

    by_name = {h.name: h for h in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values())}
    assert by_name["Linear"].dense_rows and not by_name["Conv2d"].dense_rows
    assert not any(h.dense_rows for h in by_name.values() if isinstance(h, KSLinearHandler))
    assert by_name["MaxPool2d"].maxpool and not by_name["AvgPool2d"].maxpool
    assert by_name["BatchNorm2d"].derived and not by_name["Linear"].derived
    on_path = {name for name, h in by_name.items() if h.layer_on_path}
    assert {"Linear", "Conv2d", "BatchNorm1d", "MaxPool2d", "AvgPool2d", "KSLinear"} <= on_path
    assert not on_path & {"ReLU", "LeakyReLU", "Hardtanh", "Flatten"}
