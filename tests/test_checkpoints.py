"""Checkpoints: bit-identical round trips, torchvision-style state_dicts, refusals."""

from __future__ import annotations

import builtins
import os
import pickle
import stat

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from torch.nn.utils import prune

from pathlift.errors import ArchitectureMismatchError, InvalidParameterError
from pathlift.models import (
    UnsafeCheckpointError,
    get_model,
    load_model,
    mlp,
    read_checkpoint,
    save_checkpoint,
    small_cnn,
    unet,
)


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_identical(a, b):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".pth"])
def test_round_trip_is_bit_identical(tmp_path, suffix):
    torch.manual_seed(0)
    model = small_cnn(in_channels=3, num_classes=4)
    with torch.no_grad():  # non-trivial values everywhere
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    before = _snapshot(model)
    path = save_checkpoint(model, tmp_path / f"net{suffix}", "small_cnn", in_channels=3,
                           num_classes=4)
    _assert_identical(before, model.state_dict())  # saving does not touch the model
    loaded, shape = load_model(path)
    assert shape == (3, 8, 8) and not loaded.training
    _assert_identical(before, loaded.state_dict())
    x = torch.rand(5, 3, 8, 8)
    assert torch.equal(loaded(x), model.eval()(x))


def test_safetensors_metadata_holds_arch_and_kwargs(tmp_path):
    model = unet(in_channels=2, num_classes=3, base=4, depth=2)
    path = save_checkpoint(model, tmp_path / "u.safetensors", "unet", in_channels=2,
                           num_classes=3, base=4, depth=2)
    ckpt = read_checkpoint(path)
    assert ckpt.arch == "unet"
    assert ckpt.kwargs == {"in_channels": 2, "num_classes": 3, "base": 4, "depth": 2}
    loaded, shape = load_model(path, input_shape=(2, 16, 16))
    assert shape == (2, 16, 16)
    _assert_identical(model.state_dict(), loaded.state_dict())


def test_buffers_and_int64_counters_survive(tmp_path):
    model = get_model("mobilenet_relu", num_classes=3, width_mult=0.25)
    model.train()
    with torch.no_grad():
        model(torch.rand(4, 3, 32, 32))  # moves running stats and num_batches_tracked
    path = save_checkpoint(model, tmp_path / "m.safetensors", "mobilenet_relu",
                           num_classes=3, width_mult=0.25)
    loaded, _ = load_model(path)
    _assert_identical(model.state_dict(), loaded.state_dict())
    assert int(loaded.features[0][1].num_batches_tracked) == 1


def test_float64_is_kept(tmp_path):
    model = mlp(64, (8,), 10).double()
    path = save_checkpoint(model, tmp_path / "m64.safetensors", "mlp", hidden=[8])
    loaded, shape = load_model(path)
    assert shape == (1, 8, 8)
    assert all(p.dtype == torch.float64 for p in loaded.parameters())
    _assert_identical(model.state_dict(), loaded.state_dict())


def test_pruning_masks_are_reattached(tmp_path):
    torch.manual_seed(1)
    model = small_cnn()
    prune.l1_unstructured(model.features[0], "weight", amount=0.5)
    path = save_checkpoint(model, tmp_path / "pruned.safetensors", "small_cnn")
    loaded, _ = load_model(path)
    conv = loaded.features[0]
    assert prune.is_pruned(loaded) and hasattr(conv, "weight_mask")
    assert int((conv.weight == 0).sum()) == conv.weight.numel() // 2
    assert torch.equal(conv.weight, model.features[0].weight)
    _assert_identical(model.state_dict(), loaded.state_dict())


def test_plain_state_dict_needs_the_architecture_name(tmp_path):
    model = get_model("resnet18", num_classes=7)
    path = tmp_path / "plain.pth"
    torch.save(model.state_dict(), path)
    with pytest.raises(InvalidParameterError, match="load_model\\('<architecture>'"):
        load_model(path)
    with pytest.raises(ArchitectureMismatchError, match=r"fc.weight \(7, 512\)"):
        load_model("resnet18", weights=path)  # 1000 classes by default


def test_wrong_architecture_names_the_first_differing_keys(tmp_path):
    path = tmp_path / "r18.pth"
    torch.save(get_model("resnet18").state_dict(), path)
    with pytest.raises(ArchitectureMismatchError) as err:
        load_model("resnet34", weights=path)
    message = str(err.value)
    assert "missing (96)" in message and "layer1.2.conv1.weight" in message
    with pytest.raises(ArchitectureMismatchError, match="unexpected"):
        load_model("mlp", weights=path)


def test_saved_arch_must_match_the_requested_one(tmp_path):
    path = save_checkpoint(mlp(), tmp_path / "mlp.safetensors", "mlp")
    with pytest.raises(ArchitectureMismatchError, match="saved from 'mlp'"):
        load_model("small_cnn", weights=path)
    model, _ = load_model("mlp", weights=path)
    assert isinstance(model, torch.nn.Sequential)


