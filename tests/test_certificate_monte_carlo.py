"""Monte Carlo check of the compression certificate (issue 39, slow): the prune-retrain
recipe on 20 independent training samples of a generated task; no certificate may lie
below the trained network's error on a large fresh test sample. Each certificate holds
with probability >= 0.95, so on 20 samples a violation or two could happen by chance
(P(>= 3) < 0.08); the recipe's certificates sit far above the test errors, so none does.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from pathlift.bounds.compression import CompressionSearch, compression_bound
from pathlift.train.recipes import compact_model, train_recipe, train_with_reference

SAMPLES = int(os.environ.get("PATHLIFT_MC_SAMPLES", "20"))
SEARCH = CompressionSearch(rescalings=("none",), prune_fractions=(0.0,),
                           offsets=tuple(range(2, 12)), refine=1)


def _draw(centers: torch.Tensor, n: int, gen: torch.Generator):
    """n i.i.d. points of the task: a uniform class, its center plus N(0, 2^2) noise."""
    y = torch.randint(len(centers), (n,), generator=gen)
    return centers[y] + 2.0 * torch.randn((n, *centers.shape[1:]), generator=gen), y


def _assert_no_certificate_below_its_test_error(seed: int, certify) -> None:
    """``SAMPLES`` independent draws of n = 2,000 points (and 20,000 fresh ones) from the
    same task; ``certify(model, x, y, draw)`` trains the fresh ``mlp-small`` and returns
    its certificate; none may lie below the trained network's error on the fresh points."""
    centers = torch.randn((4, 1, 8, 8), generator=torch.Generator().manual_seed(123))
    violations, gaps = 0, []
    for draw in range(SAMPLES):
        gen = torch.Generator().manual_seed(seed + draw)
        x, y = _draw(centers, 2000, gen)
        xt, yt = _draw(centers, 20000, gen)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(draw)
            model = compact_model("mlp-small", (1, 8, 8))
        cert = certify(model, x, y, draw)
        with torch.no_grad():
            test_error = float((model(xt).argmax(1) != yt).double().mean())
        violations += cert.value < test_error
        gaps.append(cert.value - test_error)
        print(f"sample {draw}: certificate {cert.value:.4f} ({cert.length.total} bits, "
              f"n {cert.n}), test error {test_error:.4f}")
    print(f"{SAMPLES} samples: min certificate - test error {min(gaps):.4f}, median "
          f"{sorted(gaps)[len(gaps) // 2]:.4f}, violations {violations}")
    assert violations == 0
    assert all(math.isfinite(g) for g in gaps)


@pytest.mark.slow
def test_no_certificate_below_its_test_error_on_independent_samples():
    def certify(model, x, y, draw):
        train_recipe(model, x, y, "prune-retrain", 0.5, 20, 64, 3e-3, draw)
        return compression_bound(model.eval(), (1, 8, 8), x, y, search=SEARCH)

    _assert_no_certificate_below_its_test_error(10_000, certify)


@pytest.mark.slow
def test_no_reference_certificate_below_its_test_error_on_independent_samples():
    """The same with the data-dependent code (``pathlift.bounds.reference``): on 20
    independent samples of n = 2,000, ``train_with_reference`` (the reference trained on
    half, the network fine-tuned on all, pulled to it) and the certificate counted on the
    other half; none below the network's error on 20,000 fresh points."""
    def certify(model, x, y, draw):
        reference = train_with_reference(model, x, y, 2, 20, 64, 3e-3, draw, pull=0.3)
        return compression_bound(model.eval(), (1, 8, 8), x, y, search=SEARCH,
                                 reference=reference)

    _assert_no_certificate_below_its_test_error(20_000, certify)
