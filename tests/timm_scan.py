"""timm's models through pathlift, as a new user would try them: build each listed model
(``timm.create_model(name, pretrained=False)``, eval), let pathlift classify it at a small
input (inside the theory: traced; outside: refused, naming the op), and check every
accepted one against the independent |theta|^q pass of ``abs_pow_oracle``.

The verdict is pathlift's at the time the test runs, not a list written here: what the
engine learns to read moves models from "refused" to "measured", and the measured ones
must then be exact. Only ``INSIDE_TODAY`` is written down: families fully inside the theory
(issue 38), so that a regression fails.

``python tests/timm_scan.py [--all] [--out docs/timm.md]`` regenerates the docs table
(``--all``: every model timm lists, slow; default: one model of every timm family).
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field

sys.modules.setdefault("torchvision._meta_registrations",
                       types.ModuleType("torchvision._meta_registrations"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from abs_pow_oracle import abs_pow_outputs, path_magnitude_oracle, plain_twin  # noqa: E402
from pathlift.cli_support import one_line  # noqa: E402
from pathlift.errors import ShapeError, UnsupportedModelError  # noqa: E402
from pathlift.graph import graph_of  # noqa: E402
from pathlift.lift import path_norm  # noqa: E402
from pathlift.prune import path_magnitude_scores  # noqa: E402
from pathlift.symmetry import random_rescale  # noqa: E402

#: families measured exact (issue 38): every listed model must stay measured
INSIDE_TODAY = {
    "ResNet": "resnet18", "ResNet-D": "resnet26d", "ResNet-T": "resnet26t",
    "ResNeXt": "resnext50_32x4d", "Wide-ResNet": "wide_resnet50_2",
    "Res2Net": "res2net50_14w_8s", "Res2NeXt": "res2next50", "DLA": "dla34",
    "HRNet": "hrnet_w18_small", "SelecSLS": "selecsls42", "Xception": "legacy_xception",
    "NF-ResNet": "nf_resnet26",  # weight-standardised convolutions (ScaledStdConv2d)
    "MobileOne": "mobileone_s0",  # branches summed into a Python 0
    "TF-EfficientNet-Lite": "tf_efficientnet_lite0",  # Conv2dSame: same padding
    "ResNet-Blur": "resnetblur18",  # BlurPool2d: a fixed filter held as a buffer
    "FasterNet": "fasternet_s",  # a forward chosen in __init__
    "PNASNet": "pnasnet5large",  # MaxPool2dSame (-inf padding), cropping ZeroPad2d
}

#: models issue 38 lists as refused (inside the theory, or rightly outside): classified
#: by what pathlift says now, never expected either way
LISTED = ("densenet121", "dpn68", "inception_v3", "inception_v4", "inception_resnet_v2",
          "repvgg_a0", "mnasnet_100", "spnasnet_100", "fbnetc_100", "mobilenetv1_100",
          "regnetx_002", "regnetx_004", "gernet_s", "vovnet39a", "cspresnet50", "darknet53",
          "resnetv2_50", "vgg11", "vgg11_bn", "legacy_seresnet18", "ecaresnet26t",
          "skresnet18", "convnext_atto", "efficientnet_b0", "mobilenetv3_small_100",
          "vit_tiny_patch16_224", "resnet50_gn")

#: spatial sizes tried, smallest first: the smallest the model takes is measured
SIZES = (64, 96, 128, 224, 299)
#: models above this many parameters are left out of a scan (VGG-16 is 138M; giants take
#: minutes each here)
MAX_PARAMETERS = 150_000_000
RTOL = 1e-12


@dataclass
class Verdict:
    """What pathlift says of one timm model: ``measured`` at ``shape``, or ``refused`` with
    the one-line ``reason`` (its ops in ``ops``), or ``not_built`` by timm itself."""

    name: str
    family: str
    status: str
    shape: tuple[int, ...] | None = None
    reason: str = ""
    ops: tuple[str, ...] = field(default=())
    error: UnsupportedModelError | None = field(default=None, repr=False)


def build(name: str, dtype: torch.dtype = torch.float64, **kwargs) -> nn.Module:
    """timm's ``name`` with seed 0, 10 classes and timm's constructor arguments ``kwargs``."""
    import timm
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval().to(dtype)


def parameters(name: str) -> int:
    """The parameter count, from a model built on the meta device (nothing allocated)."""
    import timm
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, num_classes=10)
    return sum(p.numel() for p in model.parameters())


def classify(name: str, **kwargs) -> Verdict:
    """pathlift's verdict on the timm model ``name`` (built with timm's constructor arguments
    ``kwargs``; see ``verdict``), on a model built without initialising its values (the
    verdict reads the structure only)."""
    import timm
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        model = model.to_empty(device="cpu").eval()
    except Exception as err:  # timm's own constructor failing (an optional dependency)
        return Verdict(name, family(name), "not_built", reason=one_line(err)[:200])
    declared = getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))
    return verdict(name, family(name), model, declared[0], tuple(declared[1:]))


def verdict(name: str, fam: str, model: nn.Module, channels: int = 3,
            declared: tuple[int, ...] = ()) -> Verdict:
    """pathlift's verdict on an image model at the smallest side of ``SIZES`` it takes,
    else at its ``declared`` spatial size (a model built for 256 or 384 only)."""
    shapes = [(channels, size, size) for size in SIZES]
    if declared and (channels, *declared) not in shapes:
        shapes.append((channels, *declared))
    for shape in shapes:
        try:
            graph_of(model, shape)  # the structure; values are the measurement's to check
        except ShapeError:
            continue
        except UnsupportedModelError as err:
            err.__traceback__ = err.__context__ = None  # which would keep the model alive
            return Verdict(name, fam, "refused", shape, one_line(err),
                           tuple(sorted({p.op.split(" '")[0] for p in err.problems})), err)
        return Verdict(name, fam, "measured", shape)
    return Verdict(name, fam, "refused", None,
                   f"no input of side {SIZES} or its declared {declared} fits")


def family(name: str) -> str:
    """The timm module defining ``name`` (timm's own grouping of architectures)."""
    from timm.models import _registry
    return _registry._model_to_module.get(name, "?")


def check_measured(model: nn.Module, shape: tuple[int, ...]) -> dict[str, float]:
    """Every check of an accepted model; returns the worst relative error of each.

    - ||Phi||_q at q = 1, 2 (r = q) and every output's ||Phi^{->v}||_q against the
      independent |theta|^q pass, float64;
    - path-magnitude scores against autograd of that pass (theta_i d||Phi||_1/d theta_i);
    - ||Phi||_1 unchanged by a random neuron-wise rescaling (Thm 2.4.1), the rescaled
      copy's value taken from the independent pass; a model with weight-standardised
      layers, which pathlift refuses to rescale (in one line, saying why), against the
      rescaled copy of its plain twin (the same neurons, ``abs_pow_oracle.plain_twin``).
    """
    worst = {}
    for q in (1.0, 2.0):
        o, _ = abs_pow_outputs(model, shape, q)
        result = path_norm(model, shape, q=q)
        expected = torch.log10(o) / q
        got = torch.tensor(result.per_output_log10, dtype=torch.float64)
        worst[f"q={q:g} per output"] = float((got - expected).abs().max()) * math.log(10)
        total = math.log10(float(o.sum())) / q
        worst[f"q={q:g}"] = abs(result.log10 - total) * math.log(10)
    scores = path_magnitude_scores(model, shape)
    oracle = path_magnitude_oracle(model, shape)
    worst["scores"], checked = 0.0, 0
    for key, expected in oracle.items():
        if key not in scores.tensors:
            continue
        got = scores.value(key)
        scale = float(expected.abs().max()) or 1.0
        worst["scores"] = max(worst["scores"], float((got - expected).abs().max()) / scale)
        checked += 1
    assert checked == len(oracle), sorted(set(oracle) - set(scores.tensors))[:5]
    try:
        rescaled = random_rescale(model, input_shape=shape, seed=1)
    except UnsupportedModelError as err:  # a weight-standardised layer: refused, saying why
        assert "computes its weight in forward" in str(err) and "\n" not in str(err), err
        rescaled = random_rescale(plain_twin(model), input_shape=shape, seed=1)
    o, _ = abs_pow_outputs(rescaled, shape, 1.0)
    worst["rescaled"] = abs(math.log10(float(o.sum())) - path_norm(model, shape).log10) \
        * math.log(10)
    return worst


def check_refused(err: UnsupportedModelError) -> str:
    """The one line the command line prints for a refusal, checked to name the op and the
    module path of the first refused node, and to give every refused node a reason."""
    line = one_line(err)
    assert "\n" not in line and err.problems
    assert all(p.node and p.op and p.reason for p in err.problems)
    first = err.problems[0]
    assert first.op in line and first.node in line, (first, line)
    return line


def scan(names: list[str]) -> list[Verdict]:
    verdicts = []
    for name in names:
        try:
            too_large = parameters(name) > MAX_PARAMETERS
        except Exception as err:  # timm's own constructor failing
            verdicts.append(Verdict(name, family(name), "not_built",
                                    reason=one_line(err)[:200]))
            continue
        if too_large:
            verdicts.append(Verdict(name, family(name), "skipped",
                                    reason=f"over {MAX_PARAMETERS:,} parameters"))
            continue
        verdicts.append(classify(name))
        print(verdicts[-1], file=sys.stderr, flush=True)
    return verdicts


def representatives() -> list[str]:
    """One model of every timm family (module): its first listed name."""
    import timm
    seen: dict[str, str] = {}
    for name in timm.list_models():
        seen.setdefault(family(name), name)
    return sorted(seen.values())


def _why(v: Verdict) -> str:
    """A refusal naming no op, in a few words: no input size tried fits, not built..."""
    if v.reason.startswith("no input"):
        return "no input size tried fits (nor the declared one)"
    return v.status.replace("_", " ")


def table(verdicts: list[Verdict]) -> str:
    """The docs table: per timm family, the models measured and those refused, and why."""
    by_family: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_family.setdefault(v.family, []).append(v)
    rows = ["| timm family | measured (exact) | refused | why (the ops pathlift names) |",
            "|---|---|---|---|"]
    for fam in sorted(by_family):
        vs = by_family[fam]
        measured = ", ".join(f"`{v.name}`" for v in vs if v.status == "measured") or "-"
        refused = [v for v in vs if v.status != "measured"]
        why = sorted({op for v in refused for op in v.ops} |
                     {_why(v) for v in refused if not v.ops})
        rows.append(f"| {fam} | {measured} | "
                    f"{', '.join(f'`{v.name}`' for v in refused) or '-'} | "
                    f"{', '.join(why) or '-'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import argparse

    import timm
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every model timm lists (slow)")
    parser.add_argument("--out", help="write the table between the markers of this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = timm.list_models() if args.all else sorted(
        set(representatives()) | set(INSIDE_TODAY.values()) | set(LISTED))
    text = table(scan(names))
    if args.out:
        from pathlib import Path
        path = Path(args.out)
        page = path.read_text()
        start, end = "<!-- timm-table: start -->", "<!-- timm-table: end -->"
        head, _, rest = page.partition(start)
        _, _, tail = rest.partition(end)
        path.write_text(f"{head}{start}\n{text}\n{end}{tail}")
    else:
        print(text)
