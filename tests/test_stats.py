"""analysis/stats.py on cases with known answers: Welch's interval and p-value against scipy's
and against the formulas worked by hand, the four-cell difference of gains, the pooled spread,
the seeds a comparison needs (Cohen's table; the intervals themselves, simulated)."""
from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as scipy_stats

import numpy as np

from analysis.stats import (Estimate, combination, difference_of_differences, format_bound, holm, pooled_spread, power,
                            seeds_needed, welch, welch_power)

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


def test_seeds_needed_is_cohens_table():
    """Two groups, 5% two-sided, 80% power (Cohen 1988, Table 2.4.1; G*Power's exact t): effect
    size (difference / std) 0.2, 0.5, 0.8 and 1.0 need 394, 64, 26 and 17 per group. The normal
    approximation, 2 (1.96 + 0.84)^2 / d^2, gives 393, 63, 25 and 16: the t's heavier tails matter."""
    for effect, seeds in ((0.2, 394), (0.5, 64), (0.8, 26), (1.0, 17)):
        assert seeds_needed(effect, 1.0) == seeds
        assert seeds_needed(-0.01 * effect, 0.01) == seeds          # a ratio: scale and sign drop out
        assert power(effect, 1.0, seeds - 1) < 0.8 <= power(effect, 1.0, seeds)
    assert power(0.5, 1.0, 1) != power(0.5, 1.0, 1)                  # one run per cell: no interval
    # a large difference against a small spread (MoS's 17% at d = 16 after 6 epochs, spread 1.48%):
    # 2 seeds suffice, and a larger spread never needs fewer
    assert power(math.log(0.83), 0.0148, 2) > 0.99
    assert [seeds_needed(math.log(0.83), spread) for spread in (0.0148, 0.0269, 0.05)] == [2, 2, 3]
    with pytest.raises(ValueError):
        seeds_needed(0.0, 0.01)
    # a change thousands of millions of times the spread: scipy's noncentral t gave nan there, and
    # seeds_needed "more than 10000 seeds per cell" where two are plenty
    assert power(math.log(1.5), 1e-11, 2) == 1.0 and seeds_needed(math.log(1.5), 1e-11) == 2


@pytest.mark.parametrize("cells, weights, value", [(2, [1, -1], 0.02), (4, [1, -1, -1, 1], 0.03)])
def test_power_is_how_often_the_reports_interval_excludes_zero(cells, weights, value):
    """Simulated seeds (spread 1.48%, the 6-epoch study's) through combination, the reports'
    interval: at the seeds seeds_needed gives, and one fewer, the share of intervals that exclude
    0 is power's (within the simulation's noise and Welch's estimated degrees of freedom)."""
    spread = 0.0148
    seeds = seeds_needed(value, spread, cells)
    rng = np.random.default_rng(0)
    for n in (seeds - 1, seeds):
        excluded = 0
        for _ in range(3000):
            samples = [rng.normal(0.0, spread, n) for _ in range(cells)]
            samples[0] += value
            estimate = combination(samples, weights)
            excluded += estimate.low > 0 or estimate.high < 0
        assert excluded / 3000 == pytest.approx(power(value, spread, n, cells), abs=0.03), n


def test_power_at_few_seeds_is_students_exact_test():
    """Two cells of equal spread and size: power is exactly the rejection rate of Student's
    t-test (pooled variance, 2n - 2 degrees of freedom), the case where noncentral t is exact.
    Simulated at 2 and 3 seeds, where the degrees of freedom matter most (with 2n instead of
    2n - 2 they would read 0.62 and 0.86)."""
    rng = np.random.default_rng(1)
    for n, expected in ((2, 0.387), (3, 0.783)):
        pvalues = scipy_stats.ttest_ind(rng.normal(3.0, 1.0, (5000, n)), rng.normal(0.0, 1.0, (5000, n)),
                                        axis=1).pvalue
        rejected = float(np.mean(pvalues < 0.05))
        assert power(3.0, 1.0, n) == pytest.approx(expected, abs=1e-3)
        assert rejected == pytest.approx(power(3.0, 1.0, n), abs=0.02), n
    assert seeds_needed(3.0, 1.0) == 4


