"""The Kronecker kernel and measurement cache cannot hurt: kernels recorded with their size
and digest and rebuilt when damaged (truncated, empty, record malformed); a read-only or
unusable cache folder (a file in its place) gives correct results and one warning;
malformed measurement entries are measured again; construction and ``forward`` time
nothing, and ``forward`` writes no file and raises no OS error."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from kron_fixtures import (  # noqa: F401
    QUICK_BUILD,
    isolated_kron_cache,
    quick_build,
)
from kron_fixtures import kernel_child as child
from pathlift import files
from pathlift.kron import (
    KSLinear,
    KSPattern,
    cache,
    cpu_kernel,
    design,
    fastest_algorithm,
    ks_multiply,
    machine,
    monarch,
    random_factor,
    to_dense,
)
from pathlift.kron import layer as layer_module

P = KSPattern(2, 24, 20, 3)
pytestmark = pytest.mark.usefixtures("quick_build")  # kernels built in the tests' own folders

def records(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.glob("ks_fused_float_*.json"))]


def product_error(kernel_dtype: torch.dtype = torch.float32) -> float:
    g = torch.Generator().manual_seed(1)
    w, x = random_factor(P, generator=g), torch.randn(17, P.in_features, generator=g)
    ref = x.double() @ to_dense(w.double(), P).T
    return float((ks_multiply(x, w, P, "fused").double() - ref).abs().max() / ref.abs().max())


@pytest.fixture
def fresh_kernels(monkeypatch):
    """Kernels loaded anew by this test (the process keeps its own otherwise), one warning
    allowed again."""
    monkeypatch.setattr(machine, "_WARNED", set())
    cpu_kernel._load.cache_clear()
    cpu_kernel._load_for.cache_clear()
    yield
    cpu_kernel._load.cache_clear()
    cpu_kernel._load_for.cache_clear()


@pytest.fixture
def read_only(monkeypatch):
    """Every write of pathlift.files fails as on a read-only file system (the tests run as
    root, for whom a chmod does not make a folder read-only)."""

    def refuse(path, write):
        raise files.describe(OSError(errno.EROFS, "Read-only file system"), path, "write")

    monkeypatch.setattr(files, "atomic_write", refuse)


def test_the_kernel_is_recorded_with_its_size_and_digest_and_reused(tmp_path, monkeypatch,
                                                                    fresh_kernels):
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    assert cpu_kernel.load_kernel(torch.float32) is not None
    folder = tmp_path / "kron"
    [record] = records(folder)
    library = folder / record["file"]
    data = library.read_bytes()
    assert record["size"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()

    def no_build(*args):
        raise AssertionError("built again")

    monkeypatch.setattr(cpu_kernel, "_build", no_build)
    assert cpu_kernel._compile(torch.float32, cpu_kernel._compiler(), cpu_kernel.build_flags()) \
        == (library, False)


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache where a fresh process built and recorded the float32 kernel (built once for
    the damage cases, each of which damages its own copy)."""
    root = tmp_path_factory.mktemp("built")
    assert child(root, **QUICK_BUILD)["kernel"]
    return root


@pytest.mark.parametrize("damage", ["truncated", "empty", "record not an object",
                                    "record names another file"])
