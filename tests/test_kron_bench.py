"""The benchmark's bookkeeping: the CPU subset, CSV round trip, the summary ratios against
a hand computation, the plot, and one tiny real run through the CLI."""

from __future__ import annotations

import statistics

import pytest
import torch
from typer.testing import CliRunner

from kron_fixtures import isolated_kron_cache  # noqa: F401
from pathlift.cli import app
from pathlift.jobs.bench import KronBenchResult, run_kron_benchmark
from pathlift.jobs.bench import kron as bench
from pathlift.kron import KSPattern, cpu_kernel


def fake_rows() -> list[bench.Timing]:
    """Two patterns with chosen times (seconds) per (algorithm, layout)."""
    times = {
        (1, 4, 4, 4): {"bsf": {"fused": 1.0, "bmm": 3.0, "dense": 2.0, "einsum": 5.0},
                       "bsl": {"fused": 2.0, "bmm": 2.0, "dense": 1.0, "einsum": 0.5}},
        (2, 8, 2, 1): {"bsf": {"fused": 4.0, "bmm": 2.0, "dense": 8.0, "einsum": 9.0},
                       "bsl": {"fused": 1.0, "bmm": 3.0, "dense": 2.0, "einsum": 9.0}},
    }
    return [bench.Timing(*p, alg, layout, 16, "torch.float32", "cpu", t, t, t)
            for p, per in times.items() for layout, algs in per.items()
            for alg, t in algs.items()]


def test_cpu_configuration_is_the_documented_subset():
    subset = bench.cpu_patterns()
    assert len(subset) == 160
    assert sum(p.density <= 1 / 8 for p in subset) == 62
    assert all(p.out_features * p.in_features <= bench.CPU_MAX_DENSE for p in subset)
    assert len(bench.cpu_patterns(every=8)) == 20


def test_summary_matches_a_hand_computation():
    s = bench.summarize(fake_rows())
    assert s.patterns == 2
    # bsf: bmm/fused = 3/1 and 2/4 -> median 1.75; bsl: 2/2 and 3/1 -> 2
    assert s.speedup_vs_bmm["bsf"] == pytest.approx(statistics.median([3.0, 0.5]))
    assert s.speedup_vs_bmm["bsl"] == pytest.approx(2.0)
    # best layout per algorithm: p1 fused 1, bmm 2; p2 fused 1, bmm 2 -> 2
    assert s.speedup_vs_bmm["best"] == pytest.approx(2.0)
    # fused beats every other algorithm: bsf p1 yes, p2 no; bsl p1 no (einsum), p2 yes
    assert s.fused_fastest == {"best": 0.5, "bsf": 0.5, "bsl": 0.5}
    # density 1/(ad): p1 1/4 (not <= 1/8), p2 1/2: no sparse pattern
    assert s.sparse_patterns == 0 and s.fused_beats_dense["bsf"] == 0


def test_csv_round_trip_and_plot(tmp_path):
    rows = fake_rows()
    path = bench.write_csv(rows, tmp_path / "k.csv", machine="test machine")
    assert path.read_text().startswith("# test machine\n")
    assert bench.read_csv(path) == rows
    png = bench.plot_speedups(rows, tmp_path / "k.png", "test")
    assert png.stat().st_size > 1000


