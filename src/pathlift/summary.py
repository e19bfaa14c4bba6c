"""One screen about a model: its architecture constants, path-norms and Lipschitz bound, or
what keeps it outside the theory (``pathlift summary``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from pathlift.bounds import ArchitectureConstants, architecture_constants, lipschitz_input
from pathlift.errors import UnsupportedModelError, summarise
from pathlift.graph import eval_mode, graph_of, unwrap
from pathlift.graph.input_shape import InputShape, resolve_input_shape
from pathlift.lift import path_norms

__all__ = ["Summary", "summary"]


@dataclass(frozen=True, repr=False)
class Summary:
    """What pathlift sees in a model at one input shape.

    ``unsupported`` lists why the model is refused (Def. 2.2.2), one line per cause, and
    ``supported_ops`` the operations supported instead; every other field but
    ``parameters`` is then None. ``path_norm_log10`` maps q to log10 ||Phi||_q (Thm 3.1.1);
    ``lipschitz_log10`` is log10 ||Phi||_{1,1}, the Lipschitz constant in the input from
    l_inf to l_1 (Thm 3.3.1), and ``layer_product_log10`` the product of layer norms
    Pi_{1,1} it never exceeds (Thm 3.3.2; None for residual sums). ``input_shape`` is the
    shape it was computed at, ``input_shape.source`` where that came from (given, or the
    model's own declaration: never a guess).
    """

    model: str
    input_shape: InputShape
    parameters: int
    constants: ArchitectureConstants | None
    path_norm_log10: dict[float, float] | None
    lipschitz_log10: float | None
    layer_product_log10: float | None
    unsupported: tuple[str, ...] = ()
    supported_ops: str = ""

    @property
    def supported(self) -> bool:
        return not self.unsupported

    def __repr__(self) -> str:
        head = f"Summary({self.model}, input_shape={self.input_shape}, " \
               f"parameters={self.parameters:,}"
        if not self.supported:
            return f"{head}, unsupported: {len(self.unsupported)} cause(s))"
        return (f"{head}, D={self.constants.depth}, log10 ||Phi||_1="
                f"{self.path_norm_log10[1.0]:.3f}, log10 Lipschitz(x)={self.lipschitz_log10:.3f})")


def summary(model: nn.Module, input_shape: Sequence[int] | None = None,
            qs: Sequence[float] = (1.0, 2.0, 4.0), name: str | None = None) -> Summary:
    """Constants (Thm 4.4.1), path-norms ||Phi||_q (Thm 3.1.1) and the Lipschitz bound in the
    input (Thm 3.3.1) of ``model``, or the operations that keep it outside the ReLU DAG
    model (Def. 2.2.2) instead of an error.

    The model is measured in eval mode (BatchNorm as its affine map, Def. 2.2.2) and its
    flags are restored; it is not modified. ``input_shape`` None takes the one the model
    declares (``pathlift.graph.input_shape``), else raises ShapeError.

    Example:
        >>> summary(small_cnn(), (1, 8, 8))
    """
    net = unwrap(model)
    shape = resolve_input_shape(net, input_shape)
    label = name or type(net).__name__
    count = sum(p.numel() for p in net.parameters())
    with eval_mode(net):
        try:
            graph = graph_of(net, shape)
        except UnsupportedModelError as err:
            problems = tuple(summarise(err.problems)) or (str(err),)
            return Summary(label, shape, count, None, None, None, None, problems,
                           err.supported)
        norms = path_norms(graph, qs=qs)
        lipschitz = lipschitz_input(graph, r=1.0)
    product = None if lipschitz.layer_product is None else lipschitz.layer_product.log10
    return Summary(label, shape, count, architecture_constants(graph),
                   {q: n.log10 for q, n in norms.items()}, lipschitz.log10, product)
