"""Latency histograms (HDR), filled in batches: the request/response workers record into one, a
session merges its flows' and sends one encoded histogram with its results."""

from __future__ import annotations

import numpy as np
from hdrh.histogram import HdrHistogram

from zcnet.bench.records import Latency

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# 1 ns .. 100 s at 3 significant digits: 0.1 % resolution, the usual choice for latency.
HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS = 1, 100_000_000_000, 3


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HIST_LOWEST, HIST_HIGHEST, HIST_DIGITS)


def record_batch(hist: HdrHistogram, values: np.ndarray) -> None:
    """Add many values at once: bucket them with numpy, then one call per distinct bucket.

    A value's HDR bucket is fixed by its top bits (``sub_bucket_half_count_magnitude + 1`` of
    them); clearing the bits below gives the bucket's lowest equivalent value, so values that
    share a bucket collapse under ``np.unique`` and the histogram sees each bucket once.
    """
    v = np.asarray(values, dtype=np.int64)
    v = v[(v >= 0) & (v <= hist.highest_trackable_value)]
    if not v.size:
        return
    width = np.zeros(v.shape, dtype=np.int64)
    big = v > 0
    width[big] = np.floor(np.log2(v[big])).astype(np.int64) + 1      # bit length
    shift = np.maximum(width - (hist.sub_bucket_half_count_magnitude + 1) - hist.unit_magnitude,
                       0) + hist.unit_magnitude
    low = (v >> shift) << shift
    vals, counts = np.unique(low, return_counts=True)
    for value, count in zip(vals.tolist(), counts.tolist(), strict=True):
        hist.record_value(value, count)


def summarize(hist: HdrHistogram) -> Latency | None:
    """Percentiles in microseconds (the unit people compare RR latencies in); None without
    samples."""
    if hist.get_total_count() == 0:
        return None

    def us(ns: float) -> float:
        return round(ns / 1000, 3)

    p50, p90, p99, p99_9 = (us(hist.get_value_at_percentile(p)) for p in PERCENTILES)
    return Latency(p50_us=p50, p90_us=p90, p99_us=p99, p99_9_us=p99_9,
                   mean_us=us(hist.get_mean_value()), max_us=us(hist.get_max_value()),
                   min_us=us(hist.get_min_value()))


def encode_histogram(hist: HdrHistogram) -> str:
    return hist.encode().decode("ascii")


def merge_encoded(encoded: list[str]) -> HdrHistogram:
    total = new_histogram()
    for e in encoded:
        total.decode_and_add(e)
    return total
