"""Dashboard: the school's people (admins only) and the public invitation page.

Admins list members and open invitations, invite a teacher, admin or billing user by email, change
a role and remove a member. Who may see and do this is accounts.selectors / accounts.invitations'
business (members_visible_to, ensure_may_manage_organization); removing a member is
stacks.services.membership_remove (their assignments, keys and sessions end with it).

The invitation link is shown to the admin once, in the answer to the POST that made it — never
through a redirect, the session or the message framework — and the page is not cacheable.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.forms import SetPasswordMixin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from accounts.invitations import (
    NewInvitation,
    invitation_children,
    invitation_create,
    invitation_email_send,
    invitation_for_principal,
    invitation_for_token,
    invitation_state,
    invitations_open_for,
)
from accounts.invitations import (
    invitation_accept as accept_invitation,
)
from accounts.invitations import (
    invitation_revoke as revoke_invitation,
)
from accounts.models import Membership, User
from accounts.principal import Principal
from accounts.selectors import email_taken, members_visible_to
from accounts.services import membership_role_change
from dashboard.access import ADMINS, dashboard_page, request_ip
from memoryhub.errors import DomainError
from stacks.services import membership_remove

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


class InviteForm(forms.Form):
    email = forms.EmailField(label="Email", max_length=254)
    # Guardians are invited for a student, from the student's page (docs/guardians.md), not from here.
    role = forms.ChoiceField(label="Role", initial=Membership.Role.TEACHER,
                             choices=[(value, label) for value, label in Membership.Role.choices
                                      if value != Membership.Role.GUARDIAN])


class JoinForm(SetPasswordMixin, forms.Form):
    """A new account's password, checked by Django's password validators (AUTH_PASSWORD_VALIDATORS)
    against the invited email as the would-be user."""

    def __init__(self, *args: Any, email: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["password1"], self.fields["password2"] = SetPasswordMixin.create_password_fields(
            label1="New password", label2="Confirm password")
        self.email = email

    def clean(self) -> dict[str, Any]:
        self.validate_passwords()
        self.validate_password_for_user(User(email=self.email, username=self.email))
        return super().clean() or {}


def _add_domain_error(form: forms.Form, error: DomainError) -> None:
    """A service's refusal shown on the form: on the fields it names, else above the form."""
    placed = False
    for field, field_messages in error.fields.items():
        if field in form.fields:
            for message in field_messages:
                form.add_error(field, str(message))
            placed = True
    if not placed:
        form.add_error(None, error.message)


def _people_page(request: HttpRequest, principal: Principal, *, form: InviteForm | None = None,
                 new: NewInvitation | None = None, link: str = "", emailed: bool = False,
                 status: int = 200) -> HttpResponse:
    members = list(members_visible_to(principal).order_by("created_at"))
    admins = sum(1 for membership in members if membership.role == Membership.Role.ADMIN)
    invitations = [(invitation, invitation_state(invitation))
                   for invitation in invitations_open_for(principal).order_by("-created_at")]
    response = render(request, "dashboard/people/index.html", {
        "members": members, "invitations": invitations, "form": form or InviteForm(),
        "roles": Membership.Role.choices, "last_admin": admins <= 1, "new": new, "link": link,
        "emailed": emailed, "me": principal.user,
    }, status=status)
    if new is not None:
        add_never_cache_headers(response)  # the link is shown this once
    return response


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def people(request: HttpRequest, principal: Principal) -> HttpResponse:
    if request.method != "POST":
        return _people_page(request, principal)
    form = InviteForm(request.POST)
    if not form.is_valid():
        return _people_page(request, principal, form=form, status=400)
    try:
        new = invitation_create(organization=principal.organization, email=form.cleaned_data["email"],
                                role=form.cleaned_data["role"], principal=principal, ip=request_ip(request))
    except DomainError as error:
        _add_domain_error(form, error)
        return _people_page(request, principal, form=form, status=error.status)
    link = request.build_absolute_uri(reverse("dashboard:invitation-accept", args=[new.token]))
    emailed = invitation_email_send(invitation=new.invitation, link=link)
    return _people_page(request, principal, new=new, link=link, emailed=emailed, status=201)


