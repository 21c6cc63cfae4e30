from pathlib import Path

import django.contrib.admin
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.static import serve

# The admin's CSS and JS, straight from Django's package: the test project has no
# staticfiles app and no web server in front, and the browser test runs with DEBUG off.
# A real project serves static files with its web server (or WhiteNoise) instead.
ADMIN_STATIC = Path(django.contrib.admin.__file__).resolve().parent / "static"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("leader/", include("django_leader.urls")),
    re_path(r"^static/(?P<path>.*)$", serve, {"document_root": ADMIN_STATIC}),
]
