"""Native API for stacks: list, create, update, archive, teacher assignments (/api/v1/stacks/…).

Every stack is resolved through stacks.selectors; management needs a school admin or a writable
school key (accounts.selectors.ensure_may_manage_organization) on top of visibility, so that an
invisible stack stays a 404 and a visible one the caller may not manage is a 403.

Two school routes that decide about stacks are served here too (accounts, below stacks, cannot):
listing and issuing keys (`/api/v1/keys/`: a key may be bound to a stack) and removing a member
(`/api/v1/members/{id}/`: their stack assignments go with them). The rest of the keys and members
API is accounts.api.
"""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from accounts.invitations import invitation_email_send
from accounts.models import User
from accounts.network import client_ip
from accounts.principal import Principal, principal_of
from accounts.schema import ERRORS, FORBIDDEN, NOT_VISIBLE
from accounts.selectors import ensure_may_manage_organization, keys_visible_to
from accounts.serializers import (
    KeyCreatedSerializer,
    KeyIssueSerializer,
    KeySummarySerializer,
    key_summary,
    key_with_secret,
)
from accounts.services import api_key_issue
from accounts.throttles import KEY_CREATE_THROTTLES, RequestRateThrottle, SchoolThrottle
from memoryhub.errors import Forbidden, InvalidInput, NotFound
from memoryhub.pagination import StableCursorPagination
from stacks.guardians import guardian_invite, guardian_unlink, guardians_of
from stacks.models import Stack
from stacks.selectors import stack_for_new_key, stack_for_principal, stacks_visible_to
from stacks.serializers import (
    GuardianInvitedSerializer,
    GuardianInviteSerializer,
    GuardianSerializer,
    StackCreateSerializer,
    StackSerializer,
    StackUpdateSerializer,
    TeacherAssignmentSerializer,
)
from stacks.services import (
    membership_remove,
    stack_archive,
    stack_create,
    stack_unarchive,
    stack_update,
    teacher_assign,
    teacher_unassign,
)

NOT_FOUND = {404: OpenApiResponse(description="No such stack visible to the caller")}
QUOTA = {402: OpenApiResponse(description="The tier's stack limit is reached (`stack_limit_reached`)")}
CONFLICT = {409: OpenApiResponse(description="Exists already, or the stack is archived")}


def _managed_stack(principal: Principal, slug: str) -> Stack:
    """A visible stack (404 otherwise) that the caller may manage (403 otherwise)."""
    stack = stack_for_principal(principal, slug)
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    ensure_may_manage_organization(principal)
    return stack


