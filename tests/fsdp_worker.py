"""Ranks of a gloo group on the CPU for tests/test_fsdp.py: ``spawn(scenario, world, tmp)``
starts ``world`` processes (``torch.multiprocessing``, spawn), each joins the group through
``pathlift.distributed.launched``, runs ``SCENARIOS[scenario](rank, world, **options)`` and
saves what it returns; the caller gets every rank's result, in rank order, or a failure
with the rank's traceback. Each process ends through ``exit_process`` (gloo's worker
threads can abort a normal interpreter exit)."""

from __future__ import annotations

import itertools
import os
import socket
import sys
import time
import traceback
import types
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

import cpu_torchvision  # noqa: F401  (a spawned rank imports torchvision through Lightning)
from pathlift.distributed import exit_process, launched
from pathlift.models import mlp, resnet18, small_cnn

# the ranks are new interpreters, without conftest.py's stand-in for torchvision's
# compiled operators (lightning, which the tracker scenario imports, imports torchvision)
sys.modules.setdefault("torchvision._meta_registrations",
                       types.ModuleType("torchvision._meta_registrations"))

SHAPE = (1, 8, 8)
SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {}


def scenario(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(rank: int, world: int, port: int, out: str, name: str, options: dict) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        with launched("gloo", timeout=timedelta(seconds=options.pop("timeout", 60))):
            result = SCENARIOS[name](rank, world, **options)
        torch.save(result, Path(out, f"rank{rank}.pt"))
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        exit_process(1)
    exit_process(0)


def spawn(name: str, world: int, tmp: Path, limit: float = 180, **options: Any
          ) -> list[dict[str, Any]]:
    """Every rank's result of scenario ``name`` on ``world`` processes; fails with the
    first rank's traceback, or when they have not finished within ``limit`` seconds."""
    tmp.mkdir(parents=True, exist_ok=True)
    context = mp.start_processes(_main, (world, _free_port(), str(tmp), name, options),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit
    try:
        for p in context.processes:
            p.join(max(1.0, deadline - time.monotonic()))
    finally:
        alive = [p for p in context.processes if p.is_alive()]
        for p in alive:
            p.kill()
    errors = sorted(tmp.glob("rank*.err"))
    assert not errors, errors[0].read_text()
    assert not alive, f"{len(alive)} of {world} ranks still ran after {limit} s"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(world)]


# --------------------------------------------------------------------------- models


class UNetBlock(nn.Module):
    """One level of a U-Net (Ronneberger et al. 2015): double conv, max-pool, double conv,
    a transposed convolution back up, concatenation with the skip, a 1x1 head with two
    classes (an empty shard on three ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(6, 6, 3, padding=1), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.bottom = nn.Sequential(nn.Conv2d(6, 10, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(10, 5, 2, stride=2)
        self.fuse = nn.Sequential(nn.Conv2d(11, 6, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        y = self.up(self.bottom(self.pool(skip)))
        return self.head(self.fuse(torch.cat([skip, y], dim=1)))


def _pruned() -> nn.Module:
    """small_cnn pruned with torch.nn.utils.prune before sharding (masks as buffers)."""
    from torch.nn.utils import prune

    model = small_cnn()
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            prune.l1_unstructured(m, "weight", amount=0.5)
    prune.random_unstructured(model.classifier[1], "bias", amount=0.5)
    return model


def _far() -> nn.Module:
    """The uneven MLP with layers far from 1 in scale (first layer x 2^-40, last x 2^30):
    each layer enters the |theta|^q pass in a unit other than 1, and a sharded layer's
    unit must be the whole layer's, the same on every rank."""
    model = mlp(64, (33, 7), 2)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        linears[0].weight.mul_(2.0**-40)
        linears[-1].weight.mul_(2.0**30)
    return model


def _resnet18() -> nn.Module:
    """ResNet-18 with 10 classes and BatchNorm statistics of its own (eval mode)."""
    model = resnet18(num_classes=10)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "small_cnn": (small_cnn, SHAPE),
    "mlp": (lambda: mlp(64, (33, 7), 2), SHAPE),  # 7 and 2 rows: uneven, empty on 3 ranks
    "resnet18": (_resnet18, (3, 32, 32)),
    "unet": (UNetBlock, (1, 8, 8)),
    "pruned": (_pruned, SHAPE),
    "far": (_far, SHAPE),
}


def built(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name][0]()


