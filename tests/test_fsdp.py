"""Sharded models (FSDP2 ``fully_shard``, FSDP1) on gloo CPU groups of 2 and 3 processes:
the ranks run scenarios of ``fsdp_worker`` and every number is compared with the plain
model's."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_worker import DEFAULT, spawn

# its own 2- and 3-process groups: `make test` runs it alone, after the parallel run
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every rank's results of the default scenarios, from one 2-rank group."""
    return spawn("everything", 2, tmp_path_factory.mktemp("fsdp"), limit=900)


def ranks_of(request: pytest.FixtureRequest, name: str, world: int = 2, **options: object
             ) -> list[dict]:
    """Every rank's result of scenario ``name``: taken from the shared 2-rank run when it
    is one of the default scenarios, else from a group of its own."""
    if world == 2 and DEFAULT.get(name) == options:
        return [found[name] for found in request.getfixturevalue("two_ranks")]
    return spawn(name, world, request.getfixturevalue("tmp_path"), limit=600, **options)


def test_tracing_an_fsdp2_model_leaves_the_rng_and_the_model_alone(
        request: pytest.FixtureRequest) -> None:
    ranks = ranks_of(request, "trace_keeps_rng")
    for found in ranks:
        for key in ("layer", "whole"):
            assert found[key]["rng"], key  # FSDPModule.__new__ re-ran __init__ before
            assert found[key]["d_out"] == 10 and found[key]["kinds"]
            assert found[key]["loss"] > 0


def _close(a: float, b: float, rel: float = 1e-12) -> bool:
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.parametrize("world, names", [
    (2, DEFAULT["path_norms"]["names"]),  # DEFAULT's options: read from the shared group
    pytest.param(3, ("small_cnn", "mlp", "unet", "pruned", "resnet18"), marks=pytest.mark.slow),
    pytest.param(2, ("resnet18",), marks=pytest.mark.slow),
])
def test_path_norms_and_lipschitz_of_sharded_models_equal_the_plain_ones(
        request: pytest.FixtureRequest, world: int, names: tuple[str, ...]) -> None:
    """q = 1, 2, 8 (above LARGE_Q: each layer divided by its all-reduced unit), the
    input-Lipschitz bound with Pi_{1,1} where it exists and the parameter-Lipschitz bound
    against the halved model (exact path-metric), FSDP2 per layer and whole; on 3
    ranks the MLP's 7- and 2-row layers and the U-Net's 2-channel head split unevenly
    (3, 3, 1 and 1, 1, 0 rows); 'far' has layers 2^-40 and 2^30 from 1, each entering the
    pass in its own all-reduced unit."""
    ranks = ranks_of(request, "path_norms", world, names=names)
    for key, found in ranks[0].items():
        for what, value in found["reference"].items():
            got = found["sharded"][what]
            assert got == value if value is None else _close(got, value), (key, what, got, value)
        assert found["loss"] > 0
    for other in ranks[1:]:
        assert other == ranks[0]  # every rank the same numbers, bit for bit


@pytest.mark.parametrize("world, names, penalty", [
    (2, DEFAULT["penalty_step"]["names"], DEFAULT["penalty_step"]["penalty"]),
    pytest.param(3, ("small_cnn", "mlp", "unet", "pruned"), "log-l1", marks=pytest.mark.slow),
    pytest.param(3, ("mlp", "resnet18"), "l2", marks=pytest.mark.slow),
])
def test_a_penalised_fsdp2_step_updates_every_shard_as_the_plain_step(
        request: pytest.FixtureRequest, world: int, names: tuple[str, ...], penalty: str) -> None:
    """loss = cross-entropy + 0.1 * penalty inside an ordinary FSDP2 step (forward,
    penalty, backward, SGD): the gradient FSDP2 reduce-scatters and the penalty's, put in
    each DTensor's .grad by the sharded pass, give the plain step's update to float32
    round-off, and the model trains on."""
    ranks = ranks_of(request, "penalty_step", world, names=names, penalty=penalty)
    for found in ranks:
        for key, step in found.items():
            assert step["penalty"] == pytest.approx(step["reference"], rel=1e-6), key
            assert step["gap"] <= 1e-6 * step["scale"] + 1e-7, (key, step["gap"])
            assert step["moved"] > 1e-4  # the step moved the weights: the gap is not vacuous
            assert step["loss"] > 0


@pytest.mark.parametrize("world, names", [
    (2, DEFAULT["scores"]["names"]),
    pytest.param(3, ("mlp", "unet", "pruned", "resnet18"), marks=pytest.mark.slow),
])
def test_scores_of_a_sharded_model_are_dtensor_chunks_of_the_plain_scores(
        request: pytest.FixtureRequest, world: int, names: tuple[str, ...]) -> None:
    """path_magnitude_scores and magnitude_scores (biases included) come back as DTensors
    sharded like the parameters, each rank's shard the plain scores' chunk (dim 0); the
    global masks chosen from them (threshold by all-reduced counts) are the plain masks'
    chunks, ties included."""
    ranks = ranks_of(request, "scores", world, names=names)
    for found in ranks:
        for key, model in found.items():
            for fn in ("path_magnitude_scores", "magnitude_scores"):
                got = model[fn]
                assert got["gap"] <= 1e-12, (key, fn, got["gap"])
                assert got["kinds"] == ["DTensor(Shard(dim=0),)"], (key, fn, got["kinds"])
                assert got["names"] and got["numel"]
                assert _close(got["sum"], got["want_sum"]), (key, fn)
                assert got["masks"] == {0.3: True, 0.7: True}, (key, fn)  # all-reduced counts
                assert got["zeros"][0] == got["zeros"][1]
            assert model["loss"] > 0


