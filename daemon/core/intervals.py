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


def paired_difference(after_only: int, before_only: int, both: int, neither: int, z: float = Z95) -> tuple[float, float, float]:
    """(rate_after − rate_before, low, high) for two rates measured on the same items: Newcombe's
    method 10 for paired proportions (the Wilson intervals of both rates, corrected by the
    correlation of the pairs). ``after_only`` counts items only the second succeeded on, and so on."""
    total = after_only + before_only + both + neither
    if total == 0:
        return 0.0, -1.0, 1.0
    after, before = (both + after_only) / total, (both + before_only) / total
    low_a, high_a = wilson(both + after_only, total, z)
    low_b, high_b = wilson(both + before_only, total, z)
    spread = (both + after_only) * (neither + before_only) * (both + before_only) * (neither + after_only)
    phi = (both * neither - after_only * before_only) / math.sqrt(spread) if spread else 0.0
    delta = after - before
    low = delta - math.sqrt(max(0.0, (after - low_a) ** 2 - 2 * phi * (after - low_a) * (high_b - before) + (high_b - before) ** 2))
    high = delta + math.sqrt(max(0.0, (high_a - after) ** 2 - 2 * phi * (high_a - after) * (before - low_b) + (before - low_b) ** 2))
    return delta, max(-1.0, low), min(1.0, high)


def mcnemar_p(after_only: int, before_only: int) -> float:
    """Two-sided exact McNemar test: the binomial probability, under no difference, of a split of
    the discordant pairs at least as uneven as this one."""
    discordant = after_only + before_only
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, count) for count in range(min(after_only, before_only) + 1)) / 2**discordant
    return min(1.0, 2 * tail)
