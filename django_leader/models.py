"""Database tables: the current state of each lease, and its history."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import connections, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .conf import MAX_IDENTITY_LENGTH, MAX_NAME_LENGTH
from .lease import EventKind


def _local_naive(database: str) -> bool:
    """Whether the ORM gives and takes naive times of ``database`` in ``TIME_ZONE``:
    PostgreSQL with ``USE_TZ = False`` (its columns hold instants, read and written in the
    connection's time zone). Elsewhere naive times are UTC, as the stores write them."""
    return not settings.USE_TZ and connections[database].vendor == "postgresql"


def to_orm(value: datetime, database: str) -> datetime:
    """An aware time as a value of a query on ``database`` (a filter, a field to write),
    whatever ``USE_TZ``: aware, or naive UTC where the ORM refuses aware times (MySQL and
    SQLite with ``USE_TZ = False``)."""
    if settings.USE_TZ or connections[database].vendor == "postgresql":
        return value
    return value.astimezone(dt_timezone.utc).replace(tzinfo=None)


def from_orm(value: datetime, database: str) -> datetime:
    """A time the ORM read from one of django-leader's tables in ``database``, aware, in
    UTC, whatever ``USE_TZ`` (see :func:`to_orm`)."""
    if value.tzinfo is None:
        zone = timezone.get_default_timezone() if _local_naive(database) else dt_timezone.utc
        value = value.replace(tzinfo=zone)
    return value.astimezone(dt_timezone.utc)


class Lease(models.Model):
    """The current state of one named lease (one row per name, updated in place).

    Written only by :class:`~django_leader.backends.db.DatabaseBackend` with conditional
    SQL; renewals update this row and never the history. ``holder`` is empty while the
    lease is free (released, or never taken). Whether a held lease is still valid is
    decided by comparing ``expires_at`` with the database server's clock.
    """

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, primary_key=True)
    holder = models.CharField(_("holder"), max_length=MAX_IDENTITY_LENGTH, blank=True, default="")
    previous_holder = models.CharField(
        _("previous holder"), max_length=MAX_IDENTITY_LENGTH, blank=True, default=""
    )
    token = models.BigIntegerField(_("fencing token"), default=0)
    transitions = models.BigIntegerField(_("transitions"), default=0)
    acquired_at = models.DateTimeField(_("acquired at"))
    renewed_at = models.DateTimeField(_("renewed at"))
    expires_at = models.DateTimeField(_("expires at"))
    #: ``leader handover``: the candidate the holder is to hand over to, and until when
    #: (server clock) nobody else may take the lease.
    handover_to = models.CharField(
        _("hand over to"), max_length=MAX_IDENTITY_LENGTH, blank=True, default=""
    )
    handover_until = models.DateTimeField(_("hand-over gate until"), null=True, blank=True)

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
        ordering = ["name"]
        permissions = [("release_lease", "Can force-release a lease")]

    def __str__(self) -> str:
        return self.name


