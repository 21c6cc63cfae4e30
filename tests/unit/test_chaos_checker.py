"""The chaos checker (tests/chaos/checker.py), fed histories written by hand: each kind of
violation must be flagged, and a clean history must pass."""

from __future__ import annotations

from typing import Any

from tests.chaos import checker

PARAMS = checker.Params(ttl=2.0, retry_interval=0.5, lock_delay=2.0)


def acts(who: str, token: int, start: float, end: float, every: float = 0.05) -> list[dict]:
    """``who`` acting with ``token`` from ``start`` to ``end``."""
    count = round((end - start) / every)
    return [
        {"ev": "act", "t": start + i * every, "t1": start + i * every + 0.001, "who": who,
         "token": token}
        for i in range(count + 1)
    ]  # fmt: skip


def term(who: str, token: int, start: float, end: float) -> list[dict]:
    elected = {"ev": "elected", "t": start, "who": who, "token": token}
    return [elected, *acts(who, token, start, end)]


def fault(kind: str, t: float, ready: float | None = None, lossy: bool = False) -> dict:
    return {"ev": "fault", "kind": kind, "t": t, "ready": t if ready is None else ready,
            "lossy": lossy}  # fmt: skip


def row(id: int, token: int, t: float, who: str = "w") -> dict:
    return {"ev": "row", "id": id, "token": token, "t": t, "who": who}


def clean() -> list[dict[str, Any]]:
    """A: token 1 until 10 s, killed; B: token 2 from 12.4 s; flushed at 20 s, B steps down
    at its deadline, C is elected after the lock-delay with token 3; A's respawn: token 4
    after C's SIGTERM. Fenced writes in token order; one task sent and done."""
    return [
        *term("A", 1, 0.0, 10.0),
        fault("kill", 10.01),
        *term("B", 2, 12.4, 21.5),
        fault("flush", 20.0, lossy=True),
        *term("C", 3, 24.6, 30.0),
        fault("term", 30.02),
        *term("A2", 4, 30.1, 40.0),
        row(1, 1, 1.0), row(2, 1, 9.9), row(3, 2, 12.5), row(4, 3, 25.0), row(5, 4, 30.2),
        {"ev": "task_sent", "t": 1.0, "task": "t1"},
        {"ev": "task_started", "t": 1.1, "task": "t1", "key": "k", "pid": 1},
        {"ev": "task_done", "t": 1.5, "task": "t1", "key": "k", "pid": 1, "ok": True},
    ]  # fmt: skip


def checks(records: list[dict[str, Any]]) -> dict[str, int]:
    return {name: n for name, n in checker.check(records, PARAMS).by_check().items() if n}


def test_a_clean_history_passes() -> None:
    result = checker.check(clean(), PARAMS)
    assert result.violations == []
    assert [r.kind for r in result.recoveries] == ["kill", "flush", "term"]
    seconds = [r.seconds for r in result.recoveries]
    assert seconds[0] is not None and abs(seconds[0] - 2.39) < 0.01
    assert seconds[1] is not None and abs(seconds[1] - 4.6) < 0.01  # within 2+0.5+2+1
    assert seconds[2] == 0.0  # the hand-over left no gap


def test_overlap_is_flagged() -> None:
    # B acts with token 2 while A, token 1, still acts: two holders at once.
    records = [*term("A", 1, 0.0, 10.0), fault("stop", 5.0), *term("B", 2, 7.0, 12.0)]
    found = checker.check(records, PARAMS)
    assert checks(records) == {"overlap": len(acts("A", 1, 7.05, 10.0))}
    assert found.violations[0].fault == "stop"
    assert "A acted with token 1 after B had acted with token 2" in found.violations[0].message


def test_an_overlap_is_charged_to_the_fault_that_began_it() -> None:
    # A payload outlives its killed guard and acts on through later faults.
    records = [*term("A", 1, 0.0, 20.0), fault("guard-kill", 3.0), *term("B", 2, 4.0, 6.0),
               fault("kill", 6.1), *term("C", 3, 9.0, 20.0), fault("term", 12.0)]  # fmt: skip
    found = checker.check(records, PARAMS).violations
    assert {v.fault for v in found} == {"guard-kill"}
    assert len(found) == len(acts("A", 1, 4.05, 20.0))


def test_acts_that_only_touch_are_no_overlap() -> None:
    # The old holder's last check ends as the new one's begins: not after it.
    records = [{"ev": "act", "t": 1.0, "t1": 2.0, "who": "A", "token": 1},
               {"ev": "act", "t": 1.5, "t1": 1.6, "who": "B", "token": 2}]  # fmt: skip
    assert checks(records) == {}


