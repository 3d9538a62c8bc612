"""The reports' statistics, in one place: differences of means with their Welch interval and
p-value, and the seed-to-seed spread.

Perplexities are compared on the log scale. Log perplexity is the mean cross-entropy per token,
so a difference of mean log perplexities is the log of a ratio of (geometric-mean) perplexities,
and a report states it as that ratio's change in percent, exp(difference) - 1, its interval
transformed the same way: "-5.8% [-9.1, -2.4]" is 5.8% below, the 95% interval from 9.1% to
2.4% below. On that scale a run's spread is a fraction of its perplexity whatever the
perplexity's size, which is what makes spreads comparable across heads, d's and studies.

Every estimate here is a weighted sum of sample means, sum_i w_i mean_i: a difference of two
cells (weights 1, -1, Welch's unequal-variance t) or the difference between two d's of a head's
difference to Softmax (1, -1, -1, 1). Its variance is sum_i w_i^2 s_i^2 / n_i, its degrees of
freedom Welch-Satterthwaite's, (sum_i v_i)^2 / sum_i v_i^2 / (n_i - 1) with v_i = w_i^2 s_i^2 / n_i.
A sample of one value has no variance of its own: an estimate that involves one has no interval
and no p-value (`why_not` says so), rather than one made up from other cells' spread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95           # of every interval the reports give


@dataclass(frozen=True)
class Estimate:
    """sum_i w_i mean_i on the log scale, with its interval and two-sided p-value against 0."""
    value: float
    sizes: tuple[int, ...]                 # the samples' sizes (n of each cell)
    low: float | None = None               # the LEVEL interval; None with why_not
    high: float | None = None
    p: float | None = None
    df: float | None = None                # Welch-Satterthwaite degrees of freedom
    why_not: str | None = None             # why there is no interval: "n = 1", "no spread"

    @property
    def percent(self) -> float:
        return percent(self.value)

    def describe(self) -> str:
        """"-5.8% [-9.1, -2.4], p = 0.0042", or "-5.8% (n = 1: no interval)". A bound that would
        print as +0.0 or -0.0 gets the digits that show its side of zero ("[+0.03, +3.1]"), so
        that an interval read as touching zero is not one with p < 0.05."""
        text = f"{self.percent:+.1f}%"
        if self.why_not:
            return f"{text} ({self.why_not}: no interval)"
        return (f"{text} [{format_bound(percent(self.low))}, {format_bound(percent(self.high))}], "
                f"{p_clause(self.p)}")


def percent(log_ratio: float) -> float:
    """A difference of log perplexities as the change of the perplexity ratio, in percent."""
    return 100 * math.expm1(log_ratio)


def format_bound(value: float, digits: int = 1) -> str:
    """A bound to `digits` decimals (a percent: one), or to as many more (up to three more) as
    show it is not zero, so that an interval read as touching zero is not one that excludes it."""
    for shown in range(digits, digits + 4):
        text = f"{value:+.{shown}f}"
        if value == 0 or text.strip("+-0.") != "":
            return text
    return text


# A t statistic in the millions over tens of degrees of freedom (near-identical runs a side) makes
# scipy's p underflow to 0, which "p = 0.0e+00" would print as if exact: such a p is shown as a bound.
SMALLEST_P = 1e-300


def format_p(p: float) -> str:
    if p < SMALLEST_P:
        return f"< {SMALLEST_P:.0e}"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.2g}"


def p_clause(p: float) -> str:
    """"p = 0.0042", or "p < 1e-300" (format_p)."""
    text = format_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def combination(samples: Sequence[Sequence[float]], weights: Sequence[float],
                level: float = LEVEL) -> Estimate:
    """sum_i weights[i] * mean(samples[i]), with its Welch interval and p-value (module doc)."""
    if len(samples) != len(weights) or not samples:
        raise ValueError("one weight per sample")
    arrays = [np.asarray(s, dtype=np.float64) for s in samples]
    if any(a.size == 0 for a in arrays):
        raise ValueError("an empty sample has no mean")
    sizes = tuple(a.size for a in arrays)
    value = float(sum(w * a.mean() for w, a in zip(weights, arrays)))
    if min(sizes) < 2:
        return Estimate(value, sizes, why_not="n = 1")
    terms = [w * w * a.var(ddof=1) / a.size for w, a in zip(weights, arrays)]
    variance = sum(terms)
    if variance == 0:
        return Estimate(value, sizes, why_not="no spread")
    df = variance ** 2 / sum(t * t / (a.size - 1) for t, a in zip(terms, arrays))
    se = math.sqrt(variance)
    half = stats.t.ppf(0.5 + level / 2, df) * se
    p = float(2 * stats.t.sf(abs(value) / se, df))
    return Estimate(value, sizes, value - half, value + half, p, df)


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Estimate:
    """mean(a) - mean(b): Welch's unequal-variance t interval and test."""
    return combination([a, b], [1.0, -1.0], level)


