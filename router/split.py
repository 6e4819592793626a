"""Which arm of a canary each conversation takes: permuted blocks, remembered per conversation.

A coin per conversation leaves one arm short now and then, and the canary's verdict waits for
outcomes on both arms: at a 50 % share, ten on each arm take 23.5 conversations on average and 28
one time in ten, where a balanced split takes 20. Permuted blocks (as trials randomise) keep the
arms balanced without tying either to the order traffic arrives in: each block of `size`
conversations holds `round(share · size)` canary places in random order, so after any number of
conversations each arm is within one block of its share, and a conversation's arm is not foretold by
its position. A share that no block of up to `MAX_BLOCK` represents exactly (0.33) gets, per block,
`⌊share · MAX_BLOCK + u⌋` places with `u` uniform, which is the share on average.

A conversation keeps its arm for all its requests: the split remembers the last `memory` units
(conversation ids, else first user turns), far more than are ever in flight. The memory is the
router process's: a conversation under way when the router restarts (its request in flight is lost
with it) may continue on the other arm, and the canary's outcomes then count it on both.
"""

from __future__ import annotations

import random
from collections import OrderedDict

MAX_BLOCK = 20
# A split's two arms (recorded on the router's span): the canary's share of the conversations, and
# the rest, its control. Words for where a conversation goes, not states of the served version.
CANARY_ARM, CONTROL_ARM = "canary", "control"
MEMORY = 65_536  # conversations remembered per canary: far more than are in flight at once


def _whole(places: float) -> bool:
    return abs(places - round(places)) < 1e-9


def block_size(share: float) -> int:
    """The smallest block that holds `share` exactly, else `MAX_BLOCK`."""
    return next((size for size in range(2, MAX_BLOCK + 1) if _whole(share * size)), MAX_BLOCK)


class Split:
    """The arms of one canary taking `share` of its capability's conversations. Not locked: its
    owner (the routing table, under its lock) serialises the calls."""

    def __init__(self, share: float, rng: random.Random | None = None, memory: int = MEMORY) -> None:
        if not 0 < share < 1:
            raise ValueError(f"a canary's share is strictly between 0 and 1, not {share}")
        self.share = share
        self.size = block_size(share)
        self._places = share * self.size  # the canary's places in a block, whole unless size is MAX_BLOCK
        self._rng = rng or random.Random()
        self._memory = memory
        self._arms: OrderedDict[str, str] = OrderedDict()
        self._block: list[str] = []
        self.assigned = {CANARY_ARM: 0, CONTROL_ARM: 0}

    def arm(self, unit: str | None) -> str:
        """"canary" or "control" for the conversation `unit` names (None: a request with no unit,
        given the next place of the block and not remembered)."""
        if unit is not None and unit in self._arms:
            self._arms.move_to_end(unit)
            return self._arms[unit]
        if not self._block:
            self._block = self._next_block()
        arm = self._block.pop()
        self.assigned[arm] += 1
        if unit is not None:
            self._arms[unit] = arm
            if len(self._arms) > self._memory:
                self._arms.popitem(last=False)
        return arm

    def _next_block(self) -> list[str]:
        places = self._places
        canary = round(places) if _whole(places) else int(places + self._rng.random())
        block = [CANARY_ARM] * canary + [CONTROL_ARM] * (self.size - canary)
        self._rng.shuffle(block)
        return block
