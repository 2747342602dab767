"""Intervals and paired tests for accuracy figures (``beaconkv compare``, the study tables).

Every figure of an accuracy study is a proportion of problems, and a comparison of two
policies on the same problems is paired: what matters is the problems one gets and the other
loses."""

from __future__ import annotations

import math
from dataclasses import dataclass


def wilson(accuracy: float | None, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval (95 % by default) of a proportion `accuracy` of `n` trials;
    None without trials or without a proportion."""
    if accuracy is None or not n:
        return None
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n))
    # At 0 and 1 the interval ends exactly there (the float sum may miss it by an ulp).
    lo = 0.0 if accuracy <= 0.0 else max(0.0, centre - half)
    hi = 1.0 if accuracy >= 1.0 else min(1.0, centre + half)
    return lo, hi


def mcnemar_p(lost: int, gained: int) -> float:
    """Exact two-sided McNemar p of `lost` against `gained` discordant pairs (a binomial test
    of the smaller count against half of their sum); 1 when there are none."""
    if lost < 0 or gained < 0:
        raise ValueError(f"discordant counts must be >= 0, got {lost} and {gained}")
    n, k = lost + gained, min(lost, gained)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


@dataclass
class PairedComparison:
    """Two runs on the same n problems: a = the reference, b = the other."""

    n: int
    correct_a: int
    correct_b: int
    lost: int  # right in a, wrong in b
    gained: int  # wrong in a, right in b

    @property
    def difference(self) -> float:
        """Accuracy of b minus accuracy of a."""
        return (self.correct_b - self.correct_a) / self.n

    def difference_interval(self, z: float = 1.96) -> tuple[float, float]:
        """The normal interval of the paired difference (the variance of the per-problem
        differences, which only the discordant problems carry)."""
        d, discordant = self.gained - self.lost, self.lost + self.gained
        se = math.sqrt(max(discordant - d * d / self.n, 0.0)) / self.n
        return self.difference - z * se, self.difference + z * se

    @property
    def p_value(self) -> float:
        return mcnemar_p(self.lost, self.gained)


def paired(a: list[bool], b: list[bool]) -> PairedComparison:
    """The paired comparison of per-problem correctness lists of the same problems."""
    if len(a) != len(b):
        raise ValueError(f"paired runs must cover the same problems: {len(a)} against {len(b)}")
    if not a:
        raise ValueError("paired runs without problems")
    lost = sum(x and not y for x, y in zip(a, b))
    gained = sum(y and not x for x, y in zip(a, b))
    return PairedComparison(len(a), sum(map(bool, a)), sum(map(bool, b)), lost, gained)