class StackListView(APIView):
    @extend_schema(operation_id="stacks_list", tags=["stacks"],
                   parameters=[OpenApiParameter("status", str, enum=["active", "archived"], required=False)],
                   responses={200: StackSerializer(many=True), **ERRORS},
                   summary="Stacks the caller may see (school: all; teacher: assigned; agent key: its own)")
    def get(self, request: Request) -> Response:
        stacks = stacks_visible_to(principal_of(request))
        wanted = request.query_params.get("status")
        if wanted is not None:
            if wanted not in ("active", "archived"):
                raise InvalidInput("status must be active or archived.", fields={"status": ["active or archived"]})
            stacks = stacks.filter(status=wanted)
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(stacks, request, view=self)
        return paginator.get_paginated_response(StackSerializer(page or [], many=True).data)

    @extend_schema(operation_id="stacks_create", tags=["stacks"], request=StackCreateSerializer,
                   responses={201: StackSerializer, **FORBIDDEN, **CONFLICT, **QUOTA, **ERRORS},
                   summary="Create a stack in the school (admins; counts against the tier's stack quota)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)
        serializer = StackCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        stack = stack_create(organization=principal.organization, slug=data["stack_id"],
                             display_name=data["display_name"], kind=data["kind"], principal=principal,
                             ip=client_ip(request))
        return Response(StackSerializer(stack).data, status=status.HTTP_201_CREATED)


class StackDetailView(APIView):
    @extend_schema(operation_id="stacks_retrieve", tags=["stacks"],
                   responses={200: StackSerializer, **NOT_FOUND, **ERRORS}, summary="Read a stack")
    def get(self, request: Request, stack: str) -> Response:
        return Response(StackSerializer(stack_for_principal(principal_of(request), stack)).data)

    @extend_schema(operation_id="stacks_update", tags=["stacks"], request=StackUpdateSerializer,
                   responses={200: StackSerializer, **FORBIDDEN, **NOT_FOUND, **CONFLICT, **ERRORS},
                   summary="Rename a stack or change its kind (admins)")
    def patch(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = stack_for_principal(principal, stack, write=True)
        ensure_may_manage_organization(principal)
        serializer = StackUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        updated = stack_update(stack=found, display_name=data.get("display_name"), kind=data.get("kind"),
                               principal=principal, ip=client_ip(request))
        return Response(StackSerializer(updated).data)


class StackArchiveView(APIView):
    @extend_schema(operation_id="stacks_archive", tags=["stacks"], request=None,
                   responses={200: StackSerializer, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Archive: the stack keeps its data and refuses writes (idempotent)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = _managed_stack(principal, stack)
        return Response(StackSerializer(stack_archive(stack=found, principal=principal,
                                                      ip=client_ip(request))).data)


class StackUnarchiveView(APIView):
    @extend_schema(operation_id="stacks_unarchive", tags=["stacks"], request=None,
                   responses={200: StackSerializer, **FORBIDDEN, **NOT_FOUND, **QUOTA, **ERRORS},
                   summary="Make an archived stack writable again (idempotent)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = _managed_stack(principal, stack)
        return Response(StackSerializer(stack_unarchive(stack=found, principal=principal,
                                                        ip=client_ip(request))).data)


def _teacher_of(principal: Principal, user_id: str) -> User:
    teacher = None
    if "\x00" not in user_id and len(user_id) <= 32:
        teacher = User.objects.filter(
            public_id=user_id, memberships__organization_id=principal.organization.pk).first()
    if teacher is None:
        raise NotFound("Member not found.", code="member_not_found")
    return teacher


class StackTeachersView(APIView):
    @extend_schema(operation_id="stacks_teachers_list", tags=["stacks"],
                   responses={200: TeacherAssignmentSerializer(many=True), **NOT_FOUND, **ERRORS},
                   summary="The teachers assigned to a stack")
    def get(self, request: Request, stack: str) -> Response:
        found = stack_for_principal(principal_of(request), stack)
        user_ids = found.teacher_assignments.order_by("created_at").values_list("user__public_id", flat=True)
        return Response([{"user_id": user_id} for user_id in user_ids])

    @extend_schema(operation_id="stacks_teachers_assign", tags=["stacks"], request=TeacherAssignmentSerializer,
                   responses={201: TeacherAssignmentSerializer, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Assign a teacher of the school to a stack (admins)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = _managed_stack(principal, stack)
        serializer = TeacherAssignmentSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        teacher = _teacher_of(principal, serializer.validated_data["user_id"])
        teacher_assign(stack=found, teacher=teacher, principal=principal, ip=client_ip(request))
        return Response({"user_id": teacher.public_id}, status=status.HTTP_201_CREATED)


class StackTeacherDetailView(APIView):
    @extend_schema(operation_id="stacks_teachers_unassign", tags=["stacks"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Take a teacher off a stack (admins)")
    def delete(self, request: Request, stack: str, user_id: str) -> Response:
        principal = principal_of(request)
        found = _managed_stack(principal, stack)
        teacher_unassign(stack=found, teacher=_teacher_of(principal, user_id), principal=principal,
                         ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- guardians: parents and guardians of a student (docs/guardians.md) -------------------------


class StackGuardiansView(APIView):
    @extend_schema(operation_id="stacks_guardians_list", tags=["guardians"],
                   responses={200: GuardianSerializer(many=True), **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="A student's guardians and the guardian invitations not used yet (school admins)")
    def get(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = stack_for_principal(principal, stack)
        if not principal.is_org_wide:
            raise Forbidden("Only school admins and school keys may list a student's guardians.",
                            code="admin_required")
        return Response(GuardianSerializer(guardians_of(found), many=True).data)

    @extend_schema(operation_id="stacks_guardians_invite", tags=["guardians"], request=GuardianInviteSerializer,
                   responses={201: GuardianInvitedSerializer,
                              200: OpenApiResponse(GuardianInvitedSerializer,
                                                   description="Linked at once, or added to a pending invitation"),
                              **FORBIDDEN, **NOT_FOUND, **CONFLICT, **ERRORS},
                   summary="Invite a parent or guardian of a student; the one-time link is in the answer",
                   description=("School admins and writable school keys. A new invitation (201) carries "
                                "`invitation_url`, shown once and e-mailed; whoever opens it sets a password and "
                                "sees this student (docs/guardians.md). An address that is already a guardian in "
                                "the school is linked at once (200, `linked`); one with a pending guardian "
                                "invitation gets the student added to it (200, `added_to_pending`)."))
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        found = stack_for_principal(principal, stack)
        serializer = GuardianInviteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        done = guardian_invite(principal=principal, stack=found, email=data["email"], name=data["name"],
                               ip=client_ip(request))
        invitation_url, emailed = None, False
        if done.new is not None:
            invitation_url = request.build_absolute_uri(reverse("dashboard:invitation-accept", args=[done.new.token]))
            emailed = invitation_email_send(invitation=done.new.invitation, link=invitation_url)
        invitation = done.invitation
        body = {"status": done.outcome, "email": done.email,
                "invitation_id": invitation.public_id if invitation else None, "invitation_url": invitation_url,
                "expires_at": invitation.expires_at if invitation else None, "emailed": emailed}
        answer = Response(GuardianInvitedSerializer(body).data,
                          status=status.HTTP_201_CREATED if done.new is not None else status.HTTP_200_OK)
        answer["Cache-Control"] = "no-store"  # the link is shown this once
        return answer


class StackGuardianDetailView(APIView):
    @extend_schema(operation_id="stacks_guardians_unlink", tags=["guardians"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Unlink a guardian from a student (school admins); their account stays")
    def delete(self, request: Request, stack: str, user_id: str) -> Response:
        principal = principal_of(request)
        found = stack_for_principal(principal, stack)
        guardian_unlink(principal=principal, stack=found, user_public_id=user_id, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- keys and members: school routes that decide about stacks ---------------------------------


class KeyListView(APIView):
    def get_throttles(self) -> list[BaseThrottle]:
        if self.request is not None and self.request.method == "POST":
            return [throttle() for throttle in KEY_CREATE_THROTTLES]
        return [RequestRateThrottle(), SchoolThrottle()]

    @extend_schema(operation_id="keys_list", tags=["keys"], responses={200: KeySummarySerializer(many=True), **ERRORS},
                   summary="Keys the caller may see (school: all; agent key: its stack's; teacher: assigned stacks')")
    def get(self, request: Request) -> Response:
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(keys_visible_to(principal_of(request)), request, view=self)
        return paginator.get_paginated_response([key_summary(key) for key in page or []])

    @extend_schema(operation_id="keys_issue", tags=["keys"], request=KeyIssueSerializer,
                   responses={201: KeyCreatedSerializer, **FORBIDDEN, **NOT_VISIBLE, **ERRORS},
                   summary="Issue a key bound to a stack or to the school; the secret is shown once",
                   description=("A key bound to a stack reads what its issuer may read of the stack's memories "
                                "(the caller's privacy grants), unless `stack_agent` makes it the student's own "
                                "agent key, which reads all of them (school admins and school keys only; audited "
                                "as `key.issued_as_stack_agent`). docs/privacy.md \"Keys and the grants\"."))
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = KeyIssueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        stack = stack_for_new_key(principal, data["stack_id"], stack_agent=data["stack_agent"])
        key, secret = api_key_issue(organization=principal.organization, user=principal.user,
                                    stack_id=stack.pk if stack else None, name=data["name"],
                                    read_only=data["read_only"], expires_at=data["expires_at"],
                                    stack_agent=data["stack_agent"], principal=principal, ip=client_ip(request))
        return Response(key_with_secret(key, secret), status=status.HTTP_201_CREATED)


class MemberDetailView(APIView):
    @extend_schema(operation_id="members_remove", tags=["members"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_VISIBLE, **ERRORS},
                   summary="Remove a person from the school; their keys here are revoked")
    def delete(self, request: Request, user_id: str) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)
        membership_remove(organization=principal.organization, user_public_id=user_id, principal=principal,
                          ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