def test_cli_runs_a_tiny_grid(tmp_path):
    result = CliRunner().invoke(app, ["kron-bench", "--every", "80", "--batch", "8",
                                      "--repeats", "1", "--no-vit", "--threads", "1",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = bench.read_csv(tmp_path / "kron_cpu_float32_t1.csv")
    assert len(rows) == 2 * 6 * 2  # 2 patterns, 6 algorithms, 2 layouts
    assert {r.pattern for r in rows} == set(bench.cpu_patterns(every=80))
    assert "vs bmm" in result.output and "default algorithm" in result.output
    kernel = cpu_kernel.load_kernel(torch.float32)
    assert f"fused kernel {kernel.isa}" in result.output.replace("\n", " ")
    assert isinstance(rows[0].pattern, KSPattern)


def test_run_kron_benchmark_writes_what_it_returns_and_restores_the_threads(tmp_path):
    before = torch.get_num_threads()
    seen, runs = [], []
    result = run_kron_benchmark(tmp_path, every=80, batch=8, repeats=1, threads=[1],
                                on_pattern=lambda *a: seen.append(a), on_run=runs.append)
    assert torch.get_num_threads() == before
    assert isinstance(result, KronBenchResult) and result.folder == tmp_path
    (run,) = result.runs
    assert runs == [run] and seen == [(1, 0, 2), (1, 1, 2), (1, 2, 2)]
    assert run.threads == 1 and run.patterns == 2 and " 1 thread(s)" in run.machine
    assert run.csv == tmp_path / "kron_cpu_float32_t1.csv"
    assert run.csv.read_text().startswith(f"# {run.machine}\n")
    rows = bench.read_csv(run.csv)
    assert rows == list(run.timings) and len(rows) == 2 * 6 * 2
    expected = bench.summarize(rows, bench.fastest_choices(bench.cpu_patterns(every=80), 8))
    assert repr(run.summary) == repr(expected)  # repr: nan == nan (no sparse pattern here)
    assert run.plot.stat().st_size > 1000
    vit = {(m, a): float(v) for m, a, v in (line.split(",") for line in
                                            run.vit_csv.read_text().splitlines()[2:])}
    assert vit == {(m, a): pytest.approx(v, abs=1e-4) for m, per in run.vit.items()
                   for a, v in per.items()}
    assert run.vit_tokens == 8 * 196 and set(run.vit["feed-forward"]) == {"bmm", "fused"}
    for text in (repr(result), repr(run)):
        assert "\n" not in text and len(text) < 300, text
    assert f"{run.summary.speedup_vs_bmm['best']:.2f}x" in repr(result)


def test_run_kron_benchmark_restores_the_threads_after_an_error(tmp_path):
    before = torch.get_num_threads()

    def fail(threads, done, total):
        assert torch.get_num_threads() == threads
        if done:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run_kron_benchmark(tmp_path, every=80, batch=8, repeats=1, vit=False,
                           threads=[before % 2 + 1], on_pattern=fail)
    assert torch.get_num_threads() == before


def test_summary_of_the_default_choice_matches_a_hand_computation():
    """bsf: p1 bmm 3, fused 1, einsum 5; p2 bmm 2, fused 4, einsum 9. Choosing fused on p1
    and einsum on p2: t(bmm)/t(default) = 3 and 2/9, so p2 loses by more than 10%."""
    p1, p2 = KSPattern(1, 4, 4, 4), KSPattern(2, 8, 2, 1)
    s = bench.summarize(fake_rows(), {p1: "fused", p2: "einsum"})
    assert s.default_vs_bmm == pytest.approx(statistics.median([3.0, 2 / 9]))
    assert s.default_worst_vs_bmm == pytest.approx(2 / 9)
    assert s.default_loses == (p2,)
    assert bench.summarize(fake_rows(), {p1: "fused", p2: "bmm"}).default_loses == ()


def test_vit_patterns_have_the_thesis_shapes_and_timings_are_ratios():
    """Sec. 5.5: N x N and 4N x N products of two factors for ViT-S/16 (N = 384)."""
    n = bench.VIT_S_DIM
    shapes = {}
    for name, chain in (("nn", bench.VIT_PATTERNS_NN), ("up", bench.VIT_PATTERNS_UP),
                        ("down", bench.VIT_PATTERNS_DOWN)):
        ps = [KSPattern(*p) for p in chain]
        shapes[name] = (ps[0].out_features, ps[-1].in_features)
    assert shapes == {"nn": (n, n), "up": (4 * n, n), "down": (n, 4 * n)}
    ratios = bench.time_vit_mlp(8, ("fused",), repeats=1)
    assert set(ratios) == {"linear N x N", "feed-forward"}
    assert all(r["fused"] > 0 for r in ratios.values())
