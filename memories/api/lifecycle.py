"""Lifecycle API: forgetting candidates, agent-reported recall, and job runs for admins.

Thin views: stack-scoped routes resolve the stack through `stacks.selectors.stack_for_principal`
(a stack the caller cannot see is a 404; a read-only key recording a recall is a 403), who may see
job runs and whose share is `memories.selectors.job_runs_scope`; the request serializers below read the
query strings and bodies; the work is in memories.lifecycle.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.urls import path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authors import Path, request_author
from accounts.principal import principal_of
from memories import selectors
from memories.lifecycle.decay import Grade
from memories.lifecycle.decay_pass import forgetting_candidates
from memories.lifecycle.jobs import JOB_NAMES, job_run_share, job_runs_recent
from memories.lifecycle.reviews import memory_decay_view, record_review
from memories.models import JobRun, Memory
from memories.privacy.grants import Audience, audience_for
from memories.reads.access_log import AccessPath, record_request_access
from memories.serializers import validated
from stacks.models import Stack
from stacks.selectors import stack_for_principal

TAG = "lifecycle"
PREVIEW_CHARS = 200
MAX_FORECAST_DAYS = 3650
GRADE_NAMES = {"again": Grade.AGAIN, "hard": Grade.HARD, "good": Grade.GOOD, "easy": Grade.EASY}


def _stack(request: Request, slug: str, *, write: bool = False) -> Stack:
    return stack_for_principal(principal_of(request), slug, write=write)


def _audience(request: Request, target: Stack) -> Audience | None:
    """The caller's privacy-grants audience on `target` (None: the stack's own credentials)."""
    return audience_for(principal_of(request), stack_id=target.pk)


# --- forgetting candidates ----------------------------------------------------------------------


class CandidatesQuerySerializer(serializers.Serializer):
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=200)
    as_of = serializers.DateTimeField(required=False, help_text="Forecast: what a pass at this time would forget "
                                                                "(default now; at most ten years ahead).")

    def validate_as_of(self, value: datetime) -> datetime:
        now = timezone.now()
        if value < now - timedelta(minutes=5) or value > now + timedelta(days=MAX_FORECAST_DAYS):
            raise serializers.ValidationError("Must be between now and ten years from now.")
        return value


class CandidateSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    record_id = serializers.CharField()
    preview = serializers.CharField(help_text=f"The first {PREVIEW_CHARS} characters of the text.")
    created_at = serializers.DateTimeField()
    last_reviewed_at = serializers.DateTimeField(allow_null=True)
    salience = serializers.FloatField()
    retrievability = serializers.FloatField()


class CandidatesSerializer(serializers.Serializer):
    stack = serializers.CharField()
    as_of = serializers.DateTimeField()
    threshold = serializers.FloatField(help_text="The school's forget threshold: salience below it is forgotten.")
    candidates = CandidateSerializer(many=True)


def _candidate(memory: Memory, at: datetime) -> dict[str, Any]:
    figures = memory_decay_view(memory, at)
    return {
        "id": memory.pk, "kind": memory.kind, "record_id": memory.record_id, "preview": memory.text[:PREVIEW_CHARS],
        "created_at": memory.created_at, "last_reviewed_at": memory.last_reviewed_at,
        "salience": figures["salience"], "retrievability": figures["retrievability"],
    }


class ForgettingCandidatesView(APIView):
    @extend_schema(tags=[TAG], operation_id="stack_forgetting_candidates",
                   parameters=[CandidatesQuerySerializer], responses=CandidatesSerializer,
                   summary="What the next decay pass would forget in this stack, most faded first")
    def get(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack)
        query = validated(CandidatesQuerySerializer, request.query_params)
        at = query.get("as_of") or timezone.now()
        memories = forgetting_candidates(stack=target, now=at, limit=query["limit"],
                                         audience=_audience(request, target))
        # Each candidate comes with the head of its text: a read (docs/privacy.md "Access log").
        record_request_access(request, stack_id=target.pk, path=AccessPath.LIST, memory_ids=[m.pk for m in memories])
        return Response(CandidatesSerializer({
            "stack": target.slug, "as_of": at, "threshold": target.organization.forget_threshold,
            "candidates": [_candidate(m, at) for m in memories],
        }).data)


# --- recall -------------------------------------------------------------------------------------


class RecallInSerializer(serializers.Serializer):
    grade = serializers.ChoiceField(
        choices=[*GRADE_NAMES, 1, 2, 3, 4], required=False, default="good",
        help_text="How well the memory served: again (1, it was wrong), hard (2), good (3, default), easy (4).")


class RecallOutSerializer(serializers.Serializer):
    memory_id = serializers.UUIDField()
    grade = serializers.CharField()
    recovered = serializers.BooleanField(help_text="The memory had faded (decay tombstone) and is back.")
    stability = serializers.FloatField(help_text="Days until retrievability falls to 0.9.")
    difficulty = serializers.FloatField()
    retrievability_before = serializers.FloatField()
    next_review_in_days = serializers.IntegerField()
    salience = serializers.FloatField()


def _grade(value: Any) -> Grade:
    if isinstance(value, str) and value in GRADE_NAMES:
        return GRADE_NAMES[value]
    return Grade(int(value))


class MemoryRecallView(APIView):
    @extend_schema(tags=[TAG], operation_id="memory_recall", request=RecallInSerializer,
                   responses=RecallOutSerializer,
                   summary="Report that a memory was recalled and used (an explicit FSRS review)")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        author = request_author(request, principal_of(request), path=Path.API)  # a bad X-Agent-Id: 400
        target = _stack(request, stack, write=True)
        body = validated(RecallInSerializer, request.data)
        memory = selectors.memory_get(stack=target, memory_id=memory_id, audience=_audience(request, target))
        grade = _grade(body["grade"])
        result = record_review(memory=memory, grade=grade, source="recall", author=author)
        return Response(RecallOutSerializer({
            "memory_id": memory.pk, "grade": grade.name.lower(), "recovered": result.recovered,
            "stability": result.outcome.stability, "difficulty": result.outcome.difficulty,
            "retrievability_before": result.outcome.retrievability_before,
            "next_review_in_days": result.outcome.interval_days, "salience": result.salience,
        }).data)


# --- job runs -----------------------------------------------------------------------------------


class JobRunSerializer(serializers.ModelSerializer):
    """A run as the caller may see it: staff get the service-wide counts and the error; everyone
    else (school admins) their organization's share only (`context["organization_id"]`)."""

    scope = serializers.SerializerMethodField(help_text="`service`: counts of the whole run (staff); "
                                                        "`organization`: only the caller's school's share")
    counts = serializers.SerializerMethodField(
        help_text="Staff: what the run did in total. A school: what it did to the school's stacks (decay: "
                  "forgotten; ttl_purge: purged; promotion: beliefs_created; other jobs: none)")
    error = serializers.SerializerMethodField(help_text="Why it failed (staff only)")

    class Meta:
        model = JobRun
        fields = ["id", "name", "status", "started_at", "finished_at", "duration_ms", "scope", "counts", "error"]

    def get_scope(self, run: JobRun) -> str:
        return "service" if self.context.get("organization_id") is None else "organization"

    def get_counts(self, run: JobRun) -> dict[str, Any]:
        organization_id = self.context.get("organization_id")
        return run.counts if organization_id is None else job_run_share(run, organization_id)

    def get_error(self, run: JobRun) -> str:
        return run.error if self.context.get("organization_id") is None else ""


class JobRunsQuerySerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=list(JOB_NAMES), required=False)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


class JobRunListView(APIView):
    @extend_schema(tags=[TAG], operation_id="job_runs_list", parameters=[JobRunsQuerySerializer],
                   responses=JobRunSerializer(many=True),
                   summary="Recent runs of the periodic jobs (decay, TTL purge, promotion, embedding sweep)",
                   description="Staff and school admins (signed in, or with a school-wide key). Jobs are "
                               "service-wide; each run records its status, duration and counts, and its share per "
                               "school: staff see the totals, a school admin every run with only their school's "
                               "numbers. A run that overlapped the previous one is recorded as `skipped`.")
    def get(self, request: Request) -> Response:
        organization_id = selectors.job_runs_scope(principal_of(request))
        query = validated(JobRunsQuerySerializer, request.query_params)
        runs = job_runs_recent(name=query.get("name"))[: query["limit"]]
        return Response(JobRunSerializer(runs, many=True, context={"organization_id": organization_id}).data)


urlpatterns = [
    path("api/v1/stacks/<str:stack>/forgetting-candidates", ForgettingCandidatesView.as_view(),
         name="stack-forgetting-candidates"),
    path("api/v1/stacks/<str:stack>/memories/<uuid:memory_id>/recall", MemoryRecallView.as_view(),
         name="memory-recall"),
    path("api/v1/jobs/", JobRunListView.as_view(), name="job-runs"),
]
