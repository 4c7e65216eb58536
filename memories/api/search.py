"""Search, smart ingest and retrieval feedback routes.

* `POST api/v1/stacks/{stack}/search` — hybrid search of one stack (native API, full scores);
* `POST api/v1/search` — a school key searching across its stacks (nothing else may);
* `POST memories/search` — the Kernle contract (kernle-protocol.md §8), no trailing slash;
* `POST api/v1/stacks/{stack}/ingest` — smart ingest (memory-science.md §5.4);
* `POST api/v1/stacks/{stack}/memories/{id}/feedback` — promote / demote (§4).

Every stack is resolved through stacks.selectors; views only parse, call one service, serialize.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.urls import URLPattern, URLResolver, path
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.principal import Principal, principal_of
from memories.models import Memory, MemoryKind
from memories.schemas import parse_timestamp
from memories.search.hybrid import (
    DEFAULT_MIN_SIMILARITY,
    MAX_LIMIT,
    MAX_QUERY_CHARS,
    SearchHit,
    SearchQuery,
    SearchResult,
    search_memories,
)
from memories.search.retrieval_feedback import DEMOTE, PROMOTE, memory_feedback
from memories.search.smart_ingest import Thresholds, smart_ingest
from memoryhub.errors import Forbidden, InvalidInput, NotFound
from stacks.models import Stack
from stacks.selectors import stack_for_principal, stacks_visible_to

ERRORS = {
    400: OpenApiResponse(description="Invalid input; `error.fields` says which field and why"),
    401: OpenApiResponse(description="Missing or invalid credential"),
    404: OpenApiResponse(description="No such stack (or memory) visible to this credential"),
    503: OpenApiResponse(description="Database, Redis or the embedding service unavailable; see Retry-After"),
}
WRITE_ERRORS = {**ERRORS, 403: OpenApiResponse(description="Read-only key"),
                409: OpenApiResponse(description="Archived stack, or a memory that is not live")}

# Kernle sends plural table names; accept singular too.
KERNLE_TYPES = {"episodes": "episode", "notes": "note", "beliefs": "belief", "values": "value", "goals": "goal"}
KERNLE_DEFAULT_KINDS = tuple(KERNLE_TYPES.values())
PLURAL = {kind: plural for plural, kind in KERNLE_TYPES.items()}


# --- request parsing --------------------------------------------------------------------------------

def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise InvalidInput("The body must be a JSON object.", fields={"non_field_errors": ["Expected an object."]})
    return request.data


def _query_text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidInput("A search needs a query.", fields={"query": ["A non-empty string is required."]})
    if len(raw) > MAX_QUERY_CHARS:
        raise InvalidInput("The query is too long.", fields={"query": [f"At most {MAX_QUERY_CHARS} characters."]})
    return raw.strip()


def _clamped_int(raw: Any, *, name: str, default: int, low: int, high: int) -> int:
    """Clamp rather than reject out-of-range numbers (kernle §8.1); refuse non-numbers."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be an integer."]})
    try:
        value = int(raw)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be an integer."]}) from None
    return max(low, min(high, value))


def _clamped_float(raw: Any, *, name: str, default: float) -> float:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be a number."]})
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be a number."]}) from None
    if value != value:  # NaN
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be a number."]})
    return max(0.0, min(1.0, value))


def _string_list(raw: Any, *, name: str, max_items: int = 50) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be a list of strings."]})
    if len(raw) > max_items:
        raise InvalidInput(f"Invalid {name}.", fields={name: [f"At most {max_items} items."]})
    return [x.strip() for x in raw if x.strip()]


def _kinds(raw: Any, *, name: str) -> tuple[str, ...]:
    kinds = []
    for value in _string_list(raw, name=name):
        lowered = value.lower()
        kind = KERNLE_TYPES.get(lowered, lowered)
        if kind not in MemoryKind.values:
            raise InvalidInput(f"Unknown memory kind {value!r}.",
                               fields={name: [f"Must be among: {', '.join(MemoryKind.values)}."]})
        kinds.append(kind)
    return tuple(dict.fromkeys(kinds))