def shard(model: nn.Module, per_layer: bool) -> nn.Module:
    """``fully_shard`` every layer with parameters, then the root (per-layer), or the root
    alone (whole model), on the default group's mesh."""
    from torch.distributed.fsdp import fully_shard

    if per_layer:
        for m in list(model.modules())[1:]:
            if any(True for _ in m.parameters(recurse=False)):
                fully_shard(m)
    return fully_shard(model)


def train_step(model: nn.Module, x: torch.Tensor) -> float:
    """One SGD step on sum(model(x)^2): the model still trains."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    opt.zero_grad()
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    return loss.item()


# --------------------------------------------------------------------------- scenarios


@scenario
def trace_keeps_rng(rank: int, world: int) -> dict[str, Any]:
    """Tracing an FSDP2 model (per layer and whole) leaves the global RNG, the model's
    parameters and its next training step alone."""
    from pathlift.graph import graph_of

    found: dict[str, Any] = {}
    for per_layer in (True, False):
        torch.manual_seed(0)
        model = shard(small_cnn(), per_layer)
        kinds = {type(p).__name__ for p in model.parameters()}
        state = torch.get_rng_state()
        graph = graph_of(model, SHAPE)
        key = "layer" if per_layer else "whole"
        found[key] = {
            "rng": bool(torch.equal(state, torch.get_rng_state())),
            "d_out": graph.d_out,
            "kinds": sorted(kinds) == sorted({type(p).__name__ for p in model.parameters()}),
            "loss": train_step(model, torch.ones(2, *SHAPE)),
        }
    return found


def _norms(model: nn.Module, shape: tuple[int, ...]) -> dict[str, float | None]:
    from pathlift.bounds import lipschitz_input
    from pathlift.lift import path_norms

    found = {f"q{q:g}": n.log10 for q, n in path_norms(model, shape, qs=(1, 2, 8)).items()}
    bound = lipschitz_input(model, shape)
    found["lipschitz"] = bound.log10
    found["product"] = bound.layer_product.log10 if bound.layer_product else None
    return found


def _halved(model: nn.Module) -> nn.Module:
    """``model`` with every parameter halved: same signs, dominated (Lemma 3.4.1)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model


@scenario
def path_norms(rank: int, world: int, names: tuple[str, ...]) -> dict[str, Any]:
    """Float64 path-norms (q = 1, 2, 8), the input-Lipschitz bound and the parameter one
    against the halved model (an exact path-metric) of each model, unsharded (every rank
    alone) and sharded, per layer and whole; the sharded model trains after each call."""
    from pathlift.bounds import lipschitz_params
    from pathlift.graph import copy_model

    found: dict[str, Any] = {}
    for name in names:
        shape = MODELS[name][1]
        for per_layer in (True, False):
            model, other = built(name), _halved(built(name))
            reference = _norms(copy_model(model), shape)
            reference["params"] = lipschitz_params(copy_model(model), copy_model(other),
                                                   shape).log10
            shard(model, per_layer)
            shard(other, per_layer)
            key = f"{name}/{'layer' if per_layer else 'whole'}"
            found[key] = {"reference": reference, "sharded": _norms(model, shape)}
            found[key]["sharded"]["params"] = lipschitz_params(model, other, shape).log10
            model.train()
            found[key]["loss"] = train_step(model, torch.ones(2, *shape))
            model.eval()
            found[key]["after"] = _norms(model, shape)["q1"]  # measured again after a step
    return found


def _local_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of a plain tensor split as FSDP2 splits a parameter."""
    parts = torch.chunk(t, world)
    return parts[rank] if rank < len(parts) else t[:0]


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, penalty: Callable[..., Any],
          strength: float, route: str = "loss") -> float:
    """One SGD step on cross-entropy + strength * penalty(model): the penalty in the loss
    (``route`` "loss"), or added to .grad after the loss's backward ("backward",
    ``PathNormPenalty.backward``); the penalty's value."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    out = model(x)
    if route == "backward":
        nn.functional.cross_entropy(out.flatten(1), y).backward()
        value = penalty.backward(model, strength)
    else:
        value = penalty(model)
        (nn.functional.cross_entropy(out.flatten(1), y) + strength * value).backward()
        value = value.item()
    opt.step()
    return value


