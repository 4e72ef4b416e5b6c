"""Repeat statistics and Welch verdicts against values worked out by hand or published."""

from __future__ import annotations

import math
import statistics

import pytest

from zcnet.report.stats import summarize, welch


def test_summary_of_known_values() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s.n == 4
    assert s.mean == 2.5
    # Sample stdev: sqrt(((1.5^2 + 0.5^2) * 2) / 3) = sqrt(5/3).
    assert s.stdev == pytest.approx(math.sqrt(5 / 3))
    assert (s.min, s.max) == (1.0, 4.0)
    assert s.format(2) == "2.50 ± 1.29"


def test_single_sample_has_no_spread() -> None:
    s = summarize([16.86])
    assert (s.n, s.stdev, s.unstable) == (1, 0.0, False)
    assert s.format(2) == "16.86"


@pytest.mark.parametrize(("values", "unstable"), [
    ([9.0, 11.0], True),              # stdev 1.414 = 14% of 10
    ([9.9, 10.1], False),             # stdev 0.141 = 1.4%
    ([90.0, 110.0, 100.0], True),     # stdev exactly 10% of the mean: the limit is inclusive
    ([95.0, 105.0, 100.0], False),    # 5%
])
def test_unstable_at_ten_percent(values: list[float], unstable: bool) -> None:
    assert summarize(values).unstable is unstable


def test_summarize_refuses_nothing() -> None:
    with pytest.raises(ValueError):
        summarize([])


# Welch's t-test example with equal sizes and unequal variances, as published in the
# Wikipedia article "Welch's t-test" (example 1): t = -2.46, df = 24.9, p = 0.021.
A1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
A2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]


def test_welch_matches_published_example() -> None:
    v = welch(A1, A2)
    assert v.pvalue == pytest.approx(0.021, abs=0.0015)
    assert v.significant
    assert v.ratio == pytest.approx(statistics.fmean(A2) / statistics.fmean(A1))
    assert v.text() == f"{v.ratio:.2f}x faster, significant"


def test_verdict_wording_and_direction() -> None:
    base = [10.0, 10.2, 9.8, 10.1, 9.9]
    faster = [12.4, 12.5, 12.3, 12.6, 12.2]
    assert welch(base, faster).text() == "1.24x faster, significant"
    assert welch(faster, base).text() == "1.24x slower, significant"
    # For a cost (ns per packet) lower is better: fewer ns is "faster".
    assert welch(faster, base, higher_is_better=False).text() == "1.24x faster, significant"
    noisy = [9.0, 11.5, 10.0, 8.8, 11.0]
    assert welch(base, noisy).text() == "not significant"


def test_no_verdict_without_repeats() -> None:
    v = welch([10.0], [12.0])
    assert not v.significant
    assert "--repeat" in v.text()


def test_constant_samples() -> None:
    assert welch([5.0, 5.0], [5.0, 5.0]).text() == "not significant"
    assert welch([5.0, 5.0], [6.0, 6.0]).text() == "1.20x faster, significant"


def test_verdict_without_scipy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from zcnet.errors import ZcnetError

    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(ZcnetError, match="scipy") as info:
        welch([1.0, 2.0], [3.0, 4.0])
    assert info.value.hint == "pip install scipy"


def test_verdict_against_a_zero_mean_names_the_right_direction() -> None:
    v = welch([0.0, 0.0, 0.0], [10.0, 11.0, 12.0])
    assert v.significant
    assert "nan" not in v.text()
    assert "faster" in v.text()
    v = welch([10.0, 11.0, 12.0], [0.0, 0.0, 0.0])
    assert "nan" not in v.text() and "slower" in v.text()