def test_a_repeated_token_is_flagged() -> None:
    records = [*term("A", 5, 0.0, 3.0), *term("B", 6, 6.0, 8.0), *term("C", 6, 11.0, 13.0)]
    assert checks(records) == {"token-repeat": 1}


def test_a_token_going_back_is_flagged() -> None:
    # Redis restored from an older snapshot hands out a lower token: also an overlap,
    # since token 4 acts after token 5 did.
    records = [*term("A", 5, 0.0, 3.0), fault("redis-restore-old", 3.5, 4.0, lossy=True),
               *term("B", 4, 7.0, 8.0)]  # fmt: skip
    result = checks(records)
    assert result["token-back"] == 1
    assert result["overlap"] > 0


def test_a_stale_fenced_write_is_flagged() -> None:
    # Write 3, token 1, commits after write 2, token 2: out of token order, and made after
    # token 2 had acted.
    records = [*term("A", 1, 0.0, 5.0), *term("B", 2, 8.0, 12.0),
               row(1, 1, 4.0), row(2, 2, 8.5), row(3, 1, 9.0, who="A")]  # fmt: skip
    assert checks(records) == {"fence-order": 1, "stale-write": 1}


def test_a_fenced_write_after_a_greater_token_acted_is_flagged_even_in_order() -> None:
    # Token 1 writes after token 2 acted but before token 2 wrote anything.
    records = [*term("A", 1, 0.0, 5.0), *term("B", 2, 8.0, 12.0), row(1, 1, 9.0)]
    assert checks(records) == {"stale-write": 1}


def writes(who: str, token: int, start: float, end: float, ev: str = "write") -> list[dict]:
    return [{**a, "ev": ev} for a in acts(who, token, start, end, every=0.1)]


def test_a_fenced_write_told_the_wrong_row_is_flagged() -> None:
    # Defect 0 of issue 24: a slow statement inside fenced() and create() got another
    # value for its primary key; the rows the store holds are right.
    def write(id: Any, t: float) -> dict[str, Any]:
        return {"ev": "write", "t": t, "who": "A", "token": 1, "id": id}

    rows = [row(1, 1, 1.0, who="A"), row(2, 1, 2.0, who="A")]
    history = [*term("A", 1, 0.0, 3.0), *rows]
    assert checks([*history, write(1, 1.0), write(2, 2.0)]) == {}
    assert checks([*history, write(1, 1.0), write("2037ms", 2.0)]) == {"fenced-result": 1}
    assert checks([*history, write(2, 1.0), write(1, 2.0)]) == {"fenced-result": 2}


def test_a_leader_whose_fenced_writes_keep_failing_is_flagged() -> None:
    # The store restarted at 3 s and answers at 4 s; the leader's writes fail until 9 s.
    history = [*term("A", 1, 0.0, 10.0), fault("mariadb-restart", 3.0, ready=4.0),
               *writes("A", 1, 0.0, 2.9), *writes("A", 1, 3.0, 9.0, ev="write_error"),
               *writes("A", 1, 9.1, 10.0)]  # fmt: skip
    found = checker.check(history, PARAMS).violations
    assert [(v.check, v.fault) for v in found] == [("fenced-stuck", "mariadb-restart")]
    # Failing only while the store is down, and for a moment after, is no violation.
    history = [
        *term("A", 1, 0.0, 10.0),
        fault("mariadb-restart", 3.0, ready=8.0),
        *writes("A", 1, 3.0, 9.0, ev="write_error"),
        *writes("A", 1, 9.1, 10.0),
    ]
    assert checks(history) == {}


def test_a_lost_singleton_task_is_flagged() -> None:
    records = [
        {"ev": "task_sent", "t": 1.0, "task": "t1"},
        {"ev": "task_started", "t": 1.1, "task": "t1", "key": "k", "pid": 1, "end": 2.0},
        {"ev": "task_sent", "t": 3.0, "task": "t2"},
        {"ev": "task_started", "t": 3.1, "task": "t2", "key": "k", "pid": 2},
        {"ev": "task_done", "t": 3.5, "task": "t2", "key": "k", "pid": 2, "ok": True},
    ]
    found = checker.check(records, PARAMS).violations
    assert [(v.check, v.message) for v in found] == [("task-lost", "task t1 never completed")]


