"""Lease names compare exactly on MySQL/MariaDB, as on the other stores.

MySQL's default collations are case- and accent-insensitive, so "Report" and "report" would
be one lease there and two everywhere else. This gives the name and holder columns a binary
collation (NO PAD where the server has one). Other databases: nothing to do.
"""

from django.db import migrations

COLUMNS = {
    "django_leader_lease": ("name", "holder", "previous_holder"),
    "django_leader_leaseevent": ("name", "holder", "previous_holder"),
}


def binary_collation(schema_editor, table, column):
    cursor = schema_editor.connection.cursor()
    cursor.execute(
        "SELECT CHARACTER_SET_NAME, CHARACTER_MAXIMUM_LENGTH, IS_NULLABLE "
        "FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
        [table, column],
    )
    charset, length, nullable = cursor.fetchone()
    for collation in (f"{charset}_nopad_bin", f"{charset}_0900_bin", f"{charset}_bin"):
        cursor.execute("SHOW COLLATION LIKE %s", [collation])
        if cursor.fetchone():
            return charset, collation, length, nullable
    raise RuntimeError(f"no binary collation for character set {charset}")


def make_exact(schema_editor, table, columns):
    """Give ``columns`` of ``table`` a binary collation (MySQL/MariaDB; elsewhere nothing)."""
    if schema_editor.connection.vendor != "mysql":
        return
    quote = schema_editor.quote_name
    changes = []
    for column in columns:
        charset, collation, length, nullable = binary_collation(schema_editor, table, column)
        null = "NULL" if nullable == "YES" else "NOT NULL"
        changes.append(
            f"MODIFY {quote(column)} varchar({length}) "
            f"CHARACTER SET {charset} COLLATE {collation} {null}"
        )
    schema_editor.execute(f"ALTER TABLE {quote(table)} {', '.join(changes)}")


def forwards(apps, schema_editor):
    for table, columns in COLUMNS.items():
        make_exact(schema_editor, table, columns)


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll DDL back anyway
    dependencies = [("django_leader", "0003_beatslot")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
