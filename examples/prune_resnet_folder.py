"""Prune-rewind-retrain a torchvision ResNet on your own image folder, with your own
training loop, on one process or on all of torchrun's (thesis Sec. 3.5.2, App. E.1).

    .venv/bin/python examples/prune_resnet_folder.py DATA --epochs 10
    .venv/bin/torchrun --standalone --nproc_per_node 4 examples/prune_resnet_folder.py DATA

DATA holds ``train/<class>/*.jpg`` and ``val/<class>/*.jpg`` (torchvision's ImageFolder).
The loop below is the user's: SGD with the thesis' step schedule (learning rate / 10 at
1/3, 2/3 and 8/9 of the epochs, Appendix E.1), continued from the rewind epoch when
retraining. Results go to ``--out`` (``runs.csv``, dense and final weights); a killed run
started again with the same options resumes. Needs torchvision: without it (or with a
torchvision that does not load against this torch) the script says so and exits with 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from pathlift.distributed import exit_process, launched
from pathlift.jobs.prune import Phase, PruneConfig, RunFolder, prune_rewind_retrain


def step_lr(base: float, epochs: int, epoch: int) -> float:
    """The thesis' schedule (90 epochs: / 10 at 30, 60, 80), scaled to ``epochs``."""
    return base * 0.1 ** sum(epoch >= round(epochs * m / 90) for m in (30, 60, 80))


def make_training(train_loader: DataLoader, val_loader: DataLoader, lr: float, epochs: int
                  ) -> tuple[Callable[[nn.Module, int, Phase], None],
                             Callable[[nn.Module], float]]:
    """Your ``train(model, epochs, phase)`` and ``evaluate(model) -> float``."""

    def train(model: nn.Module, count: int, phase: Phase) -> None:
        device = next(model.parameters()).device
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
        loader = phase.loader(train_loader)  # this rank's shard under DDP
        for epoch in phase.epochs(count):  # absolute epochs: the schedule goes on
            for group in opt.param_groups:
                group["lr"] = step_lr(lr, epochs, epoch)
            model.train()
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()
                opt.step()

    def evaluate(model: nn.Module) -> float:
        device = next(model.parameters()).device
        correct = seen = 0
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                correct += int((model(x.to(device)).argmax(1).cpu() == y).sum())
                seen += len(y)
        return correct / seen

    return train, evaluate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="folder with train/ and val/ class folders")
    parser.add_argument("--arch", default="resnet18", help="torchvision model name")
    parser.add_argument("--size", type=int, default=224, help="image side after resizing")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--rewind-epoch", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=256, help="per process")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--amount", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.8])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/prune-resnet-folder"))
    args = parser.parse_args(argv)
    try:
        import torchvision
        from torchvision import datasets, transforms
    except Exception as err:  # absent, or built against another torch
        print(f"skipped: this example needs torchvision ({type(err).__name__}: {err})")
        return 0

    normalise = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    augment = transforms.Compose([transforms.RandomResizedCrop(args.size),
                                  transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                  normalise])
    plain = transforms.Compose([transforms.Resize(args.size * 8 // 7),
                                transforms.CenterCrop(args.size), transforms.ToTensor(),
                                normalise])
    train_set = datasets.ImageFolder(args.data / "train", augment)
    val_set = datasets.ImageFolder(args.data / "val", plain)
    train_loader = DataLoader(train_set, args.batch_size, shuffle=True,
                              num_workers=args.workers, pin_memory=True)
    val_loader = DataLoader(val_set, args.batch_size, num_workers=args.workers)

    def model_fn() -> nn.Module:
        return torchvision.models.get_model(args.arch, weights=None,
                                            num_classes=len(train_set.classes))

    train, evaluate = make_training(train_loader, val_loader, args.lr, args.epochs)
    config = PruneConfig(amounts=tuple(args.amount), seeds=tuple(range(args.seeds)),
                         epochs=args.epochs, rewind_epoch=args.rewind_epoch)
    with launched() as world:
        result = prune_rewind_retrain(model_fn, (3, args.size, args.size), train, evaluate,
                                      config, folder=RunFolder(args.out), save_models=True,
                                      on_progress=lambda text, done, total: print(
                                          f"[{done}/{total}] {text}", flush=True))
        if world.main:
            for row in result.summary():
                print(row)
    return 0


if __name__ == "__main__":
    exit_process(main())  # sys.exit, or os._exit after a torchrun group (see its docstring)
