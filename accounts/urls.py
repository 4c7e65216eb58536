"""Kernle auth routes (no trailing slash: the CLI appends paths directly), the native keys,
members and audit API, and dashboard sign-in/out.

Three routes of these families are in stacks/urls.py, because their views decide about stacks:
`auth/register` (creates a stack), `api/v1/keys/` (issues keys bound to stacks) and
`api/v1/members/<id>/` (removing a member drops their stack assignments)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from accounts import api, kernle_api, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("auth/login", kernle_api.LoginView.as_view(), name="kernle-login"),
    path("auth/me", kernle_api.MeView.as_view(), name="kernle-me"),
    path("auth/keys", kernle_api.KeysView.as_view(), name="kernle-keys"),
    path("auth/keys/<str:key_id>", kernle_api.KeyDetailView.as_view(), name="kernle-key"),
    path("auth/keys/<str:key_id>/cycle", kernle_api.KeyCycleView.as_view(), name="kernle-key-cycle"),
    path("api/v1/keys/<str:key_id>/", api.KeyDetailView.as_view(), name="key"),
    path("api/v1/keys/<str:key_id>/cycle", api.KeyCycleView.as_view(), name="key-cycle"),
    path("api/v1/members/", api.MemberListView.as_view(), name="members"),
    path("api/v1/audit/", api.AuditLogView.as_view(), name="audit"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
]