@pytest.mark.parametrize("spreads, n", [((0.0015, 0.0102), 4), ((0.0063, 0.0063), 3), ((0.0102, 0.0015), 9)])
def test_welch_power_is_how_often_scipys_welch_test_rejects(spreads, n):
    """welch_power, simulated from the laws of a cell's mean and variance, against drawn seeds
    through scipy's Welch t-test (an independent computation): the same rejection rate within the
    two simulations' noise. With equal spreads it is below power()'s pooled-t figure (Welch's
    degrees of freedom are fewer), and the order of the cells does not matter."""
    value = math.log1p(0.011)
    rng = np.random.default_rng(2)
    first = rng.normal(value, spreads[0], (20_000, n))
    second = rng.normal(0.0, spreads[1], (20_000, n))
    rejected = float(np.mean(scipy_stats.ttest_ind(first, second, axis=1, equal_var=False).pvalue < 0.05))
    assert welch_power(value, spreads, n) == pytest.approx(rejected, abs=0.015)
    assert welch_power(value, spreads, n) == welch_power(value, spreads, n)            # repeatable
    assert welch_power(-value, spreads[::-1], n) == pytest.approx(rejected, abs=0.015)
    if spreads[0] == spreads[1]:
        assert welch_power(value, spreads, n) < power(value, spreads[0], n) - 0.05


def test_seeds_needed_with_a_spread_per_cell_is_welchs(capsys):
    """One spread per cell: the fewest seeds at which welch_power reaches the power wanted (one
    fewer does not), one more than the pooled t's count where the spreads are equal; four cells take four spreads, and a count of spreads that is not the cells' is
    refused. report.py seeds takes them in percent."""
    import report
    value, spreads = math.log1p(0.011), (0.0015, 0.0102)
    seeds = seeds_needed(value, spreads)
    assert welch_power(value, spreads, seeds) >= 0.8 > welch_power(value, spreads, seeds - 1)
    # equal spreads: Welch's fewer degrees of freedom ask one more seed than the pooled t at 2%
    assert seeds_needed(math.log1p(-0.02), (0.0063, 0.0063)) == seeds_needed(math.log1p(-0.02), 0.0063) + 1
    four = seeds_needed(math.log1p(0.03), (0.01, 0.01, 0.02, 0.02), cells=4)
    assert welch_power(math.log1p(0.03), (0.01, 0.01, 0.02, 0.02), four) >= 0.8
    with pytest.raises(ValueError, match="one spread per cell"):
        seeds_needed(value, spreads, cells=4)
    assert report.main(["seeds", "--change", "+1.1", "--spread", "0.15", "1.02"]) == 0
    out = capsys.readouterr().out
    assert f"| +1.1% | {seeds} |" in out and "spreads of test ppl are 0.15%, 1.02%" in out
    assert report.main(["seeds", "--change", "+1.1", "--spread", "0.15", "1.02", "0.5"]) == 2
    assert "--spread: expected one spread, or one per cell (2), got 3" in capsys.readouterr().err


def test_holm_by_hand():
    """p = 0.01, 0.04, 0.03, 0.5 (four pairs): sorted, 0.01 x 4 = 0.04, 0.03 x 3 = 0.09, 0.04 x 2 =
    0.08 raised to the 0.09 before it, 0.5 x 1; returned in the order given. A product above 1
    is 1, and one pair is its own p."""
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6]) and holm([0.7, 0.6]) == [1.0, 1.0]
    assert holm([0.02]) == [0.02] and holm([]) == []


def test_a_bound_near_zero_shows_its_side():
    """GSS against SS printed "+1.5% [+0.0, +3.1], p = 0.048": an interval that reads as touching
    zero with p < 0.05. A bound that rounds to zero at one decimal gets the digits that show its
    sign; the others keep one."""
    estimate = Estimate(math.log(1.015), (3, 3), math.log(1.0003), math.log(1.031), 0.048, 3.9)
    assert estimate.describe() == "+1.5% [+0.03, +3.1], p = 0.048"
    assert format_bound(0.034) == "+0.03" and format_bound(-0.0004) == "-0.0004" and format_bound(-2.44) == "-2.4"
    assert format_bound(0.0) == "+0.0" and format_bound(0.00001) == "+0.0000"


