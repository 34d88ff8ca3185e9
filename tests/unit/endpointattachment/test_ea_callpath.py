"""The path of one Pod update to its pass's first write stays short (``tests.callpath``): a count of
calls, deterministic, not a timing."""

from __future__ import annotations

from tests.callpath import measure

# Issue 28's bound: a Pod update reaches its write in at most this many calls in the project's code.
MAX_PROJECT_CALLS = 300


async def test_a_pod_update_reaches_its_write_within_the_bound() -> None:
    profile, writes = await measure()
    assert writes[0] == ("delete", "services", "vm1-public-x7ktq")  # the write the count ends at
    ours = sum(profile.project_calls().values())
    assert 0 < ours <= MAX_PROJECT_CALLS
