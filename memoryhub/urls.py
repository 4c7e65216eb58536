"""Root URL configuration."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from memoryhub import views

urlpatterns = [
    path("health", views.health, name="health"),
    path("health/", views.health),
    path("readyz", views.readyz, name="readyz"),
    path("readyz/", views.readyz),
    # The schema and its docs are public and read no credentials: a stray Authorization header
    # must not turn them into a 401 (or, for the HTML page, a 500 during rendering).
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[], throttle_classes=[]),
        name="schema",
    ),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(
            url_name="schema", permission_classes=[], authentication_classes=[], throttle_classes=[],
            http_method_names=["get", "head"],
        ),
        name="docs",
    ),
    path("admin/", admin.site.urls),
    path("", include("accounts.urls")),
    path("", include("stacks.urls")),
    path("", include("memories.urls")),
]

handler400 = "memoryhub.errors.json_bad_request"
handler403 = "memoryhub.errors.json_forbidden"
handler404 = "memoryhub.errors.json_not_found"
handler500 = "memoryhub.errors.json_server_error"