@pytest.mark.parametrize("world, names", [
    (2, DEFAULT["tracker"]["names"]),
    pytest.param(3, ("mlp", "resnet18"), marks=pytest.mark.slow),
])
def test_the_tracker_and_lightning_callbacks_on_fsdp2_models(
        request: pytest.FixtureRequest, world: int, names: tuple[str, ...]) -> None:
    """Every rank calls; rank 0 gets the plain model's row (path-norms, both bounds,
    sparsities) to 1e-12 and the callback logs it, the others get None; the
    regulariser's gradient, added after FSDP2's backward, gives the plain step."""
    ranks = ranks_of(request, "tracker", world, names=names)
    for rank, found in enumerate(ranks):
        for key, model in found.items():
            want, got = model["want"], model["got"]
            if rank:
                assert got is None and not any(k.endswith("path_norm_log10_q1")
                                               for k in model["logged"]), key
            else:
                assert set(got) == set(want), key
                for name, value in want.items():
                    assert _close(got[name], value), (key, name, got[name], value)
                assert model["logged"]["pathlift/path_norm_log10_q1"] == got[
                    "path_norm_log10_q1"]
            assert model["gap"] <= 1e-6, (key, model["gap"])
            assert model["logged"]["pathlift/penalty"] > 0 and model["loss"] > 0


def _refused(outcome: object, *words: str) -> bool:
    """A typed one-line refusal saying each of ``words``."""
    return (isinstance(outcome, tuple) and outcome[0] == "UnsupportedModelError"
            and "\n" not in outcome[1] and all(w in outcome[1] for w in words))


def test_fsdp1_is_refused_in_one_line_or_exact_inside_summon_full_params(
        request: pytest.FixtureRequest) -> None:
    """FSDP1 segfaulted (freed flat shards), read 1-D shards or broke the model; now:
    refused before anything runs, exact inside summon_full_params where the rank holds
    the parameters, never a hang, and the next training step passes."""
    ranks = ranks_of(request, "fsdp1")
    for rank, found in enumerate(ranks):
        for key, row in found.items():
            for when in ("before", "mid"):
                assert _refused(row[when], "FullyShardedDataParallel", "summon_full_params",
                                "fully_shard"), (key, when, row[when])
            assert row["tracker"] is None if rank else _refused(row["tracker"], "FSDP1")
            assert row["everyone"] == row["reference"] or all(
                _close(a, b) for a, b in zip(row["everyone"], row["reference"], strict=True))
            if rank == 0:
                assert all(_close(a, b) for a, b in zip(row["rank0_only"], row["reference"],
                                                        strict=True)), key
            else:
                assert _refused(row["rank0_only"], "only rank 0"), (key, row["rank0_only"])
            assert _refused(row["penalty"], "FSDP1", "fully_shard"), key
            assert row["step1"] > 0 and row["step2"] > 0


def test_a_rank_measuring_alone_gets_a_typed_error_within_the_timeout(tmp_path: Path
                                                                      ) -> None:
    """Rank 0 calls path_norm on an FSDP2 model, rank 1 does not (group timeout 3 s): a
    one-line DistributedError after about 3 s, not a wait of the default 30 minutes."""
    ranks = spawn("alone", 2, tmp_path, timeout=3, done=str(tmp_path / "done"))
    kind, message = ranks[0]["outcome"]
    assert kind == "DistributedError" and "\n" not in message, ranks[0]
    assert "rank 0: the other ranks did not join" in message
    assert "every rank must call pathlift" in message
    assert ranks[0]["seconds"] < 10, ranks[0]


def test_dtensor_parameters_set_by_hand_are_read_or_refused(
        request: pytest.FixtureRequest) -> None:
    """Replicated DTensors and dim-0 shards are read (exactly); a dim-1 shard is refused
    in one line naming the parameter."""
    for found in ranks_of(request, "boundary"):
        for placement in ("replicate", "shard0"):
            want, got = found[placement]
            assert _close(got, want), (placement, got, want)
        want, got = found["shard1"]
        assert _refused(got, "'1.weight' (Linear) is a DTensor placed as (Shard(dim=1),)")


def test_no_allocation_of_a_sharded_pass_reaches_the_largest_full_weight(
        request: pytest.FixtureRequest) -> None:
    """The largest allocation of one op (torch profiler, CPU memory) in path_norm (q = 1,
    8: float64), the penalty and its backward (float32) and the scores (float64) of an
    FSDP2 MLP whose 2048 x 256 layer holds 98% of the weights: never more than this rank's
    half of that layer in float64 (the scores' |W| leaf), while the plain model's scores
    allocate the whole layer in float64 (the control: the measure sees such a tensor)."""
    for found in ranks_of(request, "memory"):
        shard = found["weight"] * 8 // 2  # bytes of this rank's half, in float64
        for key in ("layer", "whole"):
            for name, largest in found[key].items():
                assert 0 < largest <= shard, (key, name, largest, shard)
        assert found["plain scores"] >= 2 * shard