@scenario
def penalty_step(rank: int, world: int, names: tuple[str, ...], penalty: str = "log-l1"
                 ) -> dict[str, Any]:
    """One training step on cross-entropy + 0.1 * penalty, the penalty in the loss and by
    its ``backward`` (an MLP's by the compiled chain on the plain model): the plain model
    on the whole batch (every rank alone) against the FSDP2 model, each rank on its slice
    of the batch (FSDP2 averages the cross-entropy gradients; the penalty's is exact on
    each shard), after the plain penalty was recorded and replayed on the same model.
    Returns the largest gap between each rank's updated shard and the plain update."""
    from pathlift.graph import copy_model
    from pathlift.train import make_penalty

    found: dict[str, Any] = {}
    for name in names:
        shape = MODELS[name][1]
        x = torch.randn(2 * world, *shape, generator=torch.Generator().manual_seed(1))
        y = torch.arange(2 * world) % 2
        mine = slice(2 * rank, 2 * rank + 2)
        for per_layer, route in itertools.product((True, False), ("loss", "backward")):
            model = built(name)
            plain = copy_model(model)
            pen = make_penalty(penalty, shape)
            pen(plain)  # recorded: the plain step replays it (or runs its chain)
            ref_pen = _step(plain, x, y, pen, 0.1, route)
            pen(model), pen(model)  # recorded and replayed: sharding must record it anew
            shard(model, per_layer)
            value = _step(model, x[mine], y[mine], pen, 0.1, route)
            gap, scale = _gap(model, plain, rank, world)
            key = f"{name}/{'layer' if per_layer else 'whole'}/{route}"
            found[key] = {"penalty": value, "reference": ref_pen, "gap": gap, "scale": scale,
                          "moved": _moved(plain, built(name)),
                          "loss": train_step(model, torch.ones(2, *shape))}
    return found


def _gap(model: nn.Module, plain: nn.Module, rank: int, world: int) -> tuple[float, float]:
    """The largest gap between the FSDP2 model's shards and the plain model's chunks, and
    the largest plain value."""
    updated = dict(plain.named_parameters())
    gap, scale = 0.0, 0.0
    for n, p in model.named_parameters():
        want = _local_rows(updated[n].detach(), rank, world)
        if want.numel():
            gap = max(gap, float((p.to_local().detach() - want).abs().max()))
            scale = max(scale, float(want.abs().max()))
    return gap, scale


def _moved(model: nn.Module, start: nn.Module) -> float:
    """How far one step moved the parameters (largest change)."""
    before = dict(start.named_parameters())
    return max(float((p.detach() - before[n].detach()).abs().max())
               for n, p in model.named_parameters())


@scenario
def scores(rank: int, world: int, names: tuple[str, ...]) -> dict[str, Any]:
    """Path-magnitude and magnitude scores (biases included) of the FSDP2 model against
    rank ``rank``'s chunk (dim 0) of the plain model's; the largest relative gap."""
    from pathlift.graph import copy_model
    from pathlift.prune import global_masks, magnitude_scores, path_magnitude_scores

    found: dict[str, Any] = {}
    for name in names:
        shape = MODELS[name][1]
        for per_layer in (True, False):
            model = built(name)
            plain = copy_model(model)
            shard(model, per_layer)
            key = f"{name}/{'layer' if per_layer else 'whole'}"
            found[key] = {}
            for fn in (path_magnitude_scores, magnitude_scores):
                want = fn(plain, shape, include_biases=True)
                got = fn(model, shape, include_biases=True)
                gap, kinds = 0.0, set()
                for n, t in want.tensors.items():
                    mine = got.tensors[n]
                    kinds.add(f"{type(mine).__name__}{tuple(mine.placements)}")
                    a = mine.to_local().double() * 10 ** got.log10_scale
                    b = _local_rows(t.double() * 10 ** want.log10_scale, rank, world)
                    if b.numel():
                        gap = max(gap, float((a - b).abs().max() / b.abs().max().clamp_min(
                            1e-300)))
                masks = {}
                for amount in (0.3, 0.7):  # the pruned model: 0.3 only prunes tied zeros
                    mine, plain_masks = global_masks(got, amount), global_masks(want, amount)
                    masks[amount] = all(torch.equal(mine[n].to_local(), _local_rows(
                        plain_masks[n], rank, world)) for n in plain_masks)
                found[key][fn.__name__] = {
                    "gap": gap, "kinds": sorted(kinds), "names": list(got.tensors) == list(
                        want.tensors), "sum": got.log10_sum(), "want_sum": want.log10_sum(),
                    "numel": got.numel() == want.numel(), "masks": masks,
                    "zeros": (got.zero_fraction(), want.zero_fraction())}
            found[key]["loss"] = train_step(model, torch.ones(2, *shape))
    return found


