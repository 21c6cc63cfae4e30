"""The migration probe of the system checks (W002, W016, E003): what of an app is not
migrated in a database, looked at as the store would (its timeouts, its own connection)."""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.migrations.loader import MigrationLoader

from ...conf import get_settings
from .connection import PrivateConnection
from .dialects import dialect_for


def migration_state(alias: str, app_label: str = "django_leader") -> tuple[list[str], list[str]]:
    """The tables of app ``app_label`` missing in database ``alias``, and its migrations
    not applied there (as ``migrate`` would see them: squashes, ``MIGRATION_MODULES``).

    Looks over a private connection with the store's timeouts, closed at once, and never
    creates a SQLite file (a missing file: every table is missing). Raises whatever the
    database raises when it cannot be reached."""
    tables_of = sorted({m._meta.db_table for m in apps.get_app_config(app_label).get_models()})
    dialect = dialect_for(alias)
    if dialect.missing_file(str(connections[alias].settings_dict.get("NAME") or "")):
        return tables_of, []  # no database file yet: connecting would create it
    probe = PrivateConnection(alias, dialect, get_settings().timing.call_timeout)
    try:
        wrapper = probe.get()
        with wrapper.cursor() as cursor:
            tables = set(wrapper.introspection.table_names(cursor))
        loader = MigrationLoader(wrapper, ignore_no_migrations=True)
        plan = [
            key
            for leaf in loader.graph.leaf_nodes(app_label)
            for key in loader.graph.forwards_plan(leaf)
        ]
        unapplied = [
            migration
            for app, migration in dict.fromkeys(plan)
            if app == app_label and (app, migration) not in loader.applied_migrations
        ]
    finally:
        probe.close()
    return [table for table in tables_of if table not in tables], unapplied


def migrate_hint(alias: str) -> str:
    """The fix of a database without django-leader's tables (W002 and require_tables)."""
    return f"Run `manage.py migrate django_leader --database {alias}`."


def require_tables() -> None:
    """Raise ImproperlyConfigured, with W002's words and fix, if django-leader's tables are
    missing in the lease database: a process that campaigns (``runleader``, the beat) would
    only fail at every try, logged every RETRY_INTERVAL for ever. Quiet when the database
    cannot be looked at (campaigning then says what is wrong, and goes on once it answers)
    or only a migration is not applied (the tables work)."""
    alias = get_settings().database
    if alias not in connections.settings:
        return
    try:
        missing, _ = migration_state(alias)
    except Exception:  # unreachable: not this function's to report
        return
    if missing:
        raise ImproperlyConfigured(
            f"django_leader table(s) {', '.join(missing)} missing in database {alias!r}: "
            + migrate_hint(alias)
        )
