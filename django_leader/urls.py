"""``path("leader/", include("django_leader.urls"))``: see :mod:`django_leader.views`."""

from django.urls import path

from . import views

app_name = "django_leader"

urlpatterns = [
    path("metrics/", views.metrics, name="metrics"),
    # Not under health/: that would take a lease named "live" from health/<name>/.
    path("live/", views.live, name="live"),
    path("health/<path:name>/here/", views.leads_here, name="leads_here"),
    path("health/<path:name>/", views.has_leader, name="has_leader"),
]