def test_a_damaged_cached_kernel_is_rebuilt_with_correct_results(damage, tmp_path,
                                                                  built_cache):
    """Built by a fresh process, copied and damaged here, loaded by fresh processes (a
    truncated library loaded as it is kills the process with SIGBUS)."""
    shutil.copytree(built_cache / "kron", tmp_path / "kron")
    folder = tmp_path / "kron"
    [record] = records(folder)
    library = folder / record["file"]
    good = library.read_bytes()
    if damage == "truncated":
        with library.open("r+b") as fh:
            fh.truncate(len(good) // 2)
    elif damage == "empty":
        library.write_bytes(b"")
    else:
        path = next(folder.glob("ks_fused_float_*.json"))
        path.write_text("[1, 2]" if damage == "record not an object"
                        else json.dumps(record | {"file": "../elsewhere.so"}))
    result = child(tmp_path)
    assert result["kernel"] and result["error"] <= 1e-5 and result["warnings"] == []
    [again] = records(folder)
    assert (folder / again["file"]).read_bytes() == good or \
        hashlib.sha256((folder / again["file"]).read_bytes()).hexdigest() == again["sha256"]
    assert child(tmp_path)["error"] <= 1e-5  # and the repaired cache is used as it is


def test_a_read_only_cache_gives_correct_results_and_one_warning(tmp_path, monkeypatch,
                                                                 fresh_kernels, read_only):
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(layer_module, "_FASTEST", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = cpu_kernel.load_kernel(torch.float32)
        error = product_error()
        choice = fastest_algorithm(KSPattern(1, 8, 8, 3), 9, torch.float32, repeats=1)
        cache.store("design", "a key", {"a": 1})
    assert kernel is not None and error <= 1e-5
    assert [str(m.message).count("unusable") for m in caught] == [1], caught
    # nothing written (the cache folder itself is made, mode 0700, before it is trusted)
    assert not [p for p in tmp_path.rglob("*") if not p.is_dir()], "nothing may be written"
    # the measurements are kept for the process
    assert layer_module.known_algorithm(KSPattern(1, 8, 8, 3), 9, torch.float32) == choice
    assert cache.lookup("design", "a key") == {"a": 1}


def test_a_cache_dir_that_is_a_file_gives_correct_results_and_one_warning(
        tmp_path, monkeypatch, fresh_kernels):
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(not_a_folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu_kernel.load_kernel(torch.float32) is not None
        assert product_error() <= 1e-5
        layer = KSLinear(monarch(16, 16, 4), algorithm="auto")
        layer.tune(5, repeats=1)
        layer(torch.randn(5, 16))
    messages = [str(m.message) for m in caught]
    assert len(messages) == 1 and "unusable" in messages[0] and str(not_a_folder) in \
        messages[0], messages
    assert not_a_folder.read_text() == "a file"


@pytest.mark.parametrize("content", ["[1, 2]", "not json", '{"%s": "magic"}', '{"%s": [1]}'])
def test_malformed_measurements_are_ignored_and_measured_again(content, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(layer_module, "_FASTEST", {})  # as in a new process
    p = KSPattern(1, 6, 6, 2)
    key = f"{p}|7|{torch.float32}|cpu"
    path = tmp_path / "kron" / f"fastest-{cache.fingerprint()}.json"
    path.parent.mkdir(parents=True)
    path.write_text(content.replace("%s", key))
    measured = []
    real = layer_module._measure_fastest
    monkeypatch.setattr(layer_module, "_measure_fastest",
                        lambda *args: measured.append(1) or real(*args))
    assert layer_module.known_algorithm(p, 7, torch.float32) is None
    choice = fastest_algorithm(p, 7, torch.float32, repeats=1)
    assert measured == [1]
    assert json.loads(path.read_text())[key] == choice  # the file is repaired


def test_a_malformed_cached_design_is_designed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    first = design(16, 32, budget=0.5, batch=8, top_k=2, repeats=1)
    path = next((tmp_path / "kron").glob("design-*.json"))
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({key: {"n_in": "x"} for key in stored}))
    again = design(16, 32, budget=0.5, batch=8, top_k=2, repeats=1)
    assert (again.n_in, again.n_out) == (first.n_in, first.n_out)
    assert again.chosen.measured_s is not None  # measured, not read


def test_construction_and_forward_time_nothing_and_forward_writes_nothing(
        tmp_path, monkeypatch, fresh_kernels):
    """Layers made (auto, fused) and tuned with a usable cache; then the cache becomes
    read-only and every way to time or build is refused: forward passes (new batch
    sizes, with and without autograd, after a dtype change) raise nothing, warn nothing
    and leave the cache folder as it was."""
    monkeypatch.setenv("PATHLIFT_CACHE_DIR", str(tmp_path))
    auto = KSLinear(monarch(24, 16, 4), algorithm="auto")
    auto.tune(8, repeats=1)
    fused = KSLinear(monarch(24, 16, 4), algorithm="fused").double()
    before = {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in tmp_path.rglob("*")}

    def refuse(*args, **kwargs):
        raise AssertionError("forward timed, built or wrote something")

    monkeypatch.setattr(files, "atomic_write", refuse)
    monkeypatch.setattr(cpu_kernel, "_build", refuse)
    monkeypatch.setattr(layer_module, "_measure_fastest", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (1, 8, 33):
            x = torch.randn(batch, 16)
            with torch.no_grad():
                auto(x), fused(x.double())
            auto(x.requires_grad_()).sum().backward()
        KSLinear(monarch(24, 16, 4), algorithm="auto")(torch.randn(3, 16))
    assert caught == []
    assert {f: (f.stat().st_size, f.stat().st_mtime_ns) for f in tmp_path.rglob("*")} == before
