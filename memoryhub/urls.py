"""Root URL configuration."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from memoryhub import views

urlpatterns = [
    # The address `make run` prints first: the dashboard, which sends a visitor not signed in to
    # the login page. Not permanent: browsers must not cache where "/" leads.
    path("", RedirectView.as_view(url="/dashboard/", permanent=False), name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("health", views.health, name="health"),
    path("health/", views.health),
    path("readyz", views.readyz, name="readyz"),
    path("readyz/", views.readyz),
    path("metrics", views.metrics, name="metrics"),
    # The schema and its docs are public and read no credentials: a stray Authorization header
    # must not turn them into a 401 (or, for the HTML page, a 500 during rendering).
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[], throttle_classes=[],
                                   generator_class=views.OnceGeneratedSchema),
        name="schema",
    ),
    path(
        "api/docs/",
        # The split view serves Swagger UI's start-up script as a file: the page keeps working
        # under the Content-Security-Policy, which allows no inline script.
        SpectacularSwaggerSplitView.as_view(
            url_name="schema", permission_classes=[], authentication_classes=[], throttle_classes=[],
            http_method_names=["get", "head"],
        ),
        name="docs",
    ),
    path("admin/", admin.site.urls),
    # The agents' routes first: they are most of the requests, and Django walks every pattern of
    # each include ahead of the one that matches. No route here matches another include's path.
    path("", include("memories.urls")),
    path("", include("accounts.urls")),
    path("", include("stacks.urls")),
    path("", include("billing.urls")),
    path("", include("dashboard.urls")),
    path("", include("teleport.urls")),
]

handler400 = "memoryhub.errors.json_bad_request"
handler403 = "memoryhub.errors.json_forbidden"
handler404 = "memoryhub.errors.json_not_found"
handler500 = "memoryhub.errors.json_server_error"
