"""Dashboard routes, one section per area (each area's views live in dashboard/views/<area>.py).

Every view is a dashboard.access.dashboard_page except the sign-in, password-reset and
invitation-acceptance pages, which are for people not signed in yet.
"""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from dashboard.views import (
    account,
    audit,
    billing,
    consent,
    families,
    family_controls,
    keys,
    overview,
    people,
    privacy,
    requests,
    roster,
    student,
    webhooks,
)

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
    path("dashboard/students/<str:slug>/manage", roster.student_manage, name="student-manage"),
    path("dashboard/roster/example-<str:example>.csv", roster.roster_example, name="roster-example"),
    # --- privacy: settings and retention policy, erasure and its certificates (admins) --------
    # Before the student's page: `…/memories/<id>/erase` is not one of its memory actions.
    path("dashboard/privacy/", privacy.privacy, name="privacy"),
    path("dashboard/privacy/erasures/<str:certificate_id>/", privacy.certificate, name="erasure"),
    path("dashboard/students/<str:slug>/erase", privacy.student_erase, name="student-erase"),
    path("dashboard/students/<str:slug>/memories/<str:memory_id>/erase", privacy.memory_erase,
         name="memory-erase"),
    # --- a student's page --------------------------------------------------------------------
    path("dashboard/students/<str:slug>/", student.student_page, name="student"),
    path("dashboard/students/<str:slug>/memories/<str:memory_id>/", student.memory_detail, name="memory"),
    path("dashboard/students/<str:slug>/memories/<str:memory_id>/<str:action>", student.memory_action,
         name="memory-action"),
    path("dashboard/students/<str:slug>/export.json", student.export_json, name="student-export-json"),
    path("dashboard/students/<str:slug>/MEMORY.md", student.export_markdown, name="student-export-markdown"),
    path("dashboard/students/<str:slug>/archive.zip", student.export_archive, name="student-export-archive"),
    path("dashboard/students/<str:slug>/guardians", families.guardians_panel, name="student-guardians"),
    # consent and pause (admins; docs/consent.md)
    path("dashboard/students/<str:slug>/consent", consent.student_consent, name="student-consent"),
    path("dashboard/students/<str:slug>/pause", consent.student_pause, name="student-pause"),
    # --- families: a guardian's children (guardians only; docs/guardians.md) ----------------------
    path("dashboard/family/", families.children, name="families"),
    path("dashboard/family/<str:slug>/", families.child, name="family-child"),
    path("dashboard/family/<str:slug>/MEMORY.md", families.child_markdown, name="family-child-markdown"),
    path("dashboard/family/<str:slug>/archive.zip", families.child_archive, name="family-child-archive"),
    # a guardian's consent and pause controls on the child's page (docs/consent.md)
    path("dashboard/families/<str:slug>/consent", family_controls.family_consent, name="family-consent"),
    path("dashboard/families/<str:slug>/pause", family_controls.family_pause, name="family-pause"),
    # a guardian's requests for a correction or a deletion, and the school's queue (docs/guardians.md "Requests")
    path("dashboard/family/<str:slug>/memories/<str:memory_id>/request", requests.family_memory_request,
         name="family-memory-request"),
    path("dashboard/families/<str:slug>/requests", requests.family_stack_request, name="family-requests"),
    path("dashboard/family/<str:slug>/requests/<str:request_id>/certificate", requests.family_request_certificate,
         name="family-request-certificate"),
    path("dashboard/families/digest", families.family_digest, name="family-digest"),
    path("dashboard/requests/", requests.requests_queue, name="requests"),
    path("dashboard/requests/<str:request_id>/", requests.request_detail, name="request"),
    # --- people and invitations --------------------------------------------------------------
    path("dashboard/people/", people.people, name="people"),
    path("dashboard/people/<str:user_id>/role", people.member_role, name="member-role"),
    path("dashboard/people/<str:user_id>/remove", people.member_remove, name="member-remove"),
    path("dashboard/invitations/<str:invitation_id>/revoke", people.invitation_revoke, name="invitation-revoke"),
    path("invitations/<str:token>/", people.invitation_accept, name="invitation-accept"),
    # --- keys --------------------------------------------------------------------------------
    path("dashboard/keys/", keys.keys, name="keys"),
    path("dashboard/keys/<str:key_id>/revoke", keys.key_revoke, name="key-revoke"),
    path("dashboard/keys/<str:key_id>/cycle", keys.key_cycle, name="key-cycle"),
    # --- webhooks: endpoints, secrets, test events, delivery logs (admins) ---------------------
    path("dashboard/webhooks/", webhooks.webhooks, name="webhooks"),
    path("dashboard/webhooks/<str:endpoint_id>/", webhooks.webhook_detail, name="webhook"),
    path("dashboard/webhooks/<str:endpoint_id>/disable", webhooks.webhook_disable, name="webhook-disable"),
    path("dashboard/webhooks/<str:endpoint_id>/enable", webhooks.webhook_enable, name="webhook-enable"),
    path("dashboard/webhooks/<str:endpoint_id>/delete", webhooks.webhook_delete, name="webhook-delete"),
    path("dashboard/webhooks/<str:endpoint_id>/rotate", webhooks.webhook_rotate, name="webhook-rotate"),
    path("dashboard/webhooks/<str:endpoint_id>/test", webhooks.webhook_test, name="webhook-test"),
    # --- audit -------------------------------------------------------------------------------
    path("dashboard/audit/", audit.audit, name="audit"),
    # --- billing -----------------------------------------------------------------------------
    path("dashboard/billing/", billing.billing, name="billing"),
    path("dashboard/billing/upgrade", billing.billing_upgrade, name="billing-upgrade"),
    path("dashboard/billing/downgrade", billing.billing_downgrade, name="billing-downgrade"),
    path("dashboard/billing/cancel", billing.billing_cancel, name="billing-cancel"),
    path("dashboard/billing/reactivate", billing.billing_reactivate, name="billing-reactivate"),
    path("dashboard/billing/payments/<str:payment_id>/", billing.billing_payment, name="billing-payment"),
    path("dashboard/billing/payments/<str:payment_id>/confirm", billing.billing_confirm, name="billing-confirm"),
    path("dashboard/billing/wallets/message", billing.billing_wallet_message, name="billing-wallet-message"),
    path("dashboard/billing/wallets/<str:address>/unlink", billing.billing_wallet_unlink,
         name="billing-wallet-unlink"),
    # --- the signed-in person's own account --------------------------------------------------
    path("account/password/", account.password_change, name="password-change"),
    path("password-reset/", account.PasswordReset.as_view(), name="password-reset"),
    path("password-reset/sent/", account.PasswordResetSent.as_view(), name="password-reset-done"),
    path("password-reset/done/", account.PasswordResetComplete.as_view(), name="password-reset-complete"),
    path("password-reset/<str:uidb64>/<str:token>/", account.PasswordResetConfirm.as_view(),
         name="password-reset-confirm"),
]
