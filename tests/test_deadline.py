"""workbench.deadline: the one deadline-poll helper every wait loop uses."""
import time

import pytest

from workbench.deadline import Deadline, poll


def test_poll_returns_once_done_and_raises_the_callers_error_on_expiry():
    calls = []
    poll(lambda: calls.append(1) or len(calls) >= 3, 5.0, lambda: AssertionError("never"))
    assert len(calls) == 3
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="rank 2: late"):
        poll(lambda: False, 0.05, lambda: TimeoutError("rank 2: late"), spin=0.01, nap=0.001)
    assert 0.05 <= time.monotonic() - start < 2.0


def test_a_shared_deadline_gives_each_wait_what_is_left():
    d = Deadline(0.2)
    first = d.left()
    time.sleep(0.05)
    assert 0 <= d.left() < first <= 0.2 and not d.expired()
    time.sleep(0.2)
    assert d.expired() and d.left() == 0.0
    assert Deadline(None).left() is None and not Deadline(None).expired()