def test_two_executions_of_one_key_at_once_are_flagged() -> None:
    records = [
        {"ev": "task_sent", "t": 1.0, "task": "t1"},
        {"ev": "task_started", "t": 1.1, "task": "t1", "key": "k", "pid": 1},
        {"ev": "task_started", "t": 1.3, "task": "t1", "key": "k", "pid": 2},
        {"ev": "task_done", "t": 1.5, "task": "t1", "key": "k", "pid": 1, "ok": True},
        {"ev": "task_done", "t": 1.6, "task": "t1", "key": "k", "pid": 2, "ok": True},
    ]
    assert checks(records) == {"task-overlap": 1}


def test_a_slow_recovery_is_flagged() -> None:
    # A holder frozen inside fenced(): nobody is elected for 6 s (bound 2 + 0.5 + 1).
    records = [*term("A", 1, 0.0, 5.0), fault("fenced-freeze", 5.02), *term("B", 2, 11.0, 15.0)]
    found = checker.check(records, PARAMS).violations
    assert [(v.check, v.fault) for v in found] == [("liveness", "fenced-freeze")]
    assert "after fenced-freeze no leader acted for 5.98 s" in found[0].message


def test_acts_out_of_token_order_do_not_count_as_a_leader() -> None:
    # A's payload outlives its guard and acts on; B, elected at once, is frozen at 6 s and
    # nobody else leads until 12 s: A's stale acts must not hide the time without a leader.
    records = [*term("A", 1, 0.0, 15.0), fault("guard-kill", 3.0), *term("B", 2, 3.2, 6.0),
               fault("fenced-freeze", 6.02), *term("C", 3, 12.0, 15.0)]  # fmt: skip
    found = checks(records)
    assert found["liveness"] == 1 and found["overlap"] > 0


def test_the_lock_delay_counts_only_after_a_lossy_fault() -> None:
    gap = [*term("A", 1, 0.0, 5.0), *term("B", 2, 9.5, 12.0)]  # 4.5 s without a leader
    assert checks([*gap, fault("flush", 5.02, lossy=True)]) == {}
    assert checks([*gap, fault("conn-kill", 5.02)]) == {"liveness": 1}


def test_recovery_counts_from_when_the_store_answers() -> None:
    # Down for 10 s; a leader 2.9 s after the restart is in time.
    records = [*term("A", 1, 0.0, 4.0), fault("pg-restart", 3.0, ready=13.0),
               *term("B", 2, 15.9, 18.0)]  # fmt: skip
    (recovery,) = checker.check(records, PARAMS).recoveries
    assert recovery.ok and recovery.seconds is not None and abs(recovery.seconds - 2.9) < 0.01


def test_a_faults_slack_widens_its_liveness_bound() -> None:
    # The leader's replies lost from 5 s: the store renewed what it took for failures, and
    # keeps its lease up to a TTL longer (slack 2): a leader 5.2 s later is in time, 6 s not.
    def replies_lost(t: float) -> dict[str, Any]:
        return {**fault("part-leader-replies", t), "slack": 2.0, "healed": t + 3.0}

    assert checks([*term("A", 1, 0.0, 5.0), replies_lost(5.02), *term("B", 2, 10.2, 12.0)]) == {}
    late = checks([*term("A", 1, 0.0, 5.0), replies_lost(5.02), *term("B", 2, 11.6, 13.0)])
    assert late == {"liveness": 1}


def test_a_leader_that_blocks_its_own_loop_and_acts_on_led_all_along() -> None:
    # Found by the partition run on PostgreSQL: a follower cut off at 5 s; the asyncio
    # leader blocks its loop 0.55 s at 7.97 s and acts on with its token (not a time
    # without a leader, 3.52 s from the fault).
    blocked = {"ev": "loop_blocked", "t": 7.97, "who": "A", "token": 1, "seconds": 0.5}
    records = [*term("A", 1, 0.0, 7.97), blocked, *acts("A", 1, 8.52, 12.0),
               fault("part-follower", 5.0)]  # fmt: skip
    assert checks(records) == {}
    # Stepping down after the block is a time without a leader as before.
    lost = [*term("A", 1, 0.0, 7.97), blocked, fault("part-follower", 5.0),
            *term("B", 2, 9.0, 12.0)]  # fmt: skip
    assert checks(lost) == {"liveness": 1}


