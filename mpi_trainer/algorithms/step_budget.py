"""``train.max_steps``: optimizer steps, summed over workers, after which the run stops.

A worker runs ``ceil(block / batch_size)`` steps per round. When fewer steps
remain than a full round takes, :func:`step_budgets` shares the remainder out
so the run stops on exactly ``max_steps``.
"""

from __future__ import annotations

from collections.abc import Mapping


def step_budgets(remaining: int, full: Mapping[int, int]) -> dict[int, int] | None:
    """Per-rank step limits for the next round, or None when a full round fits in ``remaining``.

    The remainder is dealt out one step at a time in rank order, never giving a
    worker more than its full round, so budgets differ by at most one.
    """
    if remaining >= sum(full.values()):
        return None
    budgets = {rank: 0 for rank in full}
    left = max(0, remaining)
    while left:
        for rank in sorted(full):
            if left and budgets[rank] < full[rank]:
                budgets[rank] += 1
                left -= 1
    return budgets
