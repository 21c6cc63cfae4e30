"""Times as the admin shows them: to the second, with the zone, everywhere.

Every time the admin shows is a time of the store's clock (the database server's, Redis's),
converted to Django's current time zone (``TIME_ZONE``, or one activated for the request)
and written ``2026-11-22 07:59:26 UTC``: events seconds apart must not look simultaneous,
and the zone must be on the page. In HTML the value is a ``<time>`` element whose tooltip
is the exact instant, microseconds and UTC offset included.
"""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .periods import utc

#: The format of a time on the admin's pages (strftime), followed by the zone's name.
FORMAT = "%Y-%m-%d %H:%M:%S"


def local(value: datetime) -> datetime:
    """``value`` in the current time zone: aware, or naive as the ORM reads the history
    database (UTC as the stores write it; with ``USE_TZ = False``, see
    :func:`~django_leader.models.from_orm`)."""
    if value.tzinfo is None and not settings.USE_TZ:
        from ..backends import get_backend
        from ..conf import get_settings
        from ..models import from_orm

        value = from_orm(value, get_backend().history_database or get_settings().database)
    return timezone.localtime(utc(value))


def zone_name(value: datetime | None = None) -> str:
    """The current time zone's name at ``value`` (``UTC``, ``CET``, ``+0530``...)."""
    moment = local(value if value is not None else datetime.now(dt_timezone.utc))
    return moment.tzname() or moment.strftime("%z")


def plain(value: datetime | None) -> str:
    """``2026-11-22 07:59:26 UTC``; ``""`` for None."""
    if value is None:
        return ""
    moment = local(value)
    return f"{moment.strftime(FORMAT)} {zone_name(moment)}"


def html(value: datetime | None, empty: str = "-") -> SafeString:
    """:func:`plain` in a ``<time>`` element whose tooltip is the exact instant; in a narrow
    column the time goes under the date, never elsewhere."""
    if value is None:
        return format_html("{}", empty)
    moment = local(value)
    date, time = plain(moment).split(" ", 1)
    return format_html(
        '<time class="leader-time" datetime="{}" title="{}"><span>{}</span> <span>{}</span></time>',
        moment.isoformat(),
        moment.isoformat(sep=" "),
        date,
        time,
    )
