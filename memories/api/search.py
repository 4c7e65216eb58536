"""Search, smart ingest and retrieval feedback routes.

* `POST api/v1/stacks/{stack}/search` — hybrid search of one stack (native API, full scores);
* `POST api/v1/search` — a school key searching across its stacks (nothing else may);
* `POST memories/search` — the Kernle contract (docs/kernle-protocol.md §5), no trailing slash;
* `POST api/v1/stacks/{stack}/ingest` — smart ingest (docs/algorithms.md §6);
* `POST api/v1/stacks/{stack}/memories/{id}/feedback` — promote / demote (docs/algorithms.md §3.3).

Thin views: the request serializers (memories.serializers) read the bodies; stacks and permissions
come from stacks.selectors and memories.selectors; each view calls one service and serializes.
"""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, path
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authors import Path, request_author
from accounts.principal import principal_of
from memories import selectors
from memories.models import Memory
from memories.privacy.grants import audience_for
from memories.reads.access_log import AccessPath, record_request_access
from memories.search.hybrid import search_memories
from memories.search.query import SearchHit, SearchQuery, SearchResult
from memories.search.retrieval_feedback import memory_feedback
from memories.search.smart_ingest import smart_ingest
from memories.serializers import validated
from memories.serializers.fields import KERNLE_TYPES
from memories.serializers.search import (
    KernleSearchInSerializer,
    RetrievalFeedbackInSerializer,
    SchoolSearchInSerializer,
    SearchInSerializer,
    SmartIngestInSerializer,
)
from stacks.models import Stack
from stacks.selectors import stack_for_principal

ERRORS = {
    400: OpenApiResponse(description="Invalid input; `error.fields` says which field and why"),
    401: OpenApiResponse(description="Missing or invalid credential"),
    404: OpenApiResponse(description="No such stack (or memory) visible to this credential"),
    503: OpenApiResponse(description="Database, Redis or the embedding service unavailable; see Retry-After"),
}
WRITE_ERRORS = {**ERRORS, 403: OpenApiResponse(description="Read-only key"),
                409: OpenApiResponse(description="Archived stack, or a memory that is not live")}

PLURAL = {kind: plural for plural, kind in KERNLE_TYPES.items()}


# --- serialization ----------------------------------------------------------------------------------

def _hit_json(hit: SearchHit, stack_slugs: dict[int, str]) -> dict[str, Any]:
    memory = hit.memory
    return {
        "id": str(memory.pk),
        "record_id": memory.record_id,
        "stack": stack_slugs.get(memory.stack_id, ""),
        "kind": memory.kind,
        "text": memory.text,
        "tags": memory.tags,
        "confidence": memory.confidence,
        "created_at": memory.created_at.isoformat(),
        "score": hit.combined_score,
        "combined_score": hit.combined_score,
        "fused_score": round(hit.fused_score, 6),
        "keyword_score": None if hit.keyword_score is None else round(hit.keyword_score, 6),
        "semantic_score": None if hit.semantic_score is None else round(hit.semantic_score, 6),
        "match_type": hit.match_type,
        "retention": round(hit.retention, 6),
        "boosts": hit.boosts,  # e.g. {"context": …}: what lifted it above its legs' score (algorithms §7.5)
        "context_of": None if hit.context_of is None else str(hit.context_of),
    }


def _result_json(result: SearchResult, query: SearchQuery, stacks: list[Stack]) -> dict[str, Any]:
    slugs = {stack.pk: stack.slug for stack in stacks}
    return {
        "results": [_hit_json(hit, slugs) for hit in result.hits],
        "query": query.text,
        "total": len(result.hits),
        "method": result.method,
        "embedding_model": result.embedding_model,
        "took_ms": round(result.took_ms, 2),
        "timings_ms": {k: v for k, v in result.stats.items() if k.endswith("_ms")},
        "legs": result.legs,
    }


_HIT = inline_serializer("SearchHit", {
    "id": serializers.UUIDField(), "record_id": serializers.CharField(), "stack": serializers.CharField(),
    "kind": serializers.CharField(), "text": serializers.CharField(),
    "tags": serializers.ListField(child=serializers.CharField()), "confidence": serializers.FloatField(),
    "created_at": serializers.DateTimeField(), "score": serializers.FloatField(),
    "combined_score": serializers.FloatField(), "fused_score": serializers.FloatField(),
    "keyword_score": serializers.FloatField(allow_null=True), "semantic_score": serializers.FloatField(allow_null=True),
    "match_type": serializers.CharField(help_text="keyword | semantic | both"), "retention": serializers.FloatField(),
    "boosts": serializers.DictField(child=serializers.FloatField(), help_text=(
        "What lifted the hit above its legs' own score: `context` = the share a neighbouring turn lent")),
    "context_of": serializers.UUIDField(allow_null=True, help_text="The hit that lent the context boost"),
})
# Which legs ran (memories.search.hybrid, docs/algorithms.md §7.1): a search never drops to
# keyword-only without saying so here.
_LEGS = inline_serializer("SearchLegs", {
    "keyword": serializers.CharField(help_text="`ran` (`skipped: nothing to search` when no stack is in scope)"),
    "semantic": serializers.CharField(help_text=(
        "`ran`, or `skipped: <reason>`: `model mismatch (queries are embedded with A, the stored vectors with B)`, "
        "`embedder unavailable`, `no embedded memories yet`, `nothing to search`")),
}, help_text="Which search legs ran; a skipped leg says why.")
_SEARCH_RESPONSE = inline_serializer("SearchResponse", {
    "results": _HIT.__class__(many=True), "query": serializers.CharField(), "total": serializers.IntegerField(),
    "method": serializers.CharField(), "embedding_model": serializers.CharField(),
    "took_ms": serializers.FloatField(),
    "timings_ms": serializers.DictField(child=serializers.FloatField(), help_text="keyword, embed, vector legs"),
    "legs": _LEGS,
})


