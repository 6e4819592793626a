"""Confidence intervals for rates: Wilson's score interval for one proportion and Newcombe's hybrid
score interval for the difference of two. Used wherever tracefix compares rates on small samples
(held-out evaluation, canary and live failure rates)."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of successes/total; (0, 1) when there is nothing to go on."""
    if total == 0:
        return 0.0, 1.0
    share = successes / total
    denominator = 1 + z * z / total
    centre = (share + z * z / (2 * total)) / denominator
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def difference(hits_a: int, total_a: int, hits_b: int, total_b: int, z: float = Z95) -> tuple[float, float, float]:
    """(rate_a − rate_b, low, high): Newcombe's method 10, from the two Wilson intervals. Its
    coverage stays close to nominal for small samples and rates near 0 or 1, where the Wald interval
    of a difference does not."""
    rate_a = hits_a / total_a if total_a else 0.0
    rate_b = hits_b / total_b if total_b else 0.0
    low_a, high_a = wilson(hits_a, total_a, z)
    low_b, high_b = wilson(hits_b, total_b, z)
    delta = rate_a - rate_b
    low = delta - math.sqrt((rate_a - low_a) ** 2 + (high_b - rate_b) ** 2)
    high = delta + math.sqrt((high_a - rate_a) ** 2 + (rate_b - low_b) ** 2)
    return delta, max(-1.0, low), min(1.0, high)
