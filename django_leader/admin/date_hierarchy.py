"""The history's date drill-down (year, month, day), found by index seeks.

Django's ``{% date_hierarchy %}`` lists the dates that have rows with ``SELECT DISTINCT``
over every matching row; :class:`HistoryChangeList` gives it the same choices, each found
with one ``MIN(at)`` seek on an index.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.admin.views.main import ChangeList
from django.db.models import Max, Min, QuerySet
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from ..models import from_orm, to_orm


class HistoryChangeList(ChangeList):
    """The history's change list, with a date hierarchy that reads no row it does not show."""

    def get_filters(self, request: Any) -> Any:
        specs, has_filters, lookup_params, duplicates, active = super().get_filters(request)
        if not settings.USE_TZ and self.date_hierarchy:
            # Django bounds a year, month or day in naive local time; MySQL and SQLite
            # columns hold naive UTC (to_orm gives the bound as the column holds it).
            database = self.root_queryset.db
            for key in (f"{self.date_hierarchy}__gte", f"{self.date_hierarchy}__lt"):
                if key in lookup_params:
                    lookup_params[key] = _as_stored(lookup_params[key], database)
        return specs, has_filters, lookup_params, duplicates, active

    @cached_property
    def hierarchy(self) -> dict[str, Any]:
        """What Django's ``{% date_hierarchy %}`` shows, with the dates found by index seeks.

        Django lists the years, months or days that have rows with ``SELECT DISTINCT``
        over every matching row; here each date costs one ``MIN(at)`` seek on an index.
        ``field_name``: the field's verbose name, which Django 6.1's template labels the
        drill-down with ("Filter by ...").
        """
        field = self.model._meta.get_field(self.date_hierarchy)
        return {**self._hierarchy(), "field_name": field.verbose_name}

    def _hierarchy(self) -> dict[str, Any]:
        field = self.date_hierarchy
        keys = f"{field}__year", f"{field}__month", f"{field}__day"
        year, month, day = (self.params.get(key) for key in keys)

        def link(filters: dict[str, Any]) -> str:
            return str(self.get_query_string(filters, [f"{field}__"]))

        rows = self.queryset.order_by()
        if not (year or month or day):
            bounds = rows.aggregate(first=Min(field), last=Max(field))
            first, last = bounds["first"], bounds["last"]
            if first is not None and last is not None:
                database = rows.db
                first = timezone.localtime(from_orm(first, database))
                last = timezone.localtime(from_orm(last, database))
                if first.year == last.year:
                    year = first.year
                    if first.month == last.month:
                        month = first.month
        if year and month and day:
            date = datetime(int(year), int(month), int(day))
            return {
                "show": True,
                "back": {
                    "link": link({keys[0]: year, keys[1]: month}),
                    "title": capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT")),
                },
                "choices": [{"title": capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))}],
            }
        if year and month:
            return {
                "show": True,
                "back": {"link": link({keys[0]: year}), "title": str(year)},
                "choices": [
                    {
                        "link": link({keys[0]: year, keys[1]: month, keys[2]: d.day}),
                        "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT")),
                    }
                    for d in _buckets(rows, field, "day")
                ],
            }
        if year:
            return {
                "show": True,
                "back": {"link": link({}), "title": _("All dates")},
                "choices": [
                    {
                        "link": link({keys[0]: year, keys[1]: m.month}),
                        "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT")),
                    }
                    for m in _buckets(rows, field, "month")
                ],
            }
        return {
            "show": True,
            "back": None,
            "choices": [
                {"link": link({keys[0]: str(y.year)}), "title": str(y.year)}
                for y in _buckets(rows, field, "year")
            ],
        }


def _as_stored(bound: Any, database: str) -> Any:
    """A bound of Django's drill-down (a naive local time, or a list of one, as Django
    4.2 and 5+ give it) as a value of ``database``'s column."""
    if isinstance(bound, list):
        return [_as_stored(value, database) for value in bound]
    if isinstance(bound, datetime) and timezone.is_naive(bound):
        return to_orm(timezone.make_aware(bound), database)
    return bound


def _buckets(rows: QuerySet[Any], field: str, kind: str, limit: int = 400) -> list[datetime]:
    """The starts (local time) of the years, months or days that have rows, ascending."""
    found: list[datetime] = []
    lower: datetime | None = None
    while len(found) < limit:
        candidates = rows if lower is None else rows.filter(**{f"{field}__gte": lower})
        first = candidates.aggregate(first=Min(field))["first"]
        if first is None:
            break
        local = timezone.localtime(from_orm(first, rows.db))
        if kind == "year":
            begin = local.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
            following = begin.replace(year=begin.year + 1)
        elif kind == "month":
            begin = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            following = (
                begin.replace(year=begin.year + 1, month=1)
                if begin.month == 12
                else begin.replace(month=begin.month + 1)
            )
        else:
            begin = local.replace(hour=0, minute=0, second=0, microsecond=0)
            following = begin + timedelta(days=1)
        found.append(begin)
        # Local midnight of the next bucket, as an aware time (DST-safe).
        lower = to_orm(timezone.make_aware(following.replace(tzinfo=None)), rows.db)
    return found
