"""Native stacks API and the dashboard."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from stacks import api, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/stacks/", api.StackListView.as_view(), name="stacks"),
    path("api/v1/stacks/<str:stack>/", api.StackDetailView.as_view(), name="stack"),
    path("api/v1/stacks/<str:stack>/archive", api.StackArchiveView.as_view(), name="stack-archive"),
    path("api/v1/stacks/<str:stack>/unarchive", api.StackUnarchiveView.as_view(), name="stack-unarchive"),
    path("api/v1/stacks/<str:stack>/teachers/", api.StackTeachersView.as_view(), name="stack-teachers"),
    path("api/v1/stacks/<str:stack>/teachers/<str:user_id>/", api.StackTeacherDetailView.as_view(),
         name="stack-teacher"),
    path("dashboard/", views.dashboard, name="dashboard"),
]
