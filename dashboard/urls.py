"""Dashboard routes, one section per area (each area's views live in dashboard/views/<area>.py).

Every view is a dashboard.access.dashboard_page except the sign-in, password-reset and
invitation-acceptance pages, which are for people not signed in yet.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from dashboard.views import account, audit, billing, keys, overview, people, roster, student

app_name = "dashboard"

urlpatterns: list[URLPattern | URLResolver] = [
    # --- overview ---------------------------------------------------------------------------
    path("dashboard/", overview.overview, name="overview"),
    # --- roster: creating, importing, archiving students; assigning teachers -----------------
    path("dashboard/roster/", roster.roster, name="roster"),
    path("dashboard/students/new", roster.student_create, name="student-create"),
    path("dashboard/students/<str:slug>/archive", roster.student_archive, name="student-archive"),
    path("dashboard/students/<str:slug>/unarchive", roster.student_unarchive, name="student-unarchive"),
    path("dashboard/students/<str:slug>/teachers", roster.student_teachers, name="student-teachers"),
    # --- a student's page --------------------------------------------------------------------
    path("dashboard/students/<str:slug>/", student.student_page, name="student"),
    path("dashboard/students/<str:slug>/memories/<str:memory_id>/", student.memory_detail, name="memory"),
    path("dashboard/students/<str:slug>/memories/<str:memory_id>/<str:action>", student.memory_action,
         name="memory-action"),
    path("dashboard/students/<str:slug>/export.json", student.export_json, name="student-export-json"),
    path("dashboard/students/<str:slug>/MEMORY.md", student.export_markdown, name="student-export-markdown"),
    # --- people and invitations --------------------------------------------------------------
    path("dashboard/people/", people.people, name="people"),
    path("invitations/<str:token>/", people.invitation_accept, name="invitation-accept"),
    # --- keys --------------------------------------------------------------------------------
    path("dashboard/keys/", keys.keys, name="keys"),
    # --- audit -------------------------------------------------------------------------------
    path("dashboard/audit/", audit.audit, name="audit"),
    # --- billing -----------------------------------------------------------------------------
    path("dashboard/billing/", billing.billing, name="billing"),
    # --- the signed-in person's own account --------------------------------------------------
    path("account/password/", account.password_change, name="password-change"),
]