class _Logged(nn.Module):
    """What the Lightning callbacks need of a LightningModule: the network as an
    attribute, ``log`` and ``log_dict`` (recorded)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.logged = net, {}

    def log_dict(self, values: dict[str, Any], **options: Any) -> None:
        self.logged.update(values)

    def log(self, name: str, value: Any, **options: Any) -> None:
        self.logged[name] = float(value)


@scenario
def tracker(rank: int, world: int, names: tuple[str, ...]) -> dict[str, Any]:
    """PathNormTracker (path-norms, both bounds, sparsities) and the Lightning callbacks
    on the FSDP2 model against the plain model's, every rank calling; then one step with
    PathNormRegularizer adding its gradient after the backward, against the plain step."""
    from types import SimpleNamespace

    from pathlift.graph import copy_model
    from pathlift.integrations.lightning import PathNormCallback, PathNormRegularizer
    from pathlift.track import PathNormTracker

    found: dict[str, Any] = {}
    for name in names:
        shape = MODELS[name][1]
        data = (torch.randn(16, *shape, generator=torch.Generator().manual_seed(2)),
                torch.arange(16) % 2)
        for per_layer in (True, False):
            model = built(name)
            plain = copy_model(model)
            track = PathNormTracker(shape, n_train=1000, sigma=1.0, train_data=data)
            want = track(plain, 0)
            shard(model, per_layer)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)  # before any forward, as FSDP2
            got = PathNormTracker(shape, n_train=1000, sigma=1.0, train_data=data)(model, 0)
            holder = _Logged(model)
            PathNormCallback(shape, n_train=1000, sigma=1.0, network="net").on_train_epoch_end(
                SimpleNamespace(current_epoch=0), holder)
            key = f"{name}/{'layer' if per_layer else 'whole'}"
            found[key] = {"want": want, "got": got, "logged": holder.logged}
            x, y = data[0][2 * rank:2 * rank + 2], data[1][2 * rank:2 * rank + 2]
            regularizer = PathNormRegularizer(shape, "log-l1", strength=0.1, network="net")
            nn.functional.cross_entropy(model(x).flatten(1), y).backward()
            regularizer.on_after_backward(None, holder)
            opt.step()
            pen = PathNormRegularizer(shape, "log-l1").penalty
            _step(plain, data[0][:2 * world], data[1][:2 * world], pen, 0.1)
            found[key]["gap"] = _gap(model, plain, rank, world)[0]
            found[key]["loss"] = train_step(model, torch.ones(2, *shape))
    return found


def _outcome(call: Callable[[], Any]) -> Any:
    """What a call returns, or its typed error as ("ErrorType", message)."""
    from pathlift.errors import PathliftError

    try:
        return call()
    except PathliftError as err:
        return (type(err).__name__, str(err))


@scenario
def fsdp1(rank: int, world: int, name: str = "small_cnn") -> dict[str, Any]:
    """FullyShardedDataParallel (FSDP1), use_orig_params False and True, root and per
    layer: refused outside summon_full_params (before a forward, between a forward and
    its backward), exact inside it on a rank that holds the gathered parameters, refused
    on the others; the model trains after every call."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: N817
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from pathlift.lift import path_norms
    from pathlift.lift.differentiable import differentiable_path_norm
    from pathlift.track import PathNormTracker

    shape = MODELS[name][1]

    def norms(model: nn.Module) -> Any:
        return _outcome(lambda: [n.log10 for n in path_norms(model, shape, (1, 2, 8)).values()])

    found: dict[str, Any] = {}
    for orig in (False, True):
        for per_layer in (False, True):
            model = built(name)
            policy = ModuleWrapPolicy({nn.Linear, nn.Conv2d}) if per_layer else None
            model = FSDP(model, use_orig_params=orig, auto_wrap_policy=policy,
                         device_id=torch.device("cpu"))
            x = torch.ones(2, *shape)
            row: dict[str, Any] = {"before": norms(model),
                                   "tracker": _outcome(lambda m=model: PathNormTracker(
                                       shape, sparsity=False)(m))}
            row["step1"] = train_step(model, x)
            loss = model(x).pow(2).sum()
            row["mid"] = norms(model)  # between the forward and its backward
            loss.backward()
            with FSDP.summon_full_params(model, rank0_only=True, writeback=False):
                row["rank0_only"] = norms(model)
                row["penalty"] = _outcome(lambda m=model: differentiable_path_norm(m, shape))
            with FSDP.summon_full_params(model, writeback=False):
                row["everyone"] = norms(model)
                plain = built(name)  # the weights now, as a plain model
                plain.load_state_dict({n: p.detach().clone()
                                       for n, p in model.named_parameters()})
            row["reference"] = [n.log10 for n in path_norms(plain, shape, (1, 2, 8)).values()]
            row["step2"] = train_step(model, x)
            found[f"orig={orig}/{'layer' if per_layer else 'root'}"] = row
    return found


