"""The reuse sampler: running correlations against statistics', a bounded ring of rows."""

from __future__ import annotations

import statistics

import pytest

from epp.scheduling.reuse_sampler import SAMPLE_FIELDS, Correlation, ReuseSampler


def row(predicted: float, routed: float, confirmed: float, observed: float) -> tuple[float, ...]:
    return (predicted, routed, confirmed, observed) + (0.0,) * (len(SAMPLE_FIELDS) - 4)


def test_correlation_matches_the_statistics_module() -> None:
    xs = [112.0, 48.0, 112.0, 0.0, 64.0]
    ys = [112.0, 48.0, 100.0, 16.0, 32.0]
    c = Correlation()
    for x, y in zip(xs, ys, strict=True):
        c.add(x, y)
    st = c.state()
    assert st["samples"] == 5
    assert st["pearson"] == pytest.approx(statistics.correlation(xs, ys))
    assert st["meanPredictedTokens"] == pytest.approx(statistics.mean(xs))
    assert st["meanObservedTokens"] == pytest.approx(statistics.mean(ys))
    assert st["meanAbsErrorTokens"] == pytest.approx(
        statistics.mean(abs(x - y) for x, y in zip(xs, ys, strict=True))
    )


def test_correlation_is_undefined_without_spread() -> None:
    c = Correlation()
    assert c.state() == {
        "samples": 0,
        "pearson": None,
        "meanPredictedTokens": None,
        "meanObservedTokens": None,
        "meanAbsErrorTokens": None,
    }
    c.add(5.0, 1.0)
    c.add(5.0, 2.0)  # no spread in the predictions: no correlation
    assert c.state()["pearson"] is None


def test_each_prediction_is_correlated_with_the_observed_tokens() -> None:
    s = ReuseSampler()
    s.add(row(10, 20, 30, 10))
    s.add(row(20, 20, 10, 25))
    s.add(row(30, 40, 20, 30))
    s.missing()
    st = s.state()
    assert st["predictedVsObserved"]["responsesWithoutCachedTokens"] == 1
    for key, xs in [
        ("predictedVsObserved", [10, 20, 30]),
        ("asRoutedVsObserved", [20, 20, 40]),
        ("confirmedOnlyVsObserved", [30, 10, 20]),
    ]:
        assert st[key]["pearson"] == pytest.approx(statistics.correlation(xs, [10, 25, 30])), key
    assert st["recentPredictions"]["fields"] == list(SAMPLE_FIELDS)


def test_the_ring_keeps_the_latest_rows_only() -> None:
    s = ReuseSampler(size=2)
    for k in range(3):
        s.add(row(k, k, k, k))
    assert [r[0] for r in s.state()["recentPredictions"]["rows"]] == [1, 2]
    assert s.state()["predictedVsObserved"]["samples"] == 3  # the correlations keep every row
