"""The test project's settings for chaos candidates on ZooKeeper: the private server of the
run (``CHAOS_ZOOKEEPER_HOSTS``, ``CHAOS_ZOOKEEPER_ROOT``), always.

``testproject.settings`` puts ZooKeeper into ``DJANGO_LEADER`` only when the server answers
while the settings load; a candidate started while the nemesis has the server stopped would
otherwise fall back to the backend's default ensemble, 127.0.0.1:2181: the machine's shared
ZooKeeper, another store.
"""

from __future__ import annotations

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DJANGO_LEADER

DJANGO_LEADER["ZOOKEEPER"] = {
    "HOSTS": os.environ["CHAOS_ZOOKEEPER_HOSTS"],
    "ROOT": os.environ["CHAOS_ZOOKEEPER_ROOT"],
}
