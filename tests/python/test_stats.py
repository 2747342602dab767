"""beaconkv.stats: the intervals and the paired test behind every accuracy comparison."""

import math

import pytest

from beaconkv.stats import mcnemar_p, paired, wilson


def test_wilson_interval():
    lo, hi = wilson(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    # All right (all wrong): the interval ends exactly at 1 (0), whatever n.
    for n in (1, 6, 21, 100, 200):
        lo, hi = wilson(1.0, n)
        assert hi == 1.0 and 0.0 < lo < 1.0
        lo, hi = wilson(0.0, n)
        assert lo == 0.0 and 0.0 < hi < 1.0
    assert 0.98 < wilson(1.0, 200)[0]
    assert wilson(None, 10) is None and wilson(0.5, 0) is None


def test_mcnemar_exact():
    assert mcnemar_p(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_p(6, 0) == mcnemar_p(0, 6)
    assert mcnemar_p(3, 1) == pytest.approx(2 * (1 + 4) / 16)
    assert mcnemar_p(5, 5) == 1.0 and mcnemar_p(0, 0) == 1.0
    with pytest.raises(ValueError, match="discordant"):
        mcnemar_p(-1, 2)


def test_paired_comparison():
    a = [True, True, True, False, False, True]
    b = [True, False, True, True, True, True]
    c = paired(a, b)
    assert (c.n, c.correct_a, c.correct_b, c.lost, c.gained) == (6, 4, 5, 1, 2)
    assert c.difference == pytest.approx(1 / 6)
    half = 1.96 * math.sqrt(3 - 1 / 6) / 6
    assert c.difference_interval() == pytest.approx((1 / 6 - half, 1 / 6 + half))
    # Identical runs: no discordant problems, a zero-width interval at 0.
    same = paired(a, a)
    assert same.difference == 0 and same.difference_interval() == (0.0, 0.0)
    assert same.p_value == 1.0
    with pytest.raises(ValueError, match="same problems"):
        paired(a, b[:-1])
    with pytest.raises(ValueError, match="without problems"):
        paired([], [])