@dashboard_page(roles=ADMINS)
@require_POST
def member_role(request: HttpRequest, principal: Principal, user_id: str) -> HttpResponse:
    membership = membership_role_change(organization=principal.organization, user_public_id=user_id,
                                        role=request.POST.get("role", ""), principal=principal,
                                        ip=request_ip(request))
    messages.success(request, f"{membership.user.email or membership.user.username} is now "
                              f"{membership.get_role_display().lower()}.")
    if membership.user_id == principal.user.pk and membership.role != Membership.Role.ADMIN:
        return redirect("dashboard:overview")  # no longer an admin: this page is not theirs any more
    return redirect("dashboard:people")


@dashboard_page(roles=ADMINS)
@require_POST
def member_remove(request: HttpRequest, principal: Principal, user_id: str) -> HttpResponse:
    membership_remove(organization=principal.organization, user_public_id=user_id, principal=principal,
                      ip=request_ip(request))
    if user_id == principal.user.public_id:
        return redirect("/login/")  # removing oneself ended this very session
    messages.success(request, "The member was removed: their keys were revoked and their sessions ended.")
    return redirect("dashboard:people")


@dashboard_page(roles=ADMINS)
@require_POST
def invitation_revoke(request: HttpRequest, principal: Principal, invitation_id: str) -> HttpResponse:
    invitation = revoke_invitation(invitation=invitation_for_principal(principal, invitation_id),
                                   principal=principal, ip=request_ip(request))
    messages.success(request, f"The invitation for {invitation.email} was revoked; its link no longer works.")
    return redirect("dashboard:people")


# --- the invitee's page (no sign-in needed) -----------------------------------------------------

_UNUSABLE = {
    "expired": "This invitation has expired. Ask the school admin to invite you again.",
    "revoked": "This invitation was withdrawn by the school. Ask the school admin if you think that is a mistake.",
    "accepted": "This invitation has already been used. Sign in with the account it created.",
}


@sensitive_post_parameters("password1", "password2")
@never_cache
@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    invitation = invitation_for_token(token)
    if invitation is None:
        return render(request, "dashboard/people/invitation_gone.html",
                      {"message": "This invitation link is not valid. Check that you copied all of it, or ask "
                                  "the school admin for a new invitation."}, status=404)
    state = invitation_state(invitation)
    if state != "pending":
        return render(request, "dashboard/people/invitation_gone.html", {"message": _UNUSABLE[state]}, status=410)
    signed_in = request.user if isinstance(request.user, User) else None
    has_account = email_taken(invitation.email)
    form = JoinForm(email=invitation.email)
    status, refusal_message = 200, ""
    if request.method == "POST":
        if not has_account:
            form = JoinForm(request.POST, email=invitation.email)
        if has_account or form.is_valid():
            try:
                # An existing account joins as itself, and only when signed in as the invited email.
                member = accept_invitation(token=token, user=signed_in if has_account else None,
                                           password=None if has_account else form.cleaned_data["password1"],
                                           ip=request_ip(request))
            except DomainError as error:
                if has_account:
                    refusal_message = error.message
                else:
                    _add_domain_error(form, error)
                status = error.status
            else:
                if signed_in is None or signed_in.pk != member.pk:
                    login(request, member, backend=MODEL_BACKEND)
                messages.success(request, f"Welcome to {invitation.organization.name}.")
                return redirect("dashboard:overview")
        else:
            status = 400
    matching = signed_in is not None and signed_in.email.lower() == invitation.email.lower()
    return render(request, "dashboard/people/invitation.html", {
        "invitation": invitation, "organization": invitation.organization, "form": form,
        "children": invitation_children(invitation), "has_account": has_account, "signed_in": signed_in,
        "matching": matching, "refusal_message": refusal_message,
    }, status=status)