class _Exploit:
    """A pickle payload that writes a file when unpickled."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (builtins.exec, (f"open({self.target!r}, 'w').write('pwned')",))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    sentinel = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pt"
    torch.save({"arch": "mlp", "kwargs": {}, "state_dict": {"x": _Exploit(sentinel)}}, path)
    with pytest.raises(UnsafeCheckpointError, match="refused to load"):
        load_model(path)
    with pytest.raises(UnsafeCheckpointError):
        load_model("mlp", weights=path)
    assert not sentinel.exists()
    # the payload is real: a full unpickling would have executed it
    torch.load(path, weights_only=False)
    assert sentinel.read_text() == "pwned"


def test_raw_pickle_file_is_refused(tmp_path):
    sentinel = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps(_Exploit(sentinel), protocol=2))
    with pytest.raises(InvalidParameterError):
        load_model("mlp", weights=path)
    assert not sentinel.exists()


def test_bad_files(tmp_path):
    with pytest.raises(InvalidParameterError, match="no checkpoint file"):
        load_model(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(InvalidParameterError, match="not a readable safetensors"):
        load_model(junk)
    with pytest.raises(InvalidParameterError, match="must end in"):
        save_checkpoint(mlp(), tmp_path / "x.bin", "mlp")
    with pytest.raises(InvalidParameterError, match="unknown model"):
        save_checkpoint(mlp(), tmp_path / "x.pt", "not_a_model")
    headless = tmp_path / "headless.safetensors"
    save_file({k: v.contiguous() for k, v in mlp().state_dict().items()}, str(headless))
    with pytest.raises(InvalidParameterError, match="plain state_dict"):
        load_model(headless)


def test_reference_name_gives_random_eval_model_and_default_shape():
    model, shape = load_model("small_cnn")
    assert shape == (1, 8, 8) and not model.training
    _, shape = load_model("unet", input_shape=[1, 32, 32])
    assert shape == (1, 32, 32)


@settings(max_examples=10, deadline=None)
@given(hidden=st.lists(st.integers(1, 12), min_size=0, max_size=3),
       in_features=st.integers(1, 20), classes=st.integers(2, 5),
       suffix=st.sampled_from([".safetensors", ".pt"]))
def test_round_trip_of_random_mlps(tmp_path_factory, hidden, in_features, classes, suffix):
    kwargs = {"in_features": in_features, "hidden": hidden, "num_classes": classes}
    model = mlp(**kwargs)
    path = save_checkpoint(model, tmp_path_factory.mktemp("ckpt") / f"m{suffix}", "mlp",
                           **kwargs)
    loaded, shape = load_model(path)
    assert shape == ((in_features,) if in_features != 64 else (1, 8, 8))
    _assert_identical(model.state_dict(), loaded.state_dict())
    x = torch.randn(3, *shape)
    assert torch.equal(loaded(x), model(x))


# ------------------------------------------------------- input shape, seed, file mode


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_the_input_shape_is_stored_and_an_explicit_one_wins(tmp_path, suffix):
    torch.manual_seed(0)
    model = unet(in_channels=2, base=4, depth=2)
    path = save_checkpoint(model, tmp_path / f"u{suffix}", "unet", input_shape=(2, 32, 16),
                           in_channels=2, base=4, depth=2)
    assert read_checkpoint(path).input_shape == (2, 32, 16)
    loaded, shape = load_model(path)
    assert shape == (2, 32, 16)
    _assert_identical(model.state_dict(), loaded.state_dict())
    assert load_model(path, (2, 64, 64))[1] == (2, 64, 64)
    # the same file as --weights of the architecture name: its shape too
    assert load_model("unet", weights=path)[1] == (2, 32, 16)


def test_without_a_stored_shape_the_architecture_default_is_used(tmp_path):
    path = save_checkpoint(unet(), tmp_path / "u.safetensors", "unet")
    assert read_checkpoint(path).input_shape is None
    assert load_model(path)[1] == (1, 64, 64)


@pytest.mark.parametrize("shape", [(3, 2.5), (0, 8), (), "3 8 8"])
def test_an_invalid_input_shape_is_refused_not_truncated(tmp_path, shape):
    with pytest.raises(InvalidParameterError, match="input_shape"):
        save_checkpoint(mlp(), tmp_path / "m.safetensors", "mlp", input_shape=shape)
    assert not (tmp_path / "m.safetensors").exists()


def test_a_seed_fixes_the_initialisation_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, _ = load_model("mlp", seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    b, _ = load_model("mlp", seed=7)
    c, _ = load_model("mlp", seed=8)
    torch.manual_seed(7)
    reference = mlp()  # the same draw, made directly
    _assert_identical(a.state_dict(), b.state_dict())
    _assert_identical(a.state_dict(), reference.state_dict())
    assert not torch.equal(a.state_dict()["1.weight"], c.state_dict()["1.weight"])


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_the_file_mode_follows_the_umask(tmp_path, umask, suffix):
    previous = os.umask(umask)
    try:
        path = save_checkpoint(mlp(), tmp_path / f"m{suffix}", "mlp")
        (tmp_path / "plain").write_bytes(b"")  # what open() makes under this umask
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_a_compiled_model_is_saved_with_the_plain_module_names(tmp_path):
    """torch.compile (like DDP) prefixes the state_dict keys; the checkpoint holds the
    plain module's, so it loads into the architecture."""
    from pathlift.models import mlp

    model = mlp().eval()
    path = save_checkpoint(torch.compile(model), tmp_path / "net.safetensors", "mlp")
    loaded, _ = load_model(path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                  model.state_dict().values(), strict=True))