def _timestamp(raw: Any, *, name: str) -> datetime | None:
    if raw in (None, ""):
        return None
    try:
        value = parse_timestamp(raw)
    except Exception:  # any unparsable value is the caller's error, never a 500
        value = None
    if value is None:
        raise InvalidInput(f"Invalid {name}.", fields={name: ["Must be an ISO 8601 timestamp."]})
    return value


def _search_query(body: dict[str, Any], *, kinds_field: str = "kinds",
                  default_kinds: tuple[str, ...] = ()) -> SearchQuery:
    kinds = _kinds(body.get(kinds_field), name=kinds_field) or default_kinds
    return SearchQuery(
        text=_query_text(body.get("query")),
        limit=_clamped_int(body.get("limit"), name="limit", default=10, low=1, high=MAX_LIMIT),
        kinds=kinds,
        tags=tuple(_string_list(body.get("tags"), name="tags")),
        created_after=_timestamp(body.get("created_after"), name="created_after"),
        created_before=_timestamp(body.get("created_before"), name="created_before"),
        min_similarity=_clamped_float(body.get("min_similarity"), name="min_similarity",
                                      default=DEFAULT_MIN_SIMILARITY),
    )


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
    }


_HIT = inline_serializer("SearchHit", {
    "id": serializers.UUIDField(), "record_id": serializers.CharField(), "stack": serializers.CharField(),
    "kind": serializers.CharField(), "text": serializers.CharField(),
    "tags": serializers.ListField(child=serializers.CharField()), "confidence": serializers.FloatField(),
    "created_at": serializers.DateTimeField(), "score": serializers.FloatField(),
    "combined_score": serializers.FloatField(), "fused_score": serializers.FloatField(),
    "keyword_score": serializers.FloatField(allow_null=True), "semantic_score": serializers.FloatField(allow_null=True),
    "match_type": serializers.CharField(help_text="keyword | semantic | both"), "retention": serializers.FloatField(),
})
_SEARCH_RESPONSE = inline_serializer("SearchResponse", {
    "results": _HIT.__class__(many=True), "query": serializers.CharField(), "total": serializers.IntegerField(),
    "method": serializers.CharField(), "embedding_model": serializers.CharField(),
    "took_ms": serializers.FloatField(),
    "timings_ms": serializers.DictField(child=serializers.FloatField(), help_text="keyword, embed, vector legs"),
})
_SEARCH_REQUEST = inline_serializer("SearchRequest", {
    "query": serializers.CharField(max_length=MAX_QUERY_CHARS),
    "limit": serializers.IntegerField(required=False, help_text="Clamped to 1..100"),
    "kinds": serializers.ListField(child=serializers.CharField(), required=False,
                                   help_text="Memory kinds: " + ", ".join(MemoryKind.values)),
    "tags": serializers.ListField(child=serializers.CharField(), required=False, help_text="Any of these tags"),
    "created_after": serializers.DateTimeField(required=False),
    "created_before": serializers.DateTimeField(required=False),
    "min_similarity": serializers.FloatField(required=False, help_text="Semantic leg only; clamped to 0..1"),
})


# --- native search ----------------------------------------------------------------------------------

class StackSearchView(APIView):
    @extend_schema(operation_id="stack_search", tags=["search"], request=_SEARCH_REQUEST,
                   responses={200: _SEARCH_RESPONSE, **ERRORS},
                   summary="Hybrid (full-text + vector, RRF) search of one stack")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        query = _search_query(_body(request))
        result = search_memories(stack_ids=[target.pk], query=query)
        return Response(_result_json(result, query, [target]))


_CROSS_REQUEST = inline_serializer("CrossStackSearchRequest", {
    "query": serializers.CharField(max_length=MAX_QUERY_CHARS),
    "stacks": serializers.ListField(child=serializers.CharField(), required=False,
                                    help_text="Slugs to search; default: every stack of the school"),
    "limit": serializers.IntegerField(required=False), "kinds": serializers.ListField(required=False),
    "tags": serializers.ListField(required=False), "min_similarity": serializers.FloatField(required=False),
})