class LeaseEvent(models.Model):
    """One change of a lease's holder: who, which token, when (server clock), why."""

    class Kind(models.TextChoices):
        ACQUIRED = EventKind.ACQUIRED.value, _("acquired")
        TAKEN_OVER = EventKind.TAKEN_OVER.value, _("taken over after expiry")
        RELEASED = EventKind.RELEASED.value, _("released")
        LOST = EventKind.LOST.value, _("lost")
        FORCED_RELEASE = EventKind.FORCED_RELEASE.value, _("force-released")
        HANDOVER = EventKind.HANDOVER.value, _("hand-over requested")

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH)
    kind = models.CharField(_("kind"), max_length=20, choices=Kind.choices)
    holder = models.CharField(_("holder"), max_length=MAX_IDENTITY_LENGTH, blank=True)
    token = models.BigIntegerField(_("fencing token"))
    previous_holder = models.CharField(
        _("previous holder"), max_length=MAX_IDENTITY_LENGTH, blank=True, default=""
    )
    at = models.DateTimeField(_("at"), db_index=True)
    detail = models.TextField(_("detail"), blank=True, default="")
    actor = models.CharField(_("actor"), max_length=255, blank=True, default="")

    class Meta:
        verbose_name = _("lease event")
        verbose_name_plural = _("lease events")
        ordering = ["-at", "-id"]
        indexes = [
            # The admin's history of one lease (WHERE name ORDER BY at DESC, id DESC LIMIT):
            # with the id in the index the rows come in order, no sort of every event.
            models.Index(fields=["name", "-at", "-id"], name="django_lead_name_at_id_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.kind} by {self.holder} (token {self.token})"


class LeaseCandidate(models.Model):
    """An Elector campaigning for a lease, as it last announced itself (its heartbeat).

    The registry the ``fifo`` and ``priority`` election modes read and ``manage.py leader
    status`` lists. Never part of a lease decision: followers upsert their row every few
    seconds, best effort, and a row whose ``expires_at`` passed (by the database server's
    clock) no longer counts. ``id`` is the join order: a candidate that joins again (after
    leading, or once its row expired) gets a new row at the tail.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH)
    identity = models.CharField(_("identity"), max_length=MAX_IDENTITY_LENGTH)
    priority = models.IntegerField(_("priority"), default=0)
    host = models.CharField(_("host"), max_length=255, blank=True, default="")
    pid = models.IntegerField(_("pid"), default=0)
    version = models.CharField(_("version"), max_length=50, blank=True, default="")
    joined_at = models.DateTimeField(_("joined at"), null=True)
    seen_at = models.DateTimeField(_("last seen at"))
    expires_at = models.DateTimeField(_("expires at"))

    class Meta:
        verbose_name = _("lease candidate")
        verbose_name_plural = _("lease candidates")
        ordering = ["name", "identity"]
        constraints = [
            models.UniqueConstraint(
                fields=["name", "identity"], name="django_leader_candidate_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.identity} for {self.name}"


class BeatSlot(models.Model):
    """The last schedule slot the elected ``celery beat`` sent for one schedule entry.

    Written by :class:`~django_leader.celery.LeaderScheduler` (database backend) inside
    ``lease.fenced()`` *before* it sends the slot, so only the current holder of the beat's
    lease can write it; a newly elected beat reads it to continue exactly where the previous
    one stopped. ``sent`` turns true once the message was handed to the broker: a row left
    at false means its sender stopped in between, and the slot may not have been sent.
    """

    lease = models.CharField(_("lease"), max_length=MAX_NAME_LENGTH)
    entry = models.CharField(_("schedule entry"), max_length=200)
    at = models.DateTimeField(_("slot"))
    token = models.BigIntegerField(_("fencing token"))
    holder = models.CharField(_("sent by"), max_length=MAX_IDENTITY_LENGTH)
    task_id = models.CharField(_("task id"), max_length=255, blank=True, default="")
    sent = models.BooleanField(_("sent"), default=False)

    class Meta:
        verbose_name = _("beat slot")
        verbose_name_plural = _("beat slots")
        ordering = ["lease", "entry"]
        constraints = [
            models.UniqueConstraint(fields=["lease", "entry"], name="django_leader_beatslot_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.lease}/{self.entry}: {self.at.isoformat()} (token {self.token})"


class LeaseFence(models.Model):
    """The greatest fencing token of a lease that wrote through ``lease.fenced()`` in this
    database, for a lease held in another store (Redis, ZooKeeper, ...).

    Locked by each fenced transaction (see ``django_leader/backends/fence_row.py``): a
    token lower than the one stored here is refused, a greater one replaces it. The
    database backend fences with the ``Lease`` row itself and writes none, unless its
    ``fenced(using=...)`` names another database.
    """

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, primary_key=True)
    token = models.BigIntegerField(_("fencing token"), default=0)
    holder = models.CharField(_("last written by"), max_length=MAX_IDENTITY_LENGTH, blank=True)
    written_at = models.DateTimeField(_("last written at"))

    class Meta:
        verbose_name = _("lease fence")
        verbose_name_plural = _("lease fences")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: token {self.token}"


class LeaseStore(models.Model):
    """Which database server last issued leases from this table, and what its failover
    left behind (one row; PostgreSQL only, see "Replicated and pooled stores" in
    docs/production.md).

    ``server`` is the server's identity (system identifier and WAL timeline: a promoted
    standby or a point-in-time restore has a new timeline). An acquisition on a server
    that is not the one named here sets ``fence``: no lease may be taken before it (the
    lock-delay, so that every holder of the old server has stepped down), and ``floor``:
    every token issued from then on is at least this (the server clock in microseconds),
    greater than any the old server may have issued and the new one missed.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    server = models.CharField(_("server"), max_length=200)
    fence = models.DateTimeField(_("no lease taken before"))
    floor = models.BigIntegerField(_("least token issued"), default=0)
    changed_at = models.DateTimeField(_("changed at"))

    class Meta:
        verbose_name = _("lease store")
        verbose_name_plural = _("lease stores")

    def __str__(self) -> str:
        return f"{self.server} (fence {self.fence.isoformat()}, floor {self.floor})"


class LeaseDashboard(Lease):
    """The admin's dashboard of leases, as an entry of the admin's index and sidebar (a
    proxy of :class:`Lease`: no table; its admin page redirects to the dashboard)."""

    class Meta:
        proxy = True
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")
