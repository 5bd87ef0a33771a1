"""A run's status changes in one place, by a table: every allowed change passes, every other one
raises, and Run has no other way to set its status."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from workbench.runtime.client import run as run_module
from workbench.runtime.client.run_state import TRANSITIONS, RunState, RunStateError

STATES = ("running", "finished", "cancelled", "failed")


def _at(status: str) -> RunState:
    """A RunState brought to ``status`` through allowed changes only."""
    state = RunState("r1")
    path = {"running": [], "finished": ["finished"], "cancelled": ["cancelled"], "failed": ["failed"]}[status]
    for step in path:
        state.move(step)
    assert state.status == status
    return state


def test_the_table_names_every_state_and_only_those():
    assert set(TRANSITIONS) == set(STATES)
    assert all(set(targets) <= set(STATES) for targets in TRANSITIONS.values())
    assert TRANSITIONS["failed"] == ()          # final
    assert "running" not in {t for targets in TRANSITIONS.values() for t in targets}   # nothing goes back


@pytest.mark.parametrize("old,new", [(o, n) for o in STATES for n in STATES if n in TRANSITIONS[o]])
def test_allowed_changes_pass_and_the_end_is_noted_once(old, new):
    state = _at(old)
    ended = state.ended
    state.move(new)
    assert state.status == new
    assert state.ended is not None and (ended is None or state.ended == ended)


@pytest.mark.parametrize("old,new", [(o, n) for o in STATES for n in STATES if n not in TRANSITIONS[o]])
def test_every_other_change_raises_on_one_line_naming_what_is_allowed(old, new):
    state = _at(old)
    with pytest.raises(RunStateError) as info:
        state.move(new)
    message = str(info.value)
    assert message.startswith(f"run r1: status cannot go from {old!r} to {new!r}; from {old!r} it may go to ")
    assert "\n" not in message and (", ".join(TRANSITIONS[old]) or "nothing (final)") in message
    assert state.status == old   # unchanged


def test_stopping_a_run_that_has_ended_with_if_running_is_no_error():
    state = _at("cancelled")
    assert state.move("failed", if_running=True) is False and state.status == "cancelled"
    assert _at("running").move("failed", if_running=True) is True


def test_of_threads_that_stop_a_run_at_once_exactly_one_does():
    state, wins, start = RunState("r1"), [], threading.Barrier(8)

    def stop(status):
        start.wait(timeout=30)
        if state.move(status, if_running=True):
            wins.append(status)
    threads = [threading.Thread(target=stop, args=("failed" if i % 2 else "cancelled",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(wins) == 1 and state.status == wins[0]


def test_run_sets_its_status_only_through_its_transition():
    from workbench.runtime.client import batch_run, handle, watch
    for kind in (run_module.Run, batch_run.BatchRun, watch.WatchedRun):
        assert isinstance(kind.status, property) and kind.status.fset is None
    moves = {}
    for module in (run_module, handle, batch_run, watch):
        tree = ast.parse(Path(module.__file__).read_text())
        assigned = [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    for t in ast.walk(target) if isinstance(t, ast.Attribute) and t.attr in ("status", "_status")
                    and not (isinstance(t.value, ast.Attribute) and t.value.attr == "result")]
        assert assigned == [], (module.__name__, assigned)
        moves[module.__name__] = len([node for node in ast.walk(tree) if isinstance(node, ast.Call)
                                      and isinstance(node.func, ast.Attribute) and node.func.attr == "move"])
    # self._state.move(...), in RunHandle._transition: the one place, for every kind of run
    assert moves == {run_module.__name__: 0, handle.__name__: 1, batch_run.__name__: 0, watch.__name__: 0}