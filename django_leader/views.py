"""Health checks for probes and load balancers; they read, and never write to, the store.

Include them with ``path("leader/", include("django_leader.urls"))``:

* ``leader/health/<name>/`` — 200 if somebody holds ``name`` now (read from the store),
  503 if nobody does or the store cannot be reached;
* ``leader/health/<name>/here/`` — 200 if an :class:`~django_leader.Elector` of *this
  process* leads ``name`` (by its local deadline), else 503: a readiness probe that routes
  traffic only to the leader;
* ``leader/live/`` — 200 unless the work of an Elector of this process was left running
  past a grace period after its term ended (lost, or stopped by the watchdog), then 503:
  a liveness probe, so that a process whose work is stuck gets restarted;
* ``leader/metrics/`` — Prometheus metrics (needs ``django-leader[prometheus]``).

They answer anyone (probes do not log in). A caller without the permission to view leases
(``django_leader.view_lease``) sees whether there is a leader, and of the lease only the
fields ``DJANGO_LEADER["HEALTH_DETAILS"]`` names (default none: not who holds it, nor its
token); a store error is reported to it as ``"store unavailable"``, the error itself
logged (warning, logger ``django_leader``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .backends import get_backend
from .conf import feature_setting, register_setting_check, validate_name
from .elector import running_electors
from .exceptions import BackendUnavailable
from .lease import Lease

logger = logging.getLogger("django_leader")

#: The fields of a lease a health view can show; ``HEALTH_DETAILS`` picks those a caller
#: without the permission to view leases sees.
DETAILS = ("holder", "token", "expires_at")
#: The error a caller without that permission sees when the store cannot be read.
UNAVAILABLE = "store unavailable"


def health_details(raw: Any) -> frozenset[str]:
    """``HEALTH_DETAILS`` validated: a list of :data:`DETAILS`."""
    if isinstance(raw, str) or not isinstance(raw, (list, tuple, set, frozenset)):
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['HEALTH_DETAILS'] must be a list of fields among "
            f"{', '.join(DETAILS)}, got {raw!r}"
        )
    unknown = sorted(str(field) for field in raw if field not in DETAILS)
    if unknown:
        raise ImproperlyConfigured(
            f"DJANGO_LEADER['HEALTH_DETAILS'] has unknown field(s) {', '.join(unknown)}; "
            f"the fields are {', '.join(DETAILS)}"
        )
    return frozenset(raw)


register_setting_check("HEALTH_DETAILS", health_details)


def _trusted(request: HttpRequest) -> bool:
    """Whether the caller has the permission to view leases (the admin's)."""
    user = getattr(request, "user", None)
    return bool(
        user is not None and user.is_authenticated and user.has_perm("django_leader.view_lease")
    )


def _shown(request: HttpRequest) -> frozenset[str]:
    """The fields of a lease this caller may see: all of them with the permission to view
    leases, else those of ``HEALTH_DETAILS``."""
    if _trusted(request):
        return frozenset(DETAILS)
    return health_details(feature_setting("HEALTH_DETAILS"))


def _lease_json(
    request: HttpRequest, name: str, lease: Lease | None, **extra: Any
) -> dict[str, Any]:
    shown = _shown(request)
    fields = {
        "holder": lease.holder if lease else None,
        "token": lease.token if lease else None,
        "expires_at": lease.expires_at.isoformat() if lease and lease.expires_at else None,
    }
    return {
        "name": name,
        **{field: value for field, value in fields.items() if field in shown},
        **extra,
    }


def _bad_name(name: str) -> JsonResponse | None:
    try:
        validate_name(name)
    except (TypeError, ValueError) as exc:
        return JsonResponse({"name": name, "error": str(exc)}, status=400)
    return None


@never_cache
@require_GET
def has_leader(request: HttpRequest, name: str) -> HttpResponse:
    """200 when ``name`` has a leader (by the store's clock), else 503."""
    if (bad := _bad_name(name)) is not None:
        return bad
    try:
        lease = get_backend().read(name)
    except BackendUnavailable as exc:
        logger.warning("health check of %r: %s", name, exc)
        error = str(exc) if _trusted(request) else UNAVAILABLE
        return JsonResponse(_lease_json(request, name, None, error=error), status=503)
    return JsonResponse(
        _lease_json(request, name, lease, has_leader=lease is not None),
        status=200 if lease else 503,
    )


@never_cache
@require_GET
def leads_here(request: HttpRequest, name: str) -> HttpResponse:
    """200 when an Elector in this process leads ``name``, else 503. No store access."""
    if (bad := _bad_name(name)) is not None:
        return bad
    lease = next((e.lease for e in running_electors(name) if e.lease is not None), None)
    return JsonResponse(
        _lease_json(request, name, lease, leads_here=lease is not None),
        status=200 if lease else 503,
    )


@never_cache
@require_GET
def live(request: HttpRequest) -> HttpResponse:
    """503 when some Elector of this process has work left running longer than the grace
    period after its term ended (``Elector.stuck_for``), else 200. ``?grace=S`` (seconds);
    by default each elector's ``ttl``. No store access (as client-go's HealthzAdaptor)."""
    grace: float | None = None
    if "grace" in request.GET:
        raw = request.GET["grace"]
        try:
            grace = float(raw)
        except ValueError:
            grace = None
        if grace is None or not 0 <= grace < float("inf"):
            return JsonResponse(
                {"error": f"grace must be a number of seconds >= 0, got {raw!r}"}, status=400
            )
    electors = running_electors()
    identities = "holder" in _shown(request)
    stuck = []
    for elector in electors:
        stuck_for = elector.stuck_for
        allowed = elector.timing.ttl if grace is None else grace
        if stuck_for is not None and stuck_for > allowed:
            stuck.append(
                {
                    "name": elector.name,
                    "identity": elector.identity if identities else None,
                    "stuck_for": round(stuck_for, 3),
                    "grace": allowed,
                }
            )
    return JsonResponse(
        {"live": not stuck, "electors": len(electors), "stuck": stuck},
        status=503 if stuck else 200,
    )


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of django-leader's metrics (and the default registry)."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    except ImportError:
        return HttpResponse(
            "prometheus-client is not installed: pip install 'django-leader[prometheus]'\n",
            status=501,
            content_type="text/plain",
        )
    from . import metrics as leader_metrics

    leader_metrics.install()
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