@scenario
def alone(rank: int, world: int, done: str) -> dict[str, Any]:
    """Rank 0 measures the FSDP2 model while rank 1 does not join: it waits, outside
    torch.distributed, until rank 0 has written the file ``done``. Rank 0 gets a typed
    error within the group's timeout (gloo then closes the connections: run it alone)."""
    from pathlift.graph import graph_of
    from pathlift.lift import path_norm

    model = shard(built("small_cnn"), per_layer=True)
    found: dict[str, Any] = {}
    if rank == 0:
        graph = graph_of(model, SHAPE)  # traced first: what is timed is the wait
        start = time.monotonic()
        found["outcome"] = _outcome(lambda: path_norm(graph).log10)
        found["seconds"] = time.monotonic() - start
        Path(done).touch()
    while not Path(done).exists():
        time.sleep(0.1)
    return found


@scenario
def boundary(rank: int, world: int) -> dict[str, Any]:
    """DTensor parameters set by hand: replicated ones are read (exactly), others refused
    in one line, never read as numbers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from pathlift.graph import copy_model
    from pathlift.lift import path_norm

    mesh = init_device_mesh("cpu", (world,))
    found: dict[str, Any] = {}
    for key, placement in (("replicate", Replicate()), ("shard0", Shard(0)),
                           ("shard1", Shard(1))):
        model = built("mlp")
        want = path_norm(copy_model(model), SHAPE).log10
        for layer in (model[1], model[3]):
            layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh,
                                                          [placement]))
        found[key] = (want, _outcome(lambda m=model: path_norm(m, SHAPE).log10))
    return found


def _largest_allocation(call: Callable[[], Any]) -> int:
    """The largest allocation (bytes) of one torch op that ``call`` runs, forward and
    backward: the profiler's CPU memory (torch's CPU allocator) attributed to the op
    itself."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    return max((e.self_cpu_memory_usage for e in prof.events()), default=0)


@scenario
def memory(rank: int, world: int) -> dict[str, Any]:
    """The largest allocation of each sharded pass on an MLP whose 2048 x 256 layer holds
    nearly all the weights, against the size of that layer's full weight."""
    from pathlift.lift import path_norm
    from pathlift.lift.differentiable import differentiable_path_norm
    from pathlift.prune import path_magnitude_scores

    torch.manual_seed(0)
    shape = (1, 16, 16)
    found: dict[str, Any] = {}
    for per_layer in (True, False):
        model = shard(mlp(256, (2048,), 10), per_layer)
        calls = {"path_norm q=1": lambda m=model: path_norm(m, shape),
                 "path_norm q=8": lambda m=model: path_norm(m, shape, q=8),
                 "penalty + backward": lambda m=model: differentiable_path_norm(
                     m, shape).backward(),
                 "scores": lambda m=model: path_magnitude_scores(m, shape)}
        for call in calls.values():
            call()  # traced, workspace grown: what every later call finds
        key = "layer" if per_layer else "whole"
        found[key] = {name: _largest_allocation(call) for name, call in calls.items()}
    plain = mlp(256, (2048,), 10)  # the control: the plain model's scores
    path_magnitude_scores(plain, shape)
    found["plain scores"] = _largest_allocation(lambda: path_magnitude_scores(plain, shape))
    found["weight"] = 2048 * 256  # entries of the largest full weight
    return found


#: The scenarios of the default test selection with their options, run by ``everything``
#: in one 2-rank group (one start of the processes for all).
DEFAULT: dict[str, dict[str, Any]] = {
    "trace_keeps_rng": {},
    "path_norms": {"names": ("small_cnn", "mlp", "unet", "pruned", "far")},
    "penalty_step": {"names": ("small_cnn", "unet", "mlp"), "penalty": "log-l1"},
    "scores": {"names": ("small_cnn", "pruned")},
    "tracker": {"names": ("small_cnn",)},
    "fsdp1": {},
    "boundary": {},
    "memory": {},
}


@scenario
def everything(rank: int, world: int) -> dict[str, Any]:
    """Every scenario of ``DEFAULT``, in turn, in one group."""
    return {name: SCENARIOS[name](rank, world, **options) for name, options in DEFAULT.items()}