# --- native search ----------------------------------------------------------------------------------

class StackSearchView(APIView):
    @extend_schema(operation_id="stack_search", tags=["search"], request=SearchInSerializer,
                   responses={200: _SEARCH_RESPONSE, **ERRORS},
                   examples=[OpenApiExample("Search a stack", request_only=True, value={
                       "query": "fractions", "limit": 5, "kinds": ["note", "belief"], "tags": ["math"]})],
                   summary="Hybrid (full-text + vector, RRF) search of one stack")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        query = validated(SearchInSerializer, request.data)["search"]
        result = search_memories(stack_ids=[target.pk], query=query,
                                 audience=audience_for(principal, stack_id=target.pk))
        record_request_access(request, stack_id=target.pk, path=AccessPath.SEARCH,
                              memory_ids=[hit.memory.pk for hit in result.hits])
        return Response(_result_json(result, query, [target]))


class SchoolSearchView(APIView):
    @extend_schema(operation_id="school_search", tags=["search"], request=SchoolSearchInSerializer,
                   responses={200: _SEARCH_RESPONSE, 403: OpenApiResponse(description="Not a school key"), **ERRORS},
                   summary="Search across the stacks of a school (school keys only)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        selectors.ensure_may_search_across_stacks(principal)  # before reading the body: 403 wins over 400
        data = validated(SchoolSearchInSerializer, request.data)
        stacks = selectors.stacks_for_school_search(principal, slugs=data["stacks"])
        # Only school keys get here (never a stack's own credentials): the grants always apply.
        result = search_memories(stack_ids=[s.pk for s in stacks], query=data["search"],
                                 audience=audience_for(principal))
        for stack_id in {hit.memory.stack_id for hit in result.hits}:  # one row per stack served
            record_request_access(request, stack_id=stack_id, path=AccessPath.SEARCH,
                                  memory_ids=[hit.memory.pk for hit in result.hits if hit.memory.stack_id == stack_id])
        return Response(_result_json(result, data["search"], stacks))


# --- kernle /memories/search --------------------------------------------------------------------------

def _kernle_metadata(memory: Memory) -> dict[str, Any]:
    data = memory.data or {}
    if memory.kind == "episode":
        return {"objective": data.get("objective", ""), "outcome": data.get("outcome", ""),
                "outcome_type": data.get("outcome_type"), "lessons_learned": list(data.get("lessons") or []),
                "tags": memory.tags}
    if memory.kind == "note":
        return {"note_type": data.get("note_type"), "tags": memory.tags}
    if memory.kind == "belief":
        return {"belief_type": data.get("belief_type"), "confidence": memory.confidence}
    if memory.kind == "value":
        return {"name": data.get("name", ""), "priority": data.get("priority")}
    if memory.kind == "goal":
        return {"title": data.get("title", ""), "description": data.get("description"),
                "priority": data.get("priority"), "status": data.get("status")}
    return {"tags": memory.tags}


def _kernle_content(memory: Memory) -> str:
    data = memory.data or {}
    field = {"episode": "objective", "note": "content", "belief": "statement", "value": "statement",
             "goal": "title"}.get(memory.kind, "")
    value = data.get(field)
    return value if isinstance(value, str) and value else memory.text


_KERNLE_RESPONSE = inline_serializer("KernleSearchResponse", {
    "results": inline_serializer("KernleSearchHit", {
        "id": serializers.CharField(), "memory_type": serializers.CharField(), "content": serializers.CharField(),
        "score": serializers.FloatField(), "created_at": serializers.DateTimeField(),
        "metadata": serializers.DictField(),
    }, many=True),
    "query": serializers.CharField(), "total": serializers.IntegerField(),
    "legs": _LEGS,  # an extension: the kernle client reads only `results` (docs/kernle-protocol.md §5.3)
})


class KernleSearchView(APIView):
    @extend_schema(operation_id="kernle_memories_search", tags=["kernle"], request=KernleSearchInSerializer,
                   responses={200: _KERNLE_RESPONSE, **ERRORS},
                   summary="Kernle `POST /memories/search` (docs/kernle-protocol.md §5)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        data = validated(KernleSearchInSerializer, request.data)
        query = data["search"]
        stack = selectors.stack_for_kernle_search(principal, stack_id=data.get("stack_id"))
        result = search_memories(stack_ids=[stack.pk], query=query,
                                 audience=audience_for(principal, stack_id=stack.pk))
        record_request_access(request, stack_id=stack.pk, path=AccessPath.SEARCH, via=Path.KERNLE,
                              memory_ids=[hit.memory.pk for hit in result.hits])
        results = [
            {
                "id": hit.memory.record_id,
                "memory_type": PLURAL.get(hit.memory.kind, hit.memory.kind),
                "content": _kernle_content(hit.memory),
                "score": hit.combined_score,
                "created_at": hit.memory.created_at.isoformat(),
                "metadata": _kernle_metadata(hit.memory),
            }
            for hit in result.hits
        ]
        return Response({"results": results, "query": query.text, "total": len(results), "legs": result.legs})


# --- smart ingest ------------------------------------------------------------------------------------

_INGEST_RESPONSE = inline_serializer("SmartIngestResponse", {
    "decision": serializers.CharField(help_text="create | reinforce | update | supersede"),
    "memory": serializers.DictField(), "similarity": serializers.FloatField(allow_null=True),
    "measure": serializers.CharField(), "prediction_error": serializers.FloatField(),
    "target_id": serializers.CharField(allow_null=True), "reason": serializers.CharField(),
    "forced": serializers.BooleanField(), "contradiction": serializers.BooleanField(),
    "considered": serializers.ListField(child=serializers.DictField()),
})


class SmartIngestView(APIView):
    @extend_schema(operation_id="stack_smart_ingest", tags=["search"], request=SmartIngestInSerializer,
                   responses={201: _INGEST_RESPONSE, 200: _INGEST_RESPONSE, **WRITE_ERRORS},
                   examples=[
                       OpenApiExample("A note", request_only=True, value={
                           "kind": "note", "content": "Fractions click with pizza diagrams", "tags": ["math"]}),
                       OpenApiExample("Supersede a belief", request_only=True, value={
                           "kind": "belief", "statement": "Pictures help most with fractions",
                           "supersedes": "5b0c1f4e-8a51-4c43-9a55-2f1c3f0b6a11"}),
                   ],
                   summary="Store a memory through prediction-error gating (create/reinforce/update/supersede)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        author = request_author(request, principal, path=Path.API)  # a bad X-Agent-Id: 400, nothing stored
        target = stack_for_principal(principal, stack, write=True)
        data = validated(SmartIngestInSerializer, request.data)
        supersedes = data.get("supersedes")
        decision = smart_ingest(stack=target, kind=data["kind"], payload=data["record"],
                                force_create=data["force_create"],
                                supersedes=None if supersedes is None else str(supersedes),
                                thresholds=data.get("thresholds"),
                                audience=audience_for(principal, stack_id=target.pk), author=author)
        response = Response(decision.as_json(),
                            status=status.HTTP_201_CREATED if decision.created else status.HTTP_200_OK)
        if data["deprecated_shape"]:  # `{"kind", "data": {…}}`: still served, flagged for the client to move on
            response["Deprecation"] = "true"
        return response


# --- feedback ------------------------------------------------------------------------------------------

_FEEDBACK_RESPONSE = inline_serializer("RetrievalFeedbackResponse", {
    "memory_id": serializers.UUIDField(), "action": serializers.CharField(),
    "stability_before": serializers.FloatField(), "stability_after": serializers.FloatField(),
    "retention_before": serializers.FloatField(),
})


class MemoryFeedbackView(APIView):
    @extend_schema(operation_id="memory_feedback", tags=["search"], request=RetrievalFeedbackInSerializer,
                   responses={200: _FEEDBACK_RESPONSE, **WRITE_ERRORS},
                   summary="Promote or demote a memory (explicit retrieval feedback)")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        principal = principal_of(request)
        author = request_author(request, principal, path=Path.API)
        target = stack_for_principal(principal, stack, write=True)
        data = validated(RetrievalFeedbackInSerializer, request.data)
        # Expired or hidden by its grants: 404, like every read.
        memory = selectors.memory_get(stack=target, memory_id=memory_id,
                                      audience=audience_for(principal, stack_id=target.pk))
        outcome = memory_feedback(memory=memory, action=data["action"], reason=data["reason"], author=author)
        return Response({"memory_id": str(memory.pk), "action": data["action"],
                         "stability_before": outcome.stability_before, "stability_after": outcome.stability_after,
                         "retention_before": outcome.retention_before})


urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/stacks/<str:stack>/search", StackSearchView.as_view(), name="stack-search"),
    path("api/v1/search", SchoolSearchView.as_view(), name="school-search"),
    path("memories/search", KernleSearchView.as_view(), name="kernle-memories-search"),
    path("api/v1/stacks/<str:stack>/ingest", SmartIngestView.as_view(), name="stack-smart-ingest"),
    path("api/v1/stacks/<str:stack>/memories/<str:memory_id>/feedback", MemoryFeedbackView.as_view(),
         name="memory-feedback"),
]
