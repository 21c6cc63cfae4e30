"""A table the demo and the tests write to through ``lease.fenced()``."""

from django.db import models


class FencedWrite(models.Model):
    """One write made under a lease: who made it with which fencing token."""

    writer = models.CharField(max_length=255)
    token = models.BigIntegerField()
    note = models.CharField(max_length=255, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.writer} token={self.token} {self.note}"