def difference_of_differences(a1, b1, a2, b2, level: float = LEVEL) -> Estimate:
    """(mean(a1) - mean(b1)) - (mean(a2) - mean(b2)): e.g. how a head's gain over Softmax at one
    d differs from its gain at another, four independent samples."""
    return combination([a1, b1, a2, b2], [1.0, -1.0, -1.0, 1.0], level)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values, in the order given: sorted ascending,
    the j-th smallest (from 1) is multiplied by (m - j + 1), capped at 1, and made no smaller than
    the adjusted value before it. An adjusted p below 0.05 is a difference that stands at 95%
    with the whole family's chance of any false finding held to 5%."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - j) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Spread:
    """The sample standard deviation pooled over groups (each around its own mean), with its
    chi-square interval (None when every sample's values are identical: see pooled_spread)."""
    std: float
    low: float | None
    high: float | None
    df: int                                # sum over the groups of (n - 1)
    groups: int


# report.py seeds plans for a seed spread (the std of log test ppl, in percent) below this: runs
# of one setting whose perplexities differ by factors are not a spread a seed count can serve.
SEEDS_SPREAD_BELOW = 100


def pooled_spread(samples: Sequence[Sequence[float]], level: float = LEVEL) -> Spread | None:
    """The within-group spread of the samples of two values or more, pooled:
    s^2 = sum (n_i - 1) s_i^2 / sum (n_i - 1); None when no sample has two values. Where every
    sample's values are identical the std is 0 and there is no interval: the chi-square interval
    of s = 0 is [0, 0], a spread known exactly, where the runs only show none."""
    used = [np.asarray(s, dtype=np.float64) for s in samples if len(s) >= 2]
    if not used:
        return None
    df = sum(a.size - 1 for a in used)
    squares = float(sum(((a - a.mean()) ** 2).sum() for a in used))
    if squares == 0:
        return Spread(0.0, None, None, df, len(used))
    low = math.sqrt(squares / stats.chi2.ppf(0.5 + level / 2, df))
    high = math.sqrt(squares / stats.chi2.ppf(0.5 - level / 2, df))
    return Spread(math.sqrt(squares / df), low, high, df, len(used))


def power(value: float, spread: float, seeds: int, cells: int = 2, level: float = LEVEL) -> float:
    """The probability that the LEVEL interval of a comparison of `cells` cells (weights +-1: 2,
    a head against Softmax; 4, a gain at one d against the gain at another) excludes 0, when its
    true value is `value` and each cell has `seeds` runs of seed spread `spread` (the std of log
    ppl, as pooled_spread gives it). The estimate's standard error is spread * sqrt(cells / seeds)
    and its degrees of freedom cells * (seeds - 1), Welch-Satterthwaite's when the cells' spreads
    and sizes are equal; the t statistic is then noncentral t with noncentrality |value| / se."""
    if seeds < 2:
        return float("nan")             # one run per cell: no interval (combination's "n = 1")
    df = cells * (seeds - 1)
    # capped: scipy's nct gives nan past a noncentrality of about 3e9 (a tiny --spread), where the
    # power is 1 to float precision; at 1e6 it is already exactly 1.0 at every df
    noncentrality = min(abs(value) / (spread * math.sqrt(cells / seeds)), 1e6)
    t = stats.t.ppf(0.5 + level / 2, df)
    # the lower tail P(T' < -t) as P(T'' > t) at -noncentrality: scipy's nct.cdf gives nan there
    # once the noncentrality is large (12.6 at 2 degrees of freedom)
    return float(stats.nct.sf(t, df, noncentrality) + stats.nct.sf(t, df, -noncentrality))