def test_a_pause_between_two_acts_of_one_term_is_no_time_without_a_leader() -> None:
    # Found by the PgBouncer run on a loaded machine: the pooler back at 1 s, the leader
    # acts on, pauses 0.52 s at 3.4 s (its loop did not run) and acts on with its token:
    # it led all along, the store's recovery took 0 s, not 2.9 s.
    records = [*term("A", 1, 0.0, 3.4), fault("pgbouncer-crash", 0.5, ready=1.0),
               *acts("A", 1, 3.92, 8.0)]  # fmt: skip
    assert checks(records) == {}
    (recovery,) = checker.check(records, PARAMS).recoveries
    assert recovery.seconds == 0.0
    # A pause that ends with another holder is a time without a leader, as before.
    records = [*term("A", 1, 0.0, 3.4), fault("pgbouncer-crash", 0.5, ready=1.0),
               *term("B", 2, 6.0, 8.0)]  # fmt: skip
    assert checks(records) == {"liveness": 1}


def test_no_leader_until_the_end_of_the_run_is_flagged() -> None:
    records = [*term("A", 1, 0.0, 5.0), fault("kill", 5.02), {"ev": "run", "t": 20.0}]
    assert checks(records) == {"liveness": 1}


def test_a_gap_caused_by_the_next_fault_is_not_charged_to_the_previous_one() -> None:
    records = [*term("A", 1, 0.0, 6.0), fault("conn-kill", 3.0), fault("kill", 6.02),
               *term("B", 2, 8.5, 10.0)]  # fmt: skip
    recoveries = checker.check(records, PARAMS).recoveries
    assert (recoveries[0].kind, recoveries[0].seconds) == ("conn-kill", 0.0)
    assert recoveries[1].seconds is not None and recoveries[1].ok


def test_a_recovery_cut_short_by_the_next_fault_is_not_measured() -> None:
    # Killed at 5 s; a restart at 7 s (within the bound) delays the next leader to 12 s.
    records = [*term("A", 1, 0.0, 5.0), fault("kill", 5.02), fault("pg-restart", 7.0, 10.0),
               *term("B", 2, 12.0, 15.0)]  # fmt: skip
    kill, restart = checker.check(records, PARAMS).recoveries
    assert kill.seconds is None and kill.ok
    assert restart.ok and restart.seconds is not None and abs(restart.seconds - 2.0) < 0.01
    # The same restart after the bound ran out does not excuse the late leader.
    records = [*term("A", 1, 0.0, 5.0), fault("kill", 5.02), fault("pg-restart", 9.0, 10.0),
               *term("B", 2, 12.0, 15.0)]  # fmt: skip
    assert checks(records) == {"liveness": 1}


def test_summary() -> None:
    assert checker.summary([]) == {"min": None, "median": None, "p99": None}
    values = [float(i) for i in range(1, 101)]
    assert checker.summary(values) == {"min": 1.0, "median": 50.5, "p99": 99.0}


def test_a_stalled_work_acting_after_the_next_term_is_flagged() -> None:
    """The ``stall`` fault (issue 24): A's work stalls past its watchdog at 10 s and acts
    once, unchecked, when it returns at 15 s. Had A's lease been released when the watchdog
    fired (B elected at 13.6 s), that act comes after B's: an overlap, charged to the stall.
    Held until the work returns (B elected after 15 s), the history is clean."""
    stall = {**fault("stall", 10.0, ready=15.0), "target": "A", "token": 1}
    late = {"ev": "act", "t": 15.0, "t1": 15.0, "who": "A", "token": 1, "stalled": True}
    released_early = [*term("A", 1, 0.0, 10.0), stall, late, *term("B", 2, 13.6, 20.0)]
    assert checks(released_early) == {"overlap": 1}
    result = checker.check(released_early, PARAMS)
    assert {v.fault for v in result.violations} == {"stall"}
    held = [*term("A", 1, 0.0, 10.0), stall, late, *term("B", 2, 15.6, 20.0)]
    assert checks(held) == {}


def test_clock_faults_are_selected_by_name_or_as_clock() -> None:
    """``--faults clock`` selects every wall-clock fault; runs without libfaketime
    (``clocks=False``) have none, and ``stalls=False`` drops the stall fault."""
    from pathlib import Path

    from tests.chaos import harness

    def kinds(**config: Any) -> set[str]:
        h = harness.Harness.__new__(harness.Harness)
        h.config = harness.Config(store="redis", **config)
        h.network = None
        h.store = type("S", (), {"faults": ["flush"]})()
        return {k.name for k in h.kinds()}

    clocks = {"clock-ahead", "clock-behind", "clock-slew"}
    assert kinds(clocks=True, kinds=("clock",)) == clocks
    assert kinds(clocks=True, kinds=("clock-ahead", "stall")) == {"clock-ahead", "stall"}
    assert not kinds(clocks=False) & clocks
    assert "stall" in kinds(clocks=False) and "stall" not in kinds(stalls=False)
    assert Path(harness.LIBFAKETIME).name == "libfaketimeMT.so.1"
