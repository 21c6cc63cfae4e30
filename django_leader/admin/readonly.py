"""Admin pages that show and never change: no add, change or delete for anyone."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnly:
    """No add, change or delete in the admin, for anyone: superusers included."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