def welch_power(value: float, spreads: Sequence[float], seeds: int, level: float = LEVEL,
                draws: int = 40_000) -> float:
    """power() when each cell has a spread of its own (`spreads`, one per cell: 2 cells weighted
    +1, -1, or 4 weighted +1, -1, -1, +1 as difference_of_differences), and the interval is the
    reports' Welch interval: its degrees of freedom then vary with the cells' sample variances, so
    the probability is simulated, `draws` times, from the sampling laws of a cell's mean (normal,
    variance s^2 / n) and sample variance (s^2 chi^2_{n-1} / (n - 1)). A fixed random seed makes
    the answer repeatable (its Monte Carlo error is about 0.003 near 0.8 at 40,000 draws)."""
    if seeds < 2:
        return float("nan")
    rng = np.random.default_rng(12345)
    variances = np.asarray(spreads, dtype=np.float64) ** 2 / seeds           # of each cell's mean
    estimate = abs(value) + rng.standard_normal(draws) * math.sqrt(variances.sum())
    sample = variances[:, None] * rng.chisquare(seeds - 1, (len(variances), draws)) / (seeds - 1)
    total = sample.sum(axis=0)
    df = total ** 2 / (sample ** 2 / (seeds - 1)).sum(axis=0)
    return float(np.mean(np.abs(estimate) / np.sqrt(total) > stats.t.ppf(0.5 + level / 2, df)))


def power_table(changes_pct, spread_pct: float | Sequence[float], cells: int = 2, wanted: float = 0.8) -> str:
    """report.py seeds: seeds_needed for each change, in the reports' units (percent of test ppl;
    the spread, the std of log ppl, in percent as pooled_spread's line prints it: one shared by
    the cells, or one per cell)."""
    each = not isinstance(spread_pct, (int, float))
    spread = [s / 100 for s in spread_pct] if each else spread_pct / 100
    rows = []
    for change in changes_pct:
        try:
            needed = str(seeds_needed(math.log1p(change / 100), spread, cells, wanted))
        except ValueError as e:                   # more than seeds_needed's most
            needed = str(e)
        rows.append(f"| {change:+g}% | {needed} |")
    if each:
        how = (f"the cells' seed spreads of test ppl are {', '.join(f'{s:g}%' for s in spread_pct)} "
               f"(analysis.stats.welch_power: the reports' Welch interval, its degrees of freedom "
               f"varying with the cells' sample variances, simulated)")
    else:
        how = (f"the seed spread of test ppl is {spread_pct:g}% in every cell (analysis.stats.seeds_needed: "
               f"noncentral t, {cells} x (n - 1) degrees of freedom; with a spread per cell, "
               f"--spread takes one for each, and Welch's interval asks more where they differ)")
    return (f"| true change | seeds per cell |\n|---|---|\n" + "\n".join(rows) + "\n\n"
            f"The fewest seeds per cell at which the 95% interval of the comparison ({cells} cells, "
            f"each of that many runs) excludes zero with probability {wanted:g}, when the change is the "
            f"true one and {how}. A difference measured near the edge "
            f"of its interval is an optimistic guess of the true one; Holm's adjustment over a table's "
            f"pairs asks for more.\n")


def seeds_needed(value: float, spread: float | Sequence[float], cells: int = 2, wanted: float = 0.8,
                 level: float = LEVEL, most: int = 10_000) -> int:
    """The fewest seeds per cell at which the LEVEL interval of the comparison excludes 0 with
    probability `wanted` (power above), when its true value is `value` (log scale: a change of
    c percent is log(1 + c / 100)) and the seed spread `spread` (the std of log ppl: 0.0066 for
    0.66%; `report.py seeds` takes both in percent). The same number answers "how many seeds before the interval
    excludes `value`, when the truth is 0": e.g. before a difference of gains measured near 0
    rules out the growth an earlier study found. With one spread per cell (a sequence of
    `cells` spreads), the power is Welch's, simulated (welch_power)."""
    spreads = None if isinstance(spread, (int, float)) else list(spread)
    if value == 0 or min(spreads or [spread]) <= 0:
        raise ValueError("seeds_needed wants a nonzero value and a positive spread")
    if spreads is None:
        for seeds in range(2, most + 1):
            if power(value, spread, seeds, cells, level) >= wanted:
                return seeds
        raise ValueError(f"more than {most} seeds per cell")
    if len(spreads) != cells:
        raise ValueError(f"one spread per cell: {cells} cells, {len(spreads)} spreads")
    # Each cell its own spread: Welch's power, simulated (repeatably), found by doubling the
    # seeds and then halving the gap, as a scan of thousands of simulations would be slow.
    enough = lambda seeds: welch_power(value, spreads, seeds, level) >= wanted
    low, high = 1, 2
    while not enough(high):
        if high >= most:
            raise ValueError(f"more than {most} seeds per cell")
        low, high = high, min(2 * high, most)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
