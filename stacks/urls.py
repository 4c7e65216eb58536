"""Native stacks API, and the account routes whose views decide about stacks:
kernle registration (creates a stack), listing and issuing keys (bound to stacks) and removing a
member (drops their stack assignments). The rest of those families is in accounts/urls.py."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from stacks import api, kernle_api

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/stacks/", api.StackListView.as_view(), name="stacks"),
    path("api/v1/stacks/<str:stack>/", api.StackDetailView.as_view(), name="stack"),
    path("api/v1/stacks/<str:stack>/archive", api.StackArchiveView.as_view(), name="stack-archive"),
    path("api/v1/stacks/<str:stack>/unarchive", api.StackUnarchiveView.as_view(), name="stack-unarchive"),
    path("api/v1/stacks/<str:stack>/teachers/", api.StackTeachersView.as_view(), name="stack-teachers"),
    path("api/v1/stacks/<str:stack>/teachers/<str:user_id>/", api.StackTeacherDetailView.as_view(),
         name="stack-teacher"),
    path("api/v1/stacks/<str:stack>/guardians", api.StackGuardiansView.as_view(), name="stack-guardians"),
    path("api/v1/stacks/<str:stack>/guardians/<str:user_id>", api.StackGuardianDetailView.as_view(),
         name="stack-guardian"),
    path("auth/register", kernle_api.RegisterView.as_view(), name="kernle-register"),
    path("api/v1/keys/", api.KeyListView.as_view(), name="keys"),
    path("api/v1/members/<str:user_id>/", api.MemberDetailView.as_view(), name="member"),
]
