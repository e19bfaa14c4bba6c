"""The certified network: a trained network certified by the tightest route
(``pathlift.bounds.disagreement.certify``), with surrogates distilled from it, and the
verdict of a certificate against chance. Used by ``pathlift report`` and by
``pathlift bounds --unlabeled``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from pathlift.bounds.compression import CompressionBound, CompressionSearch, compression_bound
from pathlift.bounds.disagreement import RouteCertificate, certify
from pathlift.bounds.entry import check_sample
from pathlift.bounds.verdict import judge, verdict
from pathlift.data import Split, labels_of
from pathlift.errors import InvalidParameterError, ShapeError
from pathlift.graph.outputs import OutputKey, select_output
from pathlift.train.recipes import compact_model, train_recipe
from pathlift.train.surrogate import distil_surrogate, predictions

__all__ = [
    "REPORT_RECIPE",
    "SURROGATE_SEARCH",
    "certificate_rows",
    "certificates_of",
    "certified_network",
    "certified_route",
    "load_unlabeled",
    "recipe_network",
    "surrogate_epochs",
    "surrogate_kinds",
]

# the recipe chosen on the digits' validation split (docs/training.md): mlp-small,
# quantisation-aware at grid offset 2
REPORT_RECIPE = ("mlp-small", "quantized", 2)

# the frontier's search for compact networks: the network as trained, steps searched
SURROGATE_SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                                     offsets=tuple(range(2, 14, 2)), refine=1)


def surrogate_kinds(shape: Sequence[int]) -> tuple[str, ...]:
    """The compact architectures tried as surrogates (``pathlift.train.compact_model``):
    the MLP always, the CNN too for signals (C, L) and images (C, H, W)."""
    return ("mlp-small", "cnn-small") if len(shape) in (2, 3) else ("mlp-small",)


def surrogate_epochs(n: int) -> int:
    """Epochs of the surrogate's recipe, fixed by n alone (about 2*10^5 sample visits,
    between 20 and 150): 148 on the 1,347 digits, 20 from n = 10,000."""
    return min(150, max(20, math.ceil(2e5 / n)))


def certified_route(target: nn.Module, shape: Sequence[int], x: Tensor, y: Tensor,
                    unlabeled: Tensor | None, num_classes: int, *, direct: bool = True,
                    delta: float = 0.05, seed: int = 0,
                    search: CompressionSearch = SURROGATE_SEARCH,
                    surrogates: dict[str, nn.Module] | None = None) -> RouteCertificate:
    """``target`` trained on (x, y) certified by the tightest route: its own compression
    certificate when ``direct``, and with held-out ``unlabeled`` inputs the disagreement
    route through ``surrogates`` (chosen on (x, y) only), by default compact networks of
    ``surrogate_kinds(shape)`` distilled from the target's predictions on x with the
    ``prune-retrain`` recipe (0.5). ``unlabeled`` serves the disagreement count alone."""
    shape = tuple(shape)
    if unlabeled is None:
        surrogates = {}
    elif surrogates is None:
        surrogates = {f"{kind} (prune-retrain 0.5, distilled)": distil_surrogate(
            target, x, num_classes, kind=kind, epochs=surrogate_epochs(len(x)), seed=seed,
            shape=shape) for kind in surrogate_kinds(shape)}
    return certify(target, shape, x, y, unlabeled=unlabeled, surrogates=surrogates,
                   direct=direct, delta=delta, search=search)


def recipe_network(shape: Sequence[int], x: Tensor, y: Tensor, num_classes: int,
                   seed: int = 0) -> nn.Module:
    """``REPORT_RECIPE``'s network trained on (x, y): ``surrogate_epochs(n)`` epochs of
    Adam (lr 3e-3, batches of 64) and half as many after pruning (``train_recipe``)."""
    kind, method, strength = REPORT_RECIPE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = compact_model(kind, tuple(shape), num_classes)
    train_recipe(net, x, y, method, strength, surrogate_epochs(len(x)), 64, 3e-3, seed)
    return net.eval()


def certified_network(target: nn.Module, shape: Sequence[int], x: Tensor, y: Tensor,
                      unlabeled: Tensor, num_classes: int, seed: int = 0,
                      test: tuple[Tensor, Tensor] | None = None,
                      recipe: nn.Module | None = None) -> dict[str, object]:
    """The report's certified network: ``recipe`` (default: ``recipe_network`` trained on
    (x, y)) certified, and ``target`` certified through it by the disagreement route on
    ``unlabeled`` (held out from training: the report's test inputs, their labels unread
    here), both judged against chance. ``test`` (inputs, labels) only adds the measured
    test errors."""
    recipe = recipe_network(shape, x, y, num_classes, seed) if recipe is None else recipe
    name = "{} ({} {:g})".format(*REPORT_RECIPE)
    cert = certified_route(target, shape, x, y, unlabeled, num_classes, direct=False,
                           seed=seed, surrogates={name: recipe})
    via = cert.through[0]
    recipe_verdict = judge(math.log10(via.surrogate.value), y)
    out: dict[str, object] = {
        "recipe": name, "recipe_bound": via.surrogate.value, "recipe_delta": via.surrogate.delta,
        "recipe_verdict": str(recipe_verdict),
        "target_bound": via.value, "target_delta": via.delta, "route": cert.route,
        "target_verdict": str(judge(math.log10(via.value), y)),
        "chance": recipe_verdict.chance, "chance_rule": recipe_verdict.rule,
        "statement": cert.statement()}
    out.update({f"recipe_{k}": v for k, v in via.surrogate.summary().items()})
    out.update({"disagreement": via.disagreement.empirical, "m": via.disagreement.n,
                "disagreement_budget": via.disagreement.budget,
                "disagreement_bound": via.disagreement.value})
    if test is not None:
        out["recipe_test_error"] = float((predictions(recipe, test[0]) != test[1])
                                         .double().mean())
        out["target_test_error"] = float((predictions(target, test[0]) != test[1])
                                         .double().mean())
    return out


def certificates_of(net: nn.Module, shape: Sequence[int], split: Split,
                    output: OutputKey | None, compression: bool, unlabeled: str | None,
                    time_budget: float | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    ) -> tuple[CompressionBound | None, RouteCertificate | None]:
    """What ``pathlift bounds`` certifies beside the path-norm bound: the compression
    certificate (when ``compression``; its search within ``time_budget`` seconds, reporting
    to ``progress``), and with an ``unlabeled`` .npz file the tightest route
    (``certified_route``; its direct certificate is then the compression one)."""
    if unlabeled is None:
        return (compression_bound(net, shape, split.train, outputs=output,
                                  time_budget=time_budget, progress=progress)
                if compression else None), None
    route = certified_route(select_output(net, output, shape), shape, *split.train.tensors,
                            load_unlabeled(unlabeled, shape), split.num_classes,
                            direct=compression)
    return route.direct, route


def certificate_rows(cert: CompressionBound | None, route: RouteCertificate | None,
                     split: Split, test_error: float) -> tuple[list[list[str]], str]:
    """The rows of ``pathlift bounds``' certificate table for the compression certificate
    and the tightest route (none for what was not computed), each judged against chance
    on the training labels, and the table's caption: chance, its rule, the i.i.d.
    statement and why the compression search stopped, if it stopped early."""
    labels = labels_of(split.train)
    rows = []
    if cert is not None:
        rows.append([f"compression (Occam, {cert.transfer} transfer)",
                     f"kl^-1({cert.occam.empirical:.4f}, {cert.occam.budget:.4f}), "
                     f"L = {cert.length.total} bits", cert.verdict(test_error)])
    if route is not None:
        rows.append([f"tightest route: {route.route}",
                     ", ".join(f"{k} {v:.4f}" for k, v in route.routes().items()),
                     verdict(math.log10(route.value), test_error, labels=labels)])
    sample = check_sample(split.train)
    caption = (f"chance (the best constant classifier's training error, {sample.rule}): "
               f"{sample.chance:.4f}; {sample.statement()}")
    if cert is not None and cert.stopped:
        caption += f"; compression search stopped: {cert.stopped}"
    return rows, caption


def load_unlabeled(path: str | Path, shape: Sequence[int]) -> Tensor:
    """Held-out unlabeled inputs from an ``.npz`` file with an array ``x`` (samples first;
    any other array, labels included, is ignored), as float32 of the model's input shape.
    Raises InvalidParameterError for a missing file or array, ShapeError for a size that
    ``shape`` does not hold."""
    path = Path(path)
    if path.suffix != ".npz" or not path.is_file():
        raise InvalidParameterError(f"--unlabeled {path}: give an .npz file with an array x "
                                    "of held-out inputs")
    with np.load(path, allow_pickle=False) as data:
        if "x" not in data:
            raise InvalidParameterError(f"--unlabeled {path}: no array named x")
        x = torch.from_numpy(np.asarray(data["x"], dtype=np.float32))
    if not len(x) or x[0].numel() != math.prod(shape):
        raise ShapeError(f"--unlabeled {path}: samples of {x[0].numel() if len(x) else 0} "
                         f"values, the model takes {tuple(shape)}")
    return x.reshape(len(x), *shape)
