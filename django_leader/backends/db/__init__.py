"""The database store: leases in a Django database (SQLite, PostgreSQL, MySQL/MariaDB).

Chosen with ``DJANGO_LEADER["BACKEND"] = "django_leader.backends.db.DatabaseBackend"``.
One module a concern: ``backend`` (the store), ``leases``, ``batch``, ``registry``,
``listen`` (wake-ups), ``fence`` and ``socket_bound`` (fencing), ``slots``, ``tables`` and
``connection`` (what they share), ``migrations`` (the checks' probe), ``recycling``
(Django's own connections in the beat), and the SQL of each vendor behind ``dialect``
(``postgresql``, ``mysql``, ``sqlite``, chosen once by ``dialects``).
"""

from .backend import DatabaseBackend
from .fence import FENCE_FLOOR
from .migrations import migration_state, require_tables
from .recycling import close_unusable_connections

__all__ = [
    "FENCE_FLOOR",
    "DatabaseBackend",
    "close_unusable_connections",
    "migration_state",
    "require_tables",
]
