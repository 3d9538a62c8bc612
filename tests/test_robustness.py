"""Robustness of the Press rank ([SB] SM section 5, Algorithms 1 and 2): synthetic matrices of
known spectrum, then `rank.py --robustness` on a tiny trained model."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

import rank
from spectrum import effective_rank, press_tolerance
from spectrum.robustness import (NOISE_SCALES, gaussian_noise, noise_test, press_rank_robustness,
                                 reconstruction_test, truncate)


def matrix_with_spectrum(values, m: int, seed: int = 0) -> torch.Tensor:
    """An m x n float64 matrix Q1 diag(values) Q2^T with random orthogonal Q1, Q2."""
    g = torch.Generator().manual_seed(seed)
    n = len(values)
    q1, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q1 * torch.as_tensor(values, dtype=torch.float64)) @ q2.T


SPECTRUM = 1000.0 * 0.8 ** np.arange(60)        # full rank, fast decay, like a log-P spectrum


def test_truncation_keeps_exactly_the_top_singular_values():
    a = matrix_with_spectrum(SPECTRUM, m=90)
    truncated, kept, original = truncate(a, keep=10)
    assert original["press_rank"] == 60 and original["sigma_max"] == pytest.approx(1000.0)
    np.testing.assert_allclose(kept[:10].numpy(), SPECTRUM[:10], rtol=1e-12)
    assert torch.all(kept[10:] == 0) and kept.numel() == 60
    values = torch.linalg.svdvals(truncated).numpy()
    np.testing.assert_allclose(values[:10], SPECTRUM[:10], rtol=1e-12)
    assert values[10] < 1e-12 * values[0]


def test_algorithm1_press_rank_stays_at_keep_while_the_error_is_rounding():
    a = matrix_with_spectrum(SPECTRUM, m=90)
    truncated, _, _ = truncate(a, keep=10)
    records = reconstruction_test(truncated, iterations=10)
    assert [r["iteration"] for r in records] == list(range(11))
    assert [r["press_rank"] for r in records] == [10] * 11
    assert records[0]["error"] == 0.0
    # float64 rounding on entries of this size: tiny but not zero (the SM prints ~1e-28)
    scale = truncated.pow(2).mean().item()
    assert all(0 < r["error"] < 1e-26 * scale for r in records[1:])
    # effective ranks are those of the kept spectrum
    for eps, value in records[0]["effective_rank"].items():
        assert value == effective_rank(SPECTRUM[:10], eps)
    assert records[0]["shape"] == [90, 60] and records[0]["dtype"] == "float64"


def test_noise_is_n_by_n_with_variance_c_over_n_squared():
    n, c = 500, 4e-6
    z = gaussian_noise(n, c, torch.Generator().manual_seed(0), torch.empty(0, dtype=torch.float64))
    assert z.shape == (n, n) and z.dtype == torch.float64
    variance = c / n ** 2
    count = z.numel()
    assert abs(z.mean().item()) < 6 * math.sqrt(variance / count)
    assert abs(z.var().item() / variance - 1) < 7 * math.sqrt(2 / count)   # 7 standard errors
    with pytest.raises(ValueError, match="noise scale c"):
        gaussian_noise(n, 0.0, torch.Generator(), z)


def quarter_circle_fraction_below(x: float) -> float:
    """P(sigma / (s sqrt(n)) < x) for the singular values of a large n x n N(0, s^2) matrix."""
    return (x / 2 * math.sqrt(4 - x * x) + 2 * math.asin(x / 2)) / math.pi


def test_algorithm2_rank_goes_from_full_to_keep_as_the_noise_shrinks():
    n = 400
    kept = torch.zeros(n, dtype=torch.float64)
    kept[:10] = torch.as_tensor(SPECTRUM[:10])
    tolerance = press_tolerance(SPECTRUM[:1], (n, n), np.float64)

    def c_for(std: float) -> float:           # noise std = sqrt(c) / n
        return (std * n) ** 2

    # half of the noise's largest singular value 2 s sqrt(n) at the tolerance: the quarter-circle
    # law predicts the fraction of the n - 10 noise directions above it (the SM's Table 15 regime)
    middle = tolerance / (0.5 * math.sqrt(n))
    scales = [c_for(1e6 * tolerance * math.sqrt(n)), c_for(middle), c_for(1e-3 * tolerance / math.sqrt(n))]
    records = noise_test(kept, scales, seed=0)
    assert [r["c"] for r in records] == scales
    assert records[0]["press_rank"] == n
    expected = 10 + (n - 10) * (1 - quarter_circle_fraction_below(0.5))
    assert abs(records[1]["press_rank"] - expected) < 0.05 * n
    assert records[2]["press_rank"] == 10
    assert all(r["shape"] == [n, n] for r in records)
    # the noise is far below the kept values: effective ranks see only those
    assert records[2]["effective_rank"] == {eps: effective_rank(SPECTRUM[:10], eps)
                                            for eps in records[2]["effective_rank"]}
    assert noise_test(kept, scales, seed=0) == records                      # seeded


def test_bad_arguments_are_value_errors():
    a = matrix_with_spectrum(SPECTRUM[:20], m=30)
    with pytest.raises(ValueError, match="keep: expected 1 <= keep < 20"):
        press_rank_robustness(a, keep=20)
    with pytest.raises(ValueError, match="iterations"):
        press_rank_robustness(a, iterations=0)
    with pytest.raises(ValueError, match="noise scale c"):
        press_rank_robustness(a, scales=[1e-3, -1.0])
    a[0, 0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        press_rank_robustness(a)


def test_default_scales_are_the_sm_table15_values():
    from analysis.published import ROBUSTNESS
    assert set(NOISE_SCALES) == set(ROBUSTNESS.noise_press_rank)


# ---------------------------------------------------------------------- rank.py --robustness

@pytest.fixture
def trained(tiny_run, tmp_path):
    """A copy of the tiny run's best.pt, so results are written to tmp_path."""
    shutil.copy(tiny_run / "best.pt", tmp_path / "best.pt")
    return tmp_path


