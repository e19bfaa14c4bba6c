"""examples/: the ResNet-on-an-image-folder script, with and without torchvision."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from torch import nn
from torch.utils.data import DataLoader

from pathlift.data import synthetic
from pathlift.jobs.prune import PruneConfig, RunFolder, prune_rewind_retrain
from pathlift.models import load_weights, read_checkpoint, resnet18

EXAMPLE = Path(__file__).parent.parent / "examples" / "prune_resnet_folder.py"


def _example():
    spec = importlib.util.spec_from_file_location("prune_resnet_folder", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_exits_cleanly_without_torchvision(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    example = _example()
    try:
        import torchvision  # noqa: F401
    except Exception:
        assert example.main([str(tmp_path)]) == 0
        assert capsys.readouterr().out.startswith("skipped: this example needs torchvision")
    else:
        pytest.skip("torchvision loads here: the example would train")


def test_example_training_loop_prunes_a_resnet(tmp_path: Path) -> None:
    """The example's own loop and schedule through the protocol, on pathlift's ResNet-18
    (torchvision's parameter names) and 32x32 synthetic images."""
    example = _example()
    assert [example.step_lr(0.1, 9, e) for e in (0, 2, 3, 6, 8)] == \
        pytest.approx([0.1, 0.1, 0.01, 0.001, 0.0001])
    data = synthetic(n_train=32, n_test=16, input_shape=(3, 32, 32), num_classes=4)
    train, evaluate = example.make_training(DataLoader(data.train, 16, shuffle=True),
                                            DataLoader(data.test, 16), 0.01, 2)
    config = PruneConfig(amounts=(0.5,), methods=("path-magnitude-global",), seeds=(0,),
                         epochs=2, rewind_epoch=1, rescaled=(False,))
    result = prune_rewind_retrain(lambda: resnet18(num_classes=4), (3, 32, 32), train,
                                  evaluate, config, folder=RunFolder(tmp_path),
                                  save_models=True)
    (run,) = result.runs
    assert run.sparsity == pytest.approx(0.5, abs=1e-6)  # amount: of the prunable weights
    assert 0.0 <= run.accuracy <= 1.0
    saved = tmp_path / "models" / "seed0-path-magnitude-global-0.5.safetensors"
    final = load_weights(resnet18(num_classes=4), read_checkpoint(saved).state_dict).eval()
    assert evaluate(final) == run.accuracy  # the final pruned network, masks re-attached
    weights = [m.weight for m in final.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(run.sparsity)
