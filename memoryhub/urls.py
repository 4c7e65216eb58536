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
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[]), name="docs"),
    path("admin/", admin.site.urls),
    path("", include("accounts.urls")),
    path("", include("stacks.urls")),
    path("", include("memories.urls")),
]

handler400 = "memoryhub.errors.json_bad_request"
handler403 = "memoryhub.errors.json_forbidden"
handler404 = "memoryhub.errors.json_not_found"
handler500 = "memoryhub.errors.json_server_error"