def test_rank_py_robustness_on_a_trained_model(trained, capsys):
    argv = [str(trained), "--robustness", "--contexts", "60", "--iterations", "3",
            "--noise-scales", "1e6", "1e-40", "--device", "cpu", "--json"]
    assert rank.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads((trained / "robustness_test.json").read_text())
    assert json.loads(out[-1]) == result
    assert "Algorithm 1, iteration  3" in "\n".join(out) and "Algorithm 2, c = 1e-40" in "\n".join(out)
    assert result["contexts"] == 60 and result["head"] == "softmax" and result["keep"] == 10
    m, n = result["original"]["shape"]
    assert m == 60 and n > 60 and result["original"]["dtype"] == "float64"
    assert [r["press_rank"] for r in result["reconstruction"]] == [10] * 4
    assert [r["press_rank"] for r in result["noise"]] == [60, 10]
    # the dense matrix is the one the streaming path decomposes: same Press rank and sigma_max
    assert rank.main([str(trained), "--contexts", "60", "--dtype", "float64", "--device", "cpu"]) == 0
    streamed = json.loads((trained / "rank_test.json").read_text())
    assert streamed["press_rank"] == result["original"]["press_rank"] > 10
    assert streamed["sigma_max"] == pytest.approx(result["original"]["sigma_max"], rel=1e-10)
    # beside it, the float32 Press rank [SB] counts (a float32 model pass, float32's epsilon): the
    # streaming path's in float32
    float32 = result["original_float32"]
    assert float32["dtype"] == "float32" and float32["shape"] == [m, n]
    assert f"float64: Press rank {result['original']['press_rank']} (float32: {float32['press_rank']})" in "\n".join(out)
    assert rank.main([str(trained), "--contexts", "60", "--device", "cpu"]) == 0
    streamed = json.loads((trained / "rank_test.json").read_text())
    assert streamed["press_rank"] == float32["press_rank"] and streamed["dtype"] == "float32"
    assert streamed["sigma_max"] == pytest.approx(float32["sigma_max"], rel=1e-5)
    # asked for in float32, the matrix is float32's already: no second pass
    assert rank.main(argv + ["--dtype", "float32"]) == 0
    result = json.loads((trained / "robustness_test.json").read_text())
    assert result["original"]["dtype"] == "float32" and "original_float32" not in result


def test_rank_py_robustness_bad_input_is_one_line(trained, capsys):
    assert rank.main([str(trained), "--robustness", "--contexts", "20", "--keep", "30",
                      "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "keep" in err and "20 x" in err
    for argv in (["--keep", "5"], ["--robustness", "--noise-scales", "0"],
                 ["--robustness", "--noise-scales", "inf"], ["--robustness", "--noise-scales", "nan"],
                 ["--robustness", "--plot"]):
        with pytest.raises(SystemExit) as exit_info:
            rank.parse_args([str(trained), *argv])
        assert exit_info.value.code == 2
    # a scale below float64's range reads as 0: the message shows it as given, and why
    for text, why in (("1e-400", " (below float64's smallest, it reads as 0)"), ("0e5", "")):
        with pytest.raises(SystemExit):
            rank.parse_args([str(trained), "--robustness", "--noise-scales", "1e-2", text])
        assert capsys.readouterr().err.strip().endswith(
            f"argument --noise-scales: expected a finite value > 0, got {text!r}{why}")
