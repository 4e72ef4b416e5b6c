"""Repeat statistics and A/B verdicts (pyperf's habits: mean ± stdev, warn when unstable).

The stdev is the sample stdev (ddof=1), as pyperf and the seed's "±" figures use. A result is
unstable when its stdev is at least 10% of its mean: such a number needs more repeats or a quieter
machine before anyone should believe a ratio built on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zcnet.errors import ZcnetError

UNSTABLE_SHARE = 0.10
ALPHA = 0.05


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    stdev: float
    min: float
    max: float

    @property
    def unstable(self) -> bool:
        if self.n < 2 or self.mean == 0:
            return False
        return self.stdev >= UNSTABLE_SHARE * abs(self.mean)

    def format(self, digits: int = 2) -> str:
        """``"16.86 ± 0.15"``; a single sample has no ±."""
        if self.n < 2:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.stdev:.{digits}f}"


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return Summary(n, mean, math.sqrt(var), min(values), max(values))


@dataclass(frozen=True)
class Verdict:
    """B relative to A. ``ratio`` > 1 means B is better in the metric's own direction."""

    ratio: float
    pvalue: float | None
    significant: bool
    reason: str = ""

    def text(self) -> str:
        if self.reason:
            return self.reason
        if not self.significant:
            return "not significant"
        word = "faster" if self.ratio >= 1 else "slower"
        factor = self.ratio if self.ratio >= 1 else 1 / self.ratio
        return f"{factor:.2f}x {word}, significant"


def welch(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True,
          alpha: float = ALPHA) -> Verdict:
    """Welch's t-test (unequal variances) of B against A."""
    try:
        from scipy import stats as sps  # heavy; only verdicts need it
    except ImportError:
        raise ZcnetError("significance verdicts need scipy, which is not installed",
                         "pip install scipy") from None

    sa, sb = summarize(a), summarize(b)
    if sa.mean == 0 or sb.mean == 0:
        ratio = math.nan
    else:
        ratio = sb.mean / sa.mean if higher_is_better else sa.mean / sb.mean
    if sa.n < 2 or sb.n < 2:
        return Verdict(ratio, None, False, "no verdict: needs --repeat 2 or more on both sides")
    if sa.stdev == 0 and sb.stdev == 0:
        # The t statistic is undefined; identical constant samples are equal, different ones
        # differ with certainty.
        same = sa.mean == sb.mean
        p = 1.0 if same else 0.0
    else:
        p = float(sps.ttest_ind(list(b), list(a), equal_var=False).pvalue)
    significant = p < alpha
    if significant and math.isnan(ratio):
        # A zero mean leaves no ratio, but the direction is still known.
        better = sb.mean > sa.mean if higher_is_better else sb.mean < sa.mean
        return Verdict(ratio, p, True, f"{'faster' if better else 'slower'}, significant "
                                       "(no ratio: a mean is 0)")
    return Verdict(ratio, p, significant)
