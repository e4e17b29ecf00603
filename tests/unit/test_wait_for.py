"""mq.cluster.wait_for, the tests' polling helper: what ends a wait, and what does not."""
from __future__ import annotations

import pytest

from mq.cluster import wait_for
from mq.remoting import RemotingTimeout


def test_a_poll_that_times_out_is_not_yet_and_the_condition_still_wins():
    """A machine that stops for seconds makes one poll's request time out; the condition then
    holds at the next poll, within the deadline, and that is the answer."""
    polls = iter([RemotingTimeout("slow"), TimeoutError("slow"), 0, 7])

    def cond():
        v = next(polls)
        if isinstance(v, Exception):
            raise v
        return v

    assert wait_for(cond, 5, 0.001, "the value") == 7


def test_the_deadline_names_the_last_timeout_as_its_cause():
    def cond():
        raise RemotingTimeout("no response to code 208")

    with pytest.raises(TimeoutError, match="waiting for the backlog") as e:
        wait_for(cond, 0.05, 0.01, "the backlog")
    assert isinstance(e.value.__cause__, RemotingTimeout)


def test_any_other_error_ends_the_wait_at_once():
    calls = []

    def cond():
        calls.append(1)
        raise ValueError("a wrong answer is not a slow one")

    with pytest.raises(ValueError):
        wait_for(cond, 5, 0.001)
    assert len(calls) == 1
