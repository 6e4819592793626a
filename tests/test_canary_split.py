"""The canary's split (`router.split`): permuted blocks keep the arms at their shares after any
number of conversations, without tying an arm to the order conversations arrive in, and each
conversation keeps its arm."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tracefix.router.split import MAX_BLOCK, Split, block_size


def test_block_sizes_hold_the_share_exactly_where_a_small_block_can() -> None:
    assert [block_size(share) for share in (0.5, 0.2, 0.25, 0.1, 0.3, 0.05)] == [2, 5, 4, 10, 10, 20]
    assert block_size(0.33) == MAX_BLOCK


@pytest.mark.parametrize("share", [0.5, 0.2, 0.3])
def test_after_any_number_of_conversations_each_arm_is_within_a_block_of_its_share(share: float) -> None:
    split = Split(share, random.Random(3))
    canary = 0
    for number in range(1, 201):
        canary += split.arm(f"conversation-{number}") == "canary"
        assert abs(canary - share * number) <= split.size * share + 1e-9, (number, canary)
    assert split.assigned == {"canary": round(200 * share), "control": 200 - round(200 * share)}


def test_at_a_half_share_ten_on_each_arm_take_twenty_conversations() -> None:
    split = Split(0.5, random.Random(0))
    assert Counter(split.arm(f"c-{index}") for index in range(20)) == {"canary": 10, "control": 10}


def test_an_arm_is_not_foretold_by_the_order_conversations_arrive_in() -> None:
    """A deterministic alternation would put every even conversation on one arm; permuted blocks
    give each position both arms."""
    first_of_block = Counter()
    for seed in range(200):
        split = Split(0.5, random.Random(seed))
        first_of_block[split.arm("first")] += 1
    assert 70 <= first_of_block["canary"] <= 130, first_of_block


def test_a_share_no_small_block_holds_is_kept_on_average() -> None:
    split = Split(0.33, random.Random(7))
    arms = Counter(split.arm(f"c-{index}") for index in range(20 * 500))
    assert abs(arms["canary"] / 10_000 - 0.33) < 0.01


def test_a_conversation_keeps_its_arm_and_the_memory_is_bounded() -> None:
    split = Split(0.5, random.Random(1), memory=8)
    arms = {f"c-{index}": split.arm(f"c-{index}") for index in range(8)}
    assert all(split.arm(unit) == arm for unit, arm in arms.items())  # asked again: the same arm
    assert split.assigned == {"canary": 4, "control": 4}  # and not counted again
    split.arm("c-8")  # a ninth conversation: the least recently seen one is forgotten
    assert len(split._arms) == 8 and "c-0" not in split._arms
    assert split.arm(None) in ("canary", "control") and sum(split.assigned.values()) == 10  # no unit: a place, not remembered


def test_a_share_outside_zero_and_one_is_refused() -> None:
    for share in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            Split(share)
