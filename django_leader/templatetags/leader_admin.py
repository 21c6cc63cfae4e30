"""Filters for django_leader's admin templates: ``{% load leader_admin %}``."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.safestring import SafeString

from ..admin import times

register = template.Library()


@register.filter
def leader_time(value: datetime | None) -> SafeString:
    """A time to the second with its zone, the exact instant as its tooltip."""
    return times.html(value)
