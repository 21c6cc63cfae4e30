"""What the process tests of the scheduler integrations share (APScheduler, huey, RQ: issue
29): their marks, the failover bound, and the run every one of them makes: three instances
of an app, the leader SIGKILLed, the next one stopped with SIGTERM, each leader left to run
the schedule for a while."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

import pytest

from tests.support.cluster import RENEW, RETRY, STARTUP, TTL, Child, Cluster, Event, matches

MARKS = [
    pytest.mark.multiprocess,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs POSIX signals, /proc"),
]
#: How long each leader is left to run the schedule.
LEADS_FOR = 6.0


def continues_within(period: float) -> float:
    """After a failover, the schedule goes on within this: TTL + RETRY_INTERVAL + one
    period (plus the 1 s for a loaded machine of ``tests/support/cluster.py``'s
    TAKEOVER_BOUND)."""
    return TTL + RETRY + period + 1.0


def terminate(child: Child) -> None:
    """SIGTERM, as a deployment stops an instance: it exits 0 (having released its lease)."""
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=STARTUP) == 0, child.stderr_tail()


@dataclass
class Failovers:
    """The leaders of a run, in turn, and the instants their predecessors went."""

    first: Event  # the first leader's first event
    after_kill: Event  # the first event after the first leader was SIGKILLed
    after_stop: Event  # the first event after the second leader got SIGTERM
    killed_at: float
    stopped_at: float

    @property
    def order(self) -> list[str]:
        return [self.first["who"], self.after_kill["who"], self.after_stop["who"]]


def kill_then_stop(cluster: Cluster, children: dict[str, Child], kind: str) -> Failovers:
    """The run: the leader (the first to report ``kind``) SIGKILLed after LEADS_FOR, the
    next one stopped with SIGTERM LEADS_FOR later, the third left LEADS_FOR."""
    first = cluster.wait_for(matches(kind), f"a first {kind}", STARTUP)
    time.sleep(LEADS_FOR)
    killed = children[first["who"]]
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(timeout=STARTUP)
    killed_at, mark = time.time(), cluster.position()
    after_kill = cluster.wait_for(matches(kind), f"a {kind} after the kill", STARTUP, after=mark)
    assert after_kill["who"] != killed.label
    time.sleep(LEADS_FOR)
    terminate(children[after_kill["who"]])
    stopped_at, mark = time.time(), cluster.position()
    after_stop = cluster.wait_for(matches(kind), f"a {kind} after the stop", STARTUP, after=mark)
    (third,) = set(children) - {killed.label, after_kill["who"]}
    assert after_stop["who"] == third
    time.sleep(LEADS_FOR)
    return Failovers(first, after_kill, after_stop, killed_at, stopped_at)


def in_turn(events: list[Event], run: Failovers) -> bool:
    """Whether ``events``, in the order of their scheduled times, came from the leaders one
    after the other."""
    who = [event["who"] for event in events]
    return who == sorted(who, key=run.order.index)


def redis_url() -> str:
    """The Redis of the suite's ``redis`` cache (the schedulers' queues live there, under
    keys of the test's own)."""
    from django.conf import settings

    location = settings.CACHES["redis"]["LOCATION"]
    return location if isinstance(location, str) else location[0]


def start_instances(cluster: Cluster, module: str, *labels: str, **env: str) -> list[Child]:
    """Start ``python -m tests.procs.<module>`` as the instances ``labels``, with the
    cluster's timing in ``DL_MP_TTL``/``RENEW``/``RETRY`` (``tests.procs.common``'s
    ``elector_options()``) and in the settings (the store's call bounds), and wait until
    each is ready."""
    timing = {"TTL": str(TTL), "RENEW": str(RENEW), "RETRY": str(RETRY)}
    env = {
        **{f"DL_MP_{key}": value for key, value in timing.items()},
        **{f"DJANGO_LEADER_{key}": value for key, value in timing.items()},
        **env,
    }
    children = [cluster.spawn(label, module, **env) for label in labels]
    cluster.wait_ready(children)
    return children
