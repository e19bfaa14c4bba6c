"""A user's own project in a folder: a models module, a nets.py file in a sub-folder, and
data as .npz, CSV and an image folder (the files a new user brings to pathlift)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODULE = "pathlift_user_models"  # a name no other test module imports

MODELS = '''
from torch import nn


def relu_mlp():
    return nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))


relu_mlp.input_shape = (20,)


def bn_cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 3))


bn_cnn.input_shape = (1, 8, 8)
'''

NETS = '''
from torch import nn


class Net(nn.Module):
    input_shape = (20,)

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x):
        return self.body(x)
'''


def write_project(folder: Path, n: int = 150, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the user's files into ``folder``; returns the arrays of data.npz / data.csv."""
    from PIL import Image

    (folder / f"{MODULE}.py").write_text(MODELS)
    (folder / "lib").mkdir()
    (folder / "lib" / "nets.py").write_text(NETS)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(3, 20))[y] + 0.5 * rng.normal(size=(n, 20))).astype(np.float32)
    np.savez(folder / "data.npz", x=x, y=y)
    rows = [",".join([*(f"f{i}" for i in range(20)), "label"])]
    rows += [",".join([*(repr(float(v)) for v in xi), str(yi)]) for xi, yi in zip(x, y,
                                                                                strict=True)]
    (folder / "data.csv").write_text("\n".join(rows) + "\n")
    for c in range(3):
        sub = folder / "images" / f"class{c}"
        sub.mkdir(parents=True)
        for i in range(16):
            pixels = np.clip(rng.normal(60 + 60 * c, 30, size=(8, 8)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8), mode="L").save(sub / f"{i}.png")
    write_zoo_data(folder, seed=seed + 1)
    return {"x": x, "y": y}


ZOO_DATA = {"images3.npz": (3, 8, 8), "signals.npz": (2, 16), "tabular.npz": (12,)}


def write_zoo_data(folder: Path, n: int = 96, seed: int = 1) -> None:
    """Data for the models of ``user_zoo``: 3 classes of Gaussian clusters, as images
    (3, 8, 8), 1-D signals (2, 16) and tabular rows (12,)."""
    rng = np.random.default_rng(seed)
    for name, shape in ZOO_DATA.items():
        y = rng.integers(0, 3, n)
        x = rng.normal(size=(3, *shape))[y] + 0.8 * rng.normal(size=(n, *shape))
        np.savez(folder / name, x=x.astype(np.float32), y=y)