def test_report_seeds_takes_the_reports_percentages(capsys):
    """`report.py seeds` converts the reports' units (a change in percent of test ppl, the spread
    in percent) before seeds_needed, which works on log ppl: -0.9% at 0.58% needs 8 seeds a cell
    (in the raw function's units by mistake, -0.9 and 0.0058, it would say 2)."""
    import report
    assert report.main(["seeds", "--change", "-0.9", "-2", "--spread", "0.58"]) == 0
    out = capsys.readouterr().out
    assert "| -0.9% | 8 |" in out and "| -2% | 3 |" in out
    assert seeds_needed(math.log1p(-0.009), 0.0058) == 8 and seeds_needed(-0.9, 0.0058) == 2
    assert report.main(["seeds", "--change", "+3", "--spread", "1.5", "--cells", "4"]) == 0
    assert f"| +3% | {seeds_needed(math.log1p(0.03), 0.015, cells=4)} |" in capsys.readouterr().out
    for argv, message in ((["--change", "0", "--spread", "1"], "--change: expected a finite nonzero percentage"),
                          # float() takes these: they printed "| +nan% | more than 10000 seeds per cell |"
                          (["--change", "nan", "--spread", "1"], "--change: expected a finite nonzero percentage"),
                          (["--change", "-1", "inf", "--spread", "1"], "above -100, got inf"),
                          (["--change", "-1", "--spread", "0"], "--spread: expected a percentage between 0 and 100"),
                          (["--change", "-1", "--spread", "1", "--cells", "1"], "--cells: expected 2 (one row"),
                          (["--change", "-1", "--spread", "1", "--cells", "3"], "or 4 (how a gain differs"),
                          (["--change", "-1", "--spread", "1", "--power", "1"], "--power: expected a probability")):
        assert report.main(["seeds", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_a_spread_of_zero_has_no_interval():
    """Identical values in every sample: the chi-square interval of s = 0 is [0, 0], which the
    seed-spread line printed as '0.00% [0.00, 0.00]' (a spread known exactly) beside a
    `report.py seeds --spread 0.00` that report.py refuses. One sample of two (1 degree of
    freedom) has the wide interval chi-square gives: [0.5 s, 31.9 s]."""
    from analysis.comparisons import seed_spread_line
    zero = pooled_spread([[4.6, 4.6], [4.5, 4.5, 4.5]])
    assert (zero.std, zero.low, zero.high, zero.df, zero.groups) == (0.0, None, None, 3, 2)
    one = pooled_spread([[1.0, 3.0]])
    assert one.df == 1 and one.std == pytest.approx(math.sqrt(2))
    assert one.low == pytest.approx(math.sqrt(2 / scipy_stats.chi2.ppf(0.975, 1)))
    assert one.high == pytest.approx(math.sqrt(2 / scipy_stats.chi2.ppf(0.025, 1)))
    assert one.high / one.std == pytest.approx(31.9, abs=0.05) and one.low / one.std == pytest.approx(0.446, abs=1e-3)

    class Cell:
        def __init__(self, *ppls):
            self.runs = [type("Run", (), {"test_ppl": p, "seed": i})() for i, p in enumerate(ppls)]
    line = seed_spread_line([Cell(100.0, 100.0), Cell(95.0, 95.0)], lambda c: "row")
    assert "**0.00% (every row has identical test ppl: no interval)**" in line
    assert "row 0.00% (n = 2, identical test ppl: no interval)" in line and "--spread" not in line
    line = seed_spread_line([Cell(100.0, 100.0), Cell(95.0, 96.0)], lambda c: "row")
    pooled = pooled_spread([[math.log(100.0)] * 2, [math.log(95.0), math.log(96.0)]])
    assert f"**{100 * pooled.std:.2f}% [{100 * pooled.low:.2f}, {100 * pooled.high:.2f}]**" in line
    assert "row 0.00% (n = 2, identical test ppl: no interval)" in line and "--spread 0.52`" in line
    # a spread of 100% or more: report.py seeds refuses it, so no command is offered
    line = seed_spread_line([Cell(10.0, 200.0)], lambda c: "row")
    assert "no count of seeds is planned at a spread this large" in line and "--spread" not in line


def test_a_p_that_underflows_is_shown_as_a_bound():
    """25 runs a side, each side's log ppl within 1e-13 of each other: t is in the hundreds of
    billions over 48 degrees of freedom and scipy's p is 0.0, which printed "p = 0.0e+00" (and
    Holm's "0.0e+00", the --paper column "0.00e+00") as if exact; it is "p < 1e-300"."""
    from analysis.stats import format_p
    from analysis.tables import format_p as format_student_p
    near = [1e-13 * i for i in range(25)]
    estimate = welch([math.log(90.0) + x for x in near], [math.log(100.0) + x for x in near])
    assert estimate.p == 0.0 and estimate.df == pytest.approx(48)
    assert estimate.describe().endswith("], p < 1e-300") and format_p(holm([estimate.p, 0.5])[0]) == "< 1e-300"
    assert format_student_p(0.0) == "< 1e-300" and format_student_p(2e-300) == "2.00e-300"
    assert format_p(2e-300) == "2.0e-300" and format_p(0.0042) == "0.0042"
    assert Estimate(0.1, (3, 3), 0.05, 0.15, 0.0042, 4.0).describe().endswith("p = 0.0042")
