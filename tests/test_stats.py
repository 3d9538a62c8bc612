"""analysis/stats.py on cases with known answers: Welch's interval and p-value against scipy's
and against the formulas worked by hand, the four-cell difference of gains, the pooled spread."""
from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as scipy_stats

from analysis.stats import combination, difference_of_differences, pooled_spread, welch

A = [4.80, 4.85, 4.79, 4.90]          # e.g. log test ppl of four seeds
B = [4.95, 5.02, 4.97]


def test_welch_is_scipys_unequal_variance_t_test():
    estimate = welch(A, B)
    reference = scipy_stats.ttest_ind(A, B, equal_var=False)
    low, high = reference.confidence_interval(confidence_level=0.95)
    assert estimate.value == pytest.approx(statistics.mean(A) - statistics.mean(B), rel=1e-12)
    assert estimate.p == pytest.approx(reference.pvalue, rel=1e-9)
    assert (estimate.low, estimate.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert estimate.df == pytest.approx(reference.df, rel=1e-9)


def test_welch_worked_by_hand():
    """a = [1, 2, 3, 4], b = [2, 4, 6]: means 2.5 and 4, variances 5/3 and 4; v_a = 5/12,
    v_b = 4/3, se^2 = 7/4, df = (7/4)^2 / ((5/12)^2 / 3 + (4/3)^2 / 2) = 3.2347...,
    t = -1.5 / sqrt(7/4) = -1.1339."""
    estimate = welch([1, 2, 3, 4], [2, 4, 6])
    df = (7 / 4) ** 2 / ((5 / 12) ** 2 / 3 + (4 / 3) ** 2 / 2)
    assert df == pytest.approx(3.2347, abs=1e-4)
    assert estimate.value == -1.5 and estimate.df == pytest.approx(df, rel=1e-12)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(7 / 4)
    assert (estimate.low, estimate.high) == (pytest.approx(-1.5 - half), pytest.approx(-1.5 + half))
    assert estimate.p == pytest.approx(2 * scipy_stats.t.cdf(-1.5 / math.sqrt(7 / 4), df), rel=1e-9)
    assert estimate.p == pytest.approx(0.333, abs=1e-3)


def test_a_sample_of_one_gives_no_interval():
    for estimate in (welch([4.8], B), welch(A, [4.9]), difference_of_differences(A, B, [4.7], B)):
        assert estimate.why_not == "n = 1" and estimate.low is None and estimate.p is None
    estimate = welch([4.8], [4.9])
    assert estimate.value == pytest.approx(-0.1)
    assert estimate.describe() == f"{100 * math.expm1(-0.1):+.1f}% (n = 1: no interval)"
    assert welch([1.0, 1.0], [2.0, 2.0]).why_not == "no spread"


def test_percent_and_its_interval_are_the_ratios():
    estimate = welch(A, B)
    text = estimate.describe()
    assert text.startswith(f"{100 * (math.exp(estimate.value) - 1):+.1f}% "
                           f"[{100 * (math.exp(estimate.low) - 1):+.1f}, {100 * (math.exp(estimate.high) - 1):+.1f}], p = ")


def test_difference_of_gains_by_hand():
    """(a1 - b1) - (a2 - b2): variance the sum of the four s^2/n, Welch-Satterthwaite df."""
    a1, b1, a2, b2 = [4.70, 4.74, 4.69], [4.80, 4.85, 4.79, 4.90], [5.0, 5.1], [5.12, 5.2, 5.15]
    estimate = difference_of_differences(a1, b1, a2, b2)
    samples = (a1, b1, a2, b2)
    value = (statistics.mean(a1) - statistics.mean(b1)) - (statistics.mean(a2) - statistics.mean(b2))
    terms = [statistics.variance(s) / len(s) for s in samples]
    df = sum(terms) ** 2 / sum(t ** 2 / (len(s) - 1) for t, s in zip(terms, samples))
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(sum(terms))
    assert estimate.value == pytest.approx(value, rel=1e-12) and estimate.df == pytest.approx(df, rel=1e-12)
    assert (estimate.low, estimate.high) == (pytest.approx(value - half), pytest.approx(value + half))
    assert estimate.p == pytest.approx(2 * scipy_stats.t.sf(abs(value) / math.sqrt(sum(terms)), df))
    # two cells, weights 1 and -1: Welch again
    assert combination([A, B], [1, -1]) == welch(A, B)


def test_pooled_spread_by_hand():
    """[1, 3] and [2, 4, 6]: squares 2 + 8 = 10 over 1 + 2 = 3 degrees of freedom; a sample of
    one value adds nothing."""
    spread = pooled_spread([[1, 3], [2, 4, 6], [7]])
    assert spread.std == pytest.approx(math.sqrt(10 / 3)) and spread.df == 3 and spread.groups == 2
    assert spread.low == pytest.approx(math.sqrt(10 / scipy_stats.chi2.ppf(0.975, 3)))
    assert spread.high == pytest.approx(math.sqrt(10 / scipy_stats.chi2.ppf(0.025, 3)))
    assert pooled_spread([[1.0], [2.0]]) is None
