"""Cost of a path-norm on timm's models, as multiples of one float32 forward pass.

    .venv/bin/python benchmarks/bench_timm.py [--rounds 5] [--models resnet18 dla34 ...]
        [--out benchmarks/results/bench_timm.csv]

For each timm model pathlift measures (the families issue 38 found inside the theory, or
those named; a model pathlift refuses is listed as refused and left out), at its declared
input (timm's ``pretrained_cfg["input_size"]``) and batch 1, timed in turns in the same run
with one intra-op thread and each sample the thread's CPU time: one float32 forward pass
(the baseline); the first ``path_norm`` call, float32, on a model object never seen before
(trace, validation and the |theta| pass: what a user pays once); a repeated call after an
in-place weight update (the cached graph). Each figure is the median over the rounds of
its ratio to the forward timed in the same round. Goal (issue 38): the first call's
median over the models <= 1.8x, none above 3x. Writes one CSV row per model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

# timm imports torchvision, whose compiled operators need a torchvision built for this
# torch; its model definitions do not (as tests/conftest.py does)
sys.modules.setdefault("torchvision._meta_registrations",
                       types.ModuleType("torchvision._meta_registrations"))

import torch  # noqa: E402

from pathlift.errors import PathliftError  # noqa: E402
from pathlift.files import write_text  # noqa: E402
from pathlift.graph import check, copy_model  # noqa: E402
from pathlift.lift import path_norm  # noqa: E402
from timing import round_robin  # noqa: E402

#: one model of each family issue 38 measured (tests/timm_scan.py INSIDE_TODAY)
MODELS = ("resnet18", "resnet26d", "resnet26t", "resnext50_32x4d", "wide_resnet50_2",
          "res2net50_14w_8s", "res2next50", "dla34", "hrnet_w18_small", "selecsls42",
          "legacy_xception")
GOAL_MEDIAN, GOAL_MAX = 1.8, 3.0


def cases(model: torch.nn.Module, shape: tuple[int, ...]) -> dict:
    x = torch.randn(1, *shape)
    first_param = next(model.parameters())

    def forward():
        return lambda: model(x)

    def first():
        fresh = copy_model(model)  # a model object pathlift has never seen
        return lambda: path_norm(fresh, shape, dtype=torch.float32)

    def repeat():
        with torch.no_grad():
            first_param.mul_(1.0001)  # an optimiser step: the cached graph stays valid
        return lambda: path_norm(model, shape, dtype=torch.float32)

    return {"forward": forward, "first": first, "repeat": repeat}


def main() -> None:
    import timm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", default="benchmarks/results/bench_timm.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, timm {timm.__version__}, 1 thread, batch 1, median "
          f"of {args.rounds} round-robin rounds (thread CPU time); ratios to one float32 "
          "forward pass in the same round")
    rows, firsts = ["model,input,forward_ms,first_x,repeat_x"], []
    for name in args.models:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).eval()
        shape = tuple(model.pretrained_cfg["input_size"])
        report = check(model, shape)
        if not report.ok:
            print(f"{name:<18} refused: {report.problems[0]}")
            continue
        try:
            path_norm(model, shape, dtype=torch.float32)  # the repeated call's graph
            with torch.no_grad():
                times = round_robin(cases(model, shape), args.rounds, min_sample=0,
                                    setup=True, clock=time.thread_time)
        except PathliftError as err:  # the memory limit of a busy machine, say
            print(f"{name:<18} not measured: {str(err).splitlines()[0]}")
            continue
        base = times.pop("forward")
        ratios = {k: statistics.median(t / b for t, b in zip(ts, base, strict=True))
                  for k, ts in times.items()}
        firsts.append(ratios["first"])
        forward_ms = statistics.median(base) * 1e3
        print(f"{name:<18} {shape}  forward {forward_ms:7.1f} ms  first {ratios['first']:5.2f}x"
              f"  repeat {ratios['repeat']:5.2f}x", flush=True)
        rows.append(f"{name},{'x'.join(map(str, shape))},{forward_ms:.2f},"
                    f"{ratios['first']:.3f},{ratios['repeat']:.3f}")
    if firsts:
        median, worst = statistics.median(firsts), max(firsts)
        met = "met" if median <= GOAL_MEDIAN and worst <= GOAL_MAX else "NOT met"
        print(f"first call: median {median:.2f}x, max {worst:.2f}x over {len(firsts)} models "
              f"(goal <= {GOAL_MEDIAN}x median, <= {GOAL_MAX}x each: {met})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