class SchoolSearchView(APIView):
    @extend_schema(operation_id="school_search", tags=["search"], request=_CROSS_REQUEST,
                   responses={200: _SEARCH_RESPONSE, 403: OpenApiResponse(description="Not a school key"), **ERRORS},
                   summary="Search across the stacks of a school (school keys only)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        if principal.api_key is None or principal.bound_stack_id is not None:
            raise Forbidden("Only a school (organization) key may search across stacks.", code="school_key_required")
        body = _body(request)
        query = _search_query(body)
        slugs = _string_list(body.get("stacks"), name="stacks", max_items=1000)
        stacks = stacks_visible_to(principal)
        if slugs:
            stacks = stacks.filter(slug__in=slugs)
        found = list(stacks.only("pk", "slug"))
        if slugs and len(found) != len(set(slugs)):
            raise NotFound("Stack not found.", code="stack_not_found")
        result = search_memories(stack_ids=[s.pk for s in found], query=query)
        return Response(_result_json(result, query, found))


# --- kernle /memories/search --------------------------------------------------------------------------

def kernle_search_stack(principal: Principal, stack_id: Any) -> Stack:
    """kernle-protocol.md §8.3: body `stack_id`, then the credential's bound stack, then the most
    recently pushed stack the caller can see. None → 404 "No stack to search" (the client then
    falls back to its local search instead of showing an empty answer)."""
    if stack_id not in (None, ""):
        if not isinstance(stack_id, str):
            raise InvalidInput("Invalid stack_id.", fields={"stack_id": ["Must be a string."]})
        return stack_for_principal(principal, stack_id)
    visible = stacks_visible_to(principal)
    if principal.bound_stack_id is not None:
        bound = visible.filter(pk=principal.bound_stack_id).first()
        if bound is not None:
            return bound
    latest = visible.filter(last_sync_at__isnull=False).order_by("-last_sync_at", "-pk").first()
    if latest is None:
        raise NotFound("No stack to search", code="no_stack")
    return latest


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


_KERNLE_REQUEST = inline_serializer("KernleSearchRequest", {
    "query": serializers.CharField(max_length=MAX_QUERY_CHARS),
    "limit": serializers.IntegerField(required=False, help_text="Clamped to 1..100"),
    "memory_types": serializers.ListField(child=serializers.CharField(), required=False),
    "stack_id": serializers.CharField(required=False, help_text="Extension: which stack (else bound / latest)"),
})
_KERNLE_RESPONSE = inline_serializer("KernleSearchResponse", {
    "results": inline_serializer("KernleSearchHit", {
        "id": serializers.CharField(), "memory_type": serializers.CharField(), "content": serializers.CharField(),
        "score": serializers.FloatField(), "created_at": serializers.DateTimeField(),
        "metadata": serializers.DictField(),
    }, many=True),
    "query": serializers.CharField(), "total": serializers.IntegerField(),
})


class KernleSearchView(APIView):
    @extend_schema(operation_id="kernle_memories_search", tags=["kernle"], request=_KERNLE_REQUEST,
                   responses={200: _KERNLE_RESPONSE, **ERRORS},
                   summary="Kernle `POST /memories/search` (kernle-protocol.md §8)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        body = _body(request)
        query = _search_query(body, kinds_field="memory_types", default_kinds=KERNLE_DEFAULT_KINDS)
        stack = kernle_search_stack(principal, body.get("stack_id"))
        result = search_memories(stack_ids=[stack.pk], query=query)
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
        return Response({"results": results, "query": query.text, "total": len(results)})


# --- smart ingest ------------------------------------------------------------------------------------

_INGEST_REQUEST = inline_serializer("SmartIngestRequest", {
    "kind": serializers.CharField(help_text="Memory kind: " + ", ".join(MemoryKind.values)),
    "data": serializers.DictField(help_text="The memory's fields, as for creating one"),
    "force_create": serializers.BooleanField(required=False, default=False),
    "supersedes": serializers.UUIDField(required=False, help_text="Explicitly supersede this memory"),
    "thresholds": serializers.DictField(child=serializers.FloatField(), required=False,
                                        help_text="near_identical, update, correction (cosine; clamped 0..1)"),
})
_INGEST_RESPONSE = inline_serializer("SmartIngestResponse", {
    "decision": serializers.CharField(help_text="create | reinforce | update | supersede"),
    "memory": serializers.DictField(), "similarity": serializers.FloatField(allow_null=True),
    "measure": serializers.CharField(), "prediction_error": serializers.FloatField(),
    "target_id": serializers.CharField(allow_null=True), "reason": serializers.CharField(),
    "forced": serializers.BooleanField(), "contradiction": serializers.BooleanField(),
    "considered": serializers.ListField(child=serializers.DictField()),
})


class SmartIngestView(APIView):
    @extend_schema(operation_id="stack_smart_ingest", tags=["search"], request=_INGEST_REQUEST,
                   responses={201: _INGEST_RESPONSE, 200: _INGEST_RESPONSE, **WRITE_ERRORS},
                   summary="Store a memory through prediction-error gating (create/reinforce/update/supersede)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        body = _body(request)
        kind = body.get("kind")
        if not isinstance(kind, str) or kind not in MemoryKind.values:
            raise InvalidInput("Invalid kind.", fields={"kind": [f"Must be one of: {', '.join(MemoryKind.values)}."]})
        payload = body.get("data")
        if not isinstance(payload, dict):
            raise InvalidInput("Invalid data.", fields={"data": ["Must be an object."]})
        force_create = body.get("force_create", False)
        if not isinstance(force_create, bool):
            raise InvalidInput("Invalid force_create.", fields={"force_create": ["Must be a boolean."]})
        supersedes = body.get("supersedes")
        if supersedes is not None and not isinstance(supersedes, str):
            raise InvalidInput("Invalid supersedes.", fields={"supersedes": ["Must be a memory id."]})
        decision = smart_ingest(stack=target, kind=kind, payload=payload, force_create=force_create,
                                supersedes=supersedes, thresholds=Thresholds.from_request(body.get("thresholds")))
        memory = decision.memory
        created = decision.decision in ("create", "supersede")
        return Response(
            {
                "decision": decision.decision,
                "memory": {"id": str(memory.pk), "record_id": memory.record_id, "kind": memory.kind,
                           "text": memory.text, "version": memory.version},
                "similarity": None if decision.similarity is None else round(decision.similarity, 6),
                "measure": decision.measure,
                "prediction_error": decision.prediction_error,
                "target_id": decision.target_id,
                "reason": decision.reason,
                "forced": decision.forced,
                "contradiction": decision.contradiction,
                "considered": decision.considered,
            },
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


# --- feedback ------------------------------------------------------------------------------------------

_FEEDBACK_REQUEST = inline_serializer("RetrievalFeedbackRequest", {
    "action": serializers.CharField(help_text="promote | demote"),
    "reason": serializers.CharField(required=False, allow_blank=True),
})
_FEEDBACK_RESPONSE = inline_serializer("RetrievalFeedbackResponse", {
    "memory_id": serializers.UUIDField(), "action": serializers.CharField(),
    "stability_before": serializers.FloatField(), "stability_after": serializers.FloatField(),
    "retention_before": serializers.FloatField(),
})


class MemoryFeedbackView(APIView):
    @extend_schema(operation_id="memory_feedback", tags=["search"], request=_FEEDBACK_REQUEST,
                   responses={200: _FEEDBACK_RESPONSE, **WRITE_ERRORS},
                   summary="Promote or demote a memory (explicit retrieval feedback)")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        body = _body(request)
        action = body.get("action")
        if action not in (PROMOTE, DEMOTE):
            raise InvalidInput("Invalid action.", fields={"action": ["Must be 'promote' or 'demote'."]})
        reason = body.get("reason") or ""
        if not isinstance(reason, str):
            raise InvalidInput("Invalid reason.", fields={"reason": ["Must be a string."]})
        try:
            pk = uuid.UUID(memory_id)
        except ValueError:
            raise NotFound("Memory not found.", code="memory_not_found") from None
        memory = Memory.objects.filter(stack=target, pk=pk, deleted_at__isnull=True).first()
        if memory is None:
            raise NotFound("Memory not found.", code="memory_not_found")
        outcome = memory_feedback(memory=memory, action=action, reason=reason)
        return Response({"memory_id": str(memory.pk), "action": action,
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
