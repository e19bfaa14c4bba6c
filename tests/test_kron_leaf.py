"""``pathlift.kron`` is a leaf: its modules import each other and the bottom modules only
(errors, files, rebuilders), never the engine that uses it (``pathlift.graph.ops.kron``)
or a package above it; the loaders (``pathlift.models``) do not import it, and still load a
Kronecker-sparse checkpoint, through the rebuilder ``pathlift.kron`` registers. Read two
ways: the import statements of the source (at any depth, function-local ones included) and
the modules a fresh process holds after ``import pathlift.kron``."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import pathlift
from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.kron import KSLinear, monarch, replace_linears
from pathlift.models import mlp

SRC = Path(pathlift.__file__).parent
KRON_IMPORTS = ("pathlift.kron", "pathlift.errors", "pathlift.files", "pathlift.memory",
                "pathlift.rebuilders")
ARCH = {"in_features": 16, "hidden": [32, 32], "num_classes": 8}


def pathlift_imports(path: Path) -> set[str]:
    """The pathlift names ``path`` imports anywhere in its code (``from pathlift import
    files`` is ``pathlift.files``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "pathlift" or n.startswith("pathlift.")}


def outside(names: set[str], allowed: tuple[str, ...]) -> set[str]:
    return {n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed)}


def test_kron_imports_nothing_above_it():
    files = sorted((SRC / "kron").rglob("*.py"))
    assert len(files) > 10, "the kron package was not found"
    wrong = {f"{path.relative_to(SRC)}: {sorted(bad)}" for path in files
             if (bad := outside(pathlift_imports(path), KRON_IMPORTS))}
    assert not wrong, wrong


def test_models_do_not_import_kron():
    wrong = {f"{path.relative_to(SRC)}: {sorted(bad)}"
             for path in sorted((SRC / "models").rglob("*.py"))
             if (bad := {n for n in pathlift_imports(path)
                         if n == "pathlift.kron" or n.startswith("pathlift.kron.")})}
    assert not wrong, wrong


def test_importing_kron_loads_no_module_above_it():
    code = ("import json, sys, pathlift.kron; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pathlift'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "pathlift.kron.replace" in loaded
    assert not outside(loaded - {"pathlift"}, KRON_IMPORTS), loaded


# A fresh process that imports the loaders only, never pathlift.kron by name.
CHILD = """
import json, sys, torch
from pathlift.models import load_weights, mlp
model = load_weights(mlp(**json.loads(sys.argv[1])), torch.load(sys.argv[2]))
for m in model.modules():
    if hasattr(m, "algorithm"):
        m.algorithm = "bmm"
with torch.no_grad():
    y = model(torch.load(sys.argv[3]))
torch.save(y, sys.argv[4])
print(json.dumps([type(m).__name__ for m in model]))
"""


def test_the_loaders_rebuild_kronecker_layers_without_importing_kron(tmp_path):
    torch.manual_seed(0)
    model = replace_linears(mlp(**ARCH), include=["3"], design={"3": monarch(32, 32, 4)}).model
    model[3].algorithm = "bmm"
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    torch.save(model.state_dict(), tmp_path / "state.pt")
    torch.save(x, tmp_path / "x.pt")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ARCH),
                           str(tmp_path / "state.pt"), str(tmp_path / "x.pt"),
                           str(tmp_path / "y.pt")], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [
        "Flatten", "Linear", "ReLU", "KSLinear", "ReLU", "Linear"]
    assert isinstance(model[3], KSLinear)
    with torch.no_grad():
        assert torch.equal(torch.load(tmp_path / "y.pt"), model(x))
