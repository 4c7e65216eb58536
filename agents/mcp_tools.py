"""The MCP tools: each parses its arguments, calls the service or selector its REST route calls, and
returns JSON (docs/architecture.md §12).

Thin on purpose, like the REST views: the stack comes from `stacks.selectors.stack_for_principal`
(`write=True` for a write, which refuses read-only keys with 403 `read_only_key` and archived stacks
with 409), the privacy-grants audience from `memories.privacy.grants.audience_for`, the arguments are read
with the REST routes' own request serializers (the same field rules and messages), and a refusal is
the REST error contract's `code`, `message` and `fields` (memoryhub.errors), carried in an MCP tool
error. Everything here is synchronous and runs on a worker thread (agents/mcp_server.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from jsonschema import Draft202012Validator
from rest_framework.utils.encoders import JSONEncoder

from accounts.authors import Author, Path, agent_label, author_of
from accounts.principal import Principal
from agents.selectors import stack_stats
from memories import selectors, services
from memories.models import MemoryKind
from memories.privacy.grants import Audience, audience_for
from memories.reads.access_log import AccessPath, access_batch, batch_reader, record_access
from memories.reads.export import stack_memory_md
from memories.reads.load import MAX_ITEM_CHARS, stack_load
from memories.records.cleaning import clean_json
from memories.records.fields import kind_fields
from memories.search.hybrid import search_memories
from memories.search.smart_ingest import smart_ingest
from memories.serializers import validated
from memories.serializers.memories import (
    BootConfigEntrySerializer,
    BootConfigValueSerializer,
    CheckpointInSerializer,
    CheckpointSerializer,
    ForgetSerializer,
    LoadQuerySerializer,
    MemorySerializer,
)
from memories.serializers.search import SearchInSerializer, SmartIngestInSerializer
from memoryhub.errors import InvalidInput, NotFound, api_exception_handler
from stacks.models import Stack
from stacks.selectors import stack_for_principal
from teleport.selectors import snapshot_of, snapshots_of
from teleport.serializers import snapshot_view

Payload = dict[str, Any]


@dataclass(frozen=True)
class AgentTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    write: bool
    run: Callable[..., Payload]  # (principal, arguments), plus the base URL when `links`
    # Tools answering with links (teleport) also get the URL the caller reached MemoryHub at.
    links: bool = False
    # Tools that write memories also get the call's author (`author=`, docs/privacy.md "Provenance").
    authored: bool = False


# --- arguments ------------------------------------------------------------------------------------

STACK = {"type": "string", "minLength": 1, "maxLength": 100,
         "description": "The stack (student or agent) id. Optional with a key bound to one stack (that stack is "
                        "used); required with a school key."}
MEMORY_ID = {"type": "string", "minLength": 1, "maxLength": 64, "description": "The memory's id (a UUID)."}
KINDS = list(MemoryKind.values)


def _schema(properties: dict[str, Any], required: tuple[str, ...] = (), *, open_: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {"stack": STACK, **properties},
                              "additionalProperties": open_}
    if required:
        schema["required"] = list(required)
    return schema


_JSON_TYPES = {"string": "string", "number": "number", "integer": "integer", "boolean": "boolean",
               "string_list": "array", "object_list": "array", "timestamp": "string"}


def _memory_fields() -> dict[str, Any]:
    """Every field some memory kind has, typed (the kind's own schema checks the rest, as on REST)."""
    fields: dict[str, Any] = {}
    for kind in KINDS:
        for spec in kind_fields(kind).fields:
            if spec.name not in fields and spec.type in _JSON_TYPES:
                fields[spec.name] = {"type": [_JSON_TYPES[spec.type], "null"]}
    return fields


def _arguments(tool: AgentTool, arguments: Payload) -> Payload:
    """The arguments checked against the tool's input schema: a 400 `invalid` naming each bad one."""
    errors: dict[str, list[str]] = {}
    for error in Draft202012Validator(tool.input_schema).iter_errors(arguments):
        where = ".".join(str(part) for part in error.absolute_path) or "non_field_errors"
        errors.setdefault(where, []).append(error.message)
    if errors:
        raise InvalidInput("The request is invalid.", fields=errors)
    return arguments


def _reach(principal: Principal, args: Payload, *, write: bool = False) -> tuple[Stack, Audience | None]:
    """The stack the call names (or the key's own), decided by the one access decision, and the
    caller's privacy-grants audience on it (None: the stack's own credentials)."""
    slug = args.get("stack")
    if not slug:
        if principal.bound_stack_id is None:
            raise InvalidInput("Name the stack: a school key reaches every stack of its school.",
                               fields={"stack": ["This field is required with a school key."]})
        slug = Stack.objects.only("slug").get(pk=principal.bound_stack_id).slug
    target = stack_for_principal(principal, slug, write=write)
    return target, audience_for(principal, stack_id=target.pk)


def _body(args: Payload) -> Payload:
    """The arguments as the REST body: everything but the stack, which REST takes from the URL."""
    return {key: value for key, value in args.items() if key != "stack"}


def _memory(principal: Principal, args: Payload, *, write: bool = False) -> Any:
    target, audience = _reach(principal, args, write=write)
    return selectors.memory_get(stack=target, memory_id=args["memory_id"], audience=audience)


def _served(principal: Principal, stack_id: int, memory_ids: list[Any]) -> None:
    """The access log's row of a tool that returned memory content (written when the call ends), read
    by the call's author (`call_tool`)."""
    record_access(stack_id=stack_id, author=batch_reader() or author_of(principal, path=Path.MCP),
                  path=AccessPath.MCP, memory_ids=memory_ids)


# --- the tools ------------------------------------------------------------------------------------

def _search(principal: Principal, args: Payload) -> Payload:
    target, audience = _reach(principal, args)
    query = validated(SearchInSerializer, _body(args))["search"]
    result = search_memories(stack_ids=[target.pk], query=query, audience=audience)
    _served(principal, target.pk, [hit.memory.pk for hit in result.hits])
    return {
        "stack": target.slug,
        "query": query.text,
        "results": [{"id": str(hit.memory.pk), "record_id": hit.memory.record_id, "kind": hit.memory.kind,
                     "text": hit.memory.text, "tags": hit.memory.tags, "score": hit.combined_score,
                     "match_type": hit.match_type, "created_at": hit.memory.created_at}
                    for hit in result.hits],
        "total": len(result.hits),
        "legs": result.legs,
    }


def _load(principal: Principal, args: Payload) -> Payload:
    target, audience = _reach(principal, args)
    query = validated(LoadQuerySerializer, _body(args))
    item_chars = MAX_ITEM_CHARS if query.get("no_truncate") else query.get("item_chars")
    result = stack_load(stack=target, budget=query.get("budget"), item_chars=item_chars, audience=audience)
    _served(principal, target.pk, list(result.served_ids()))
    return {"stack": target.slug, **result.as_json()}


def _remember(principal: Principal, args: Payload, *, author: Author) -> Payload:
    target, audience = _reach(principal, args, write=True)
    data = validated(SmartIngestInSerializer, {"kind": MemoryKind.NOTE, **_body(args)})
    supersedes = data.get("supersedes")
    decision = smart_ingest(stack=target, kind=data["kind"], payload=data["record"],
                            force_create=data["force_create"],
                            supersedes=None if supersedes is None else str(supersedes),
                            thresholds=data.get("thresholds"), audience=audience, author=author)
    return decision.as_json()


def _get(principal: Principal, args: Payload) -> Payload:
    memory = _memory(principal, args)
    _served(principal, memory.stack_id, [memory.pk])
    return dict(MemorySerializer(memory).data)


def _forget(principal: Principal, args: Payload, *, author: Author) -> Payload:
    memory = _memory(principal, args, write=True)
    reason = validated(ForgetSerializer, clean_json({"reason": args.get("reason", "manual")}))["reason"]
    return dict(MemorySerializer(services.memory_forget(memory=memory, reason=reason, author=author)).data)


def _recover(principal: Principal, args: Payload, *, author: Author) -> Payload:
    memory = _memory(principal, args, write=True)
    return dict(MemorySerializer(services.memory_recover(memory=memory, author=author)).data)


def _checkpoint_save(principal: Principal, args: Payload) -> Payload:
    target, _ = _reach(principal, args, write=True)
    data = validated(CheckpointInSerializer, clean_json(_body(args)))
    checkpoint = services.checkpoint_save(stack=target, checkpoint=services.CheckpointInput(
        task=data["task"], progress=data.get("progress") or "", next_step=data.get("next_step") or "",
        blocker=data.get("blocker") or "", context=data["context"], pending=data["pending"],
    ))
    return dict(CheckpointSerializer(checkpoint).data)


def _checkpoint_load(principal: Principal, args: Payload) -> Payload:
    target, _ = _reach(principal, args)
    checkpoint = selectors.checkpoint_latest(stack=target)
    if checkpoint is None:
        raise NotFound("No checkpoint saved yet.", code="no_checkpoint")
    return dict(CheckpointSerializer(checkpoint).data)


def _boot_get(principal: Principal, args: Payload) -> Payload:
    target, _ = _reach(principal, args)
    if args.get("key") is not None:
        return dict(BootConfigEntrySerializer(selectors.boot_config_get(stack=target, key=args["key"])).data)
    entries = selectors.boot_config_entries(stack=target)
    return {"stack": target.slug, "boot_config": BootConfigEntrySerializer(entries, many=True).data}


def _boot_set(principal: Principal, args: Payload) -> Payload:
    target, _ = _reach(principal, args, write=True)
    value = validated(BootConfigValueSerializer, clean_json({"value": args["value"]}))["value"]
    return dict(BootConfigEntrySerializer(services.boot_config_set(stack=target, key=args["key"], value=value)).data)


def _memory_md(principal: Principal, args: Payload) -> Payload:
    target, audience = _reach(principal, args)
    served: list[Any] = []
    markdown = stack_memory_md(stack=target, audience=audience, served=served)
    _served(principal, target.pk, served)
    return {"stack": target.slug, "markdown": markdown}


def _stack_stats(principal: Principal, args: Payload) -> Payload:
    target, audience = _reach(principal, args)
    return stack_stats(stack=target, audience=audience)


def _teleport_pack(principal: Principal, args: Payload, base_url: str) -> Payload:
    """Where to upload the workspace: the REST route (a tar.gz is binary, not a tool argument)."""
    target, _ = _reach(principal, args, write=True)
    query = {key: args[key] for key in ("name", "expires_in_days") if args.get(key) is not None}
    url = f"{base_url}/api/v1/stacks/{quote(target.slug, safe='')}/snapshots"
    url += f"?{urlencode(query)}" if query else ""
    return {
        "stack": target.slug,
        "upload": {"method": "POST", "url": url,
                   "headers": {"Authorization": "Bearer <the same API key>", "Content-Type": "application/gzip"},
                   "max_bytes": settings.TELEPORT_MAX_BYTES},
        "example": f"tar czf - -C <workspace> . | curl -s -X POST '{url}' -H \"Authorization: Bearer $MEMORYHUB_KEY\" "
                   "-H 'Content-Type: application/gzip' --data-binary @-",
        "note": "Secret files (.env, private keys, credentials) are stripped and listed in the answer's `stripped`.",
    }


def _teleport_restore(principal: Principal, args: Payload, base_url: str) -> Payload:
    """Where to download a snapshot of the stack (one named, else the newest), or what a code redeems at."""
    if args.get("code"):
        # Not checked here: checking a one-time code would use it up. The download says 404 if it is
        # unknown, expired, used or another school's.
        return {"download": {"method": "POST", "url": f"{base_url}/api/v1/teleport/download",
                             "headers": {"Authorization": "Bearer <the same API key>",
                                         "Content-Type": "application/json"},
                             "json": {"code": args["code"]}}}
    target, _ = _reach(principal, args)
    snapshot = snapshot_of(target, args["snapshot_id"]) if args.get("snapshot_id") else snapshots_of(target).first()
    if snapshot is None:
        raise NotFound("Snapshot not found.", code="snapshot_not_found")
    url = f"{base_url}/api/v1/stacks/{quote(target.slug, safe='')}/snapshots/{snapshot.pk}/archive"
    return {"stack": target.slug, "snapshot": snapshot_view(snapshot),
            "download": {"method": "GET", "url": url, "headers": {"Authorization": "Bearer <the same API key>"}},
            "note": "Extract it safely (no links, nothing outside the target): docs/teleport.md §5."}


_SEARCH_KINDS = {"type": ["array", "null"], "items": {"type": "string", "enum": KINDS}, "maxItems": 20,
                 "description": "Only these memory kinds (default: all)."}

TOOLS: tuple[AgentTool, ...] = (
    AgentTool(
        "memory_search",
        "Search the stack's memories by meaning and by words (hybrid full-text + vector search). Returns the best "
        "matches with their id, kind, text, tags and score. Forgotten memories are not searched.",
        _schema({"query": {"type": "string", "minLength": 1, "maxLength": 2000, "description": "What to look for."},
                 "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": 100,
                           "description": "How many results (default 10)."},
                 "kinds": _SEARCH_KINDS,
                 "tags": {"type": ["array", "null"], "items": {"type": "string"}, "maxItems": 20,
                          "description": "Only memories carrying any of these tags."},
                 "created_after": {"type": ["string", "null"], "format": "date-time"},
                 "created_before": {"type": ["string", "null"], "format": "date-time"}},
                ("query",)),
        False, _search),
    AgentTool(
        "memory_load",
        "Load what an agent should know at the start of a session, within a token budget: the latest checkpoint, "
        "the boot config, then the most important memories by priority (values and beliefs first).",
        _schema({"budget": {"type": ["integer", "null"], "description": "Token budget, 100-50000 (others are "
                                                                         "refused); default 8000."},
                 "item_chars": {"type": ["integer", "null"], "description": "Longest text per memory before it is "
                                                                            "truncated at a word."},
                 "no_truncate": {"type": ["boolean", "null"], "description": "Never truncate a memory's text."}}),
        False, _load),
    AgentTool(
        "memory_remember",
        "Remember something: stores a memory through smart ingest, which reinforces or updates a near-identical "
        "memory instead of duplicating it. Give `kind` (default `note`) and the kind's fields: a note's `content`, "
        "a belief's `statement`, an episode's `objective` and `outcome`, a goal's `title`, a value's `name` and "
        "`statement`; `tags` for any. Secrets and personal data are redacted before anything is stored; a secret "
        "that cannot be made safe (a private key, a bearer credential) is refused and nothing is stored.",
        _schema({"kind": {"type": "string", "enum": KINDS, "default": MemoryKind.NOTE},
                 **_memory_fields(),
                 "force_create": {"type": ["boolean", "null"], "description": "Store a new memory whatever the "
                                                                              "gate would decide."},
                 "supersedes": {"type": ["string", "null"], "description": "The id of a memory this one replaces "
                                                                           "(it is forgotten)."},
                 "thresholds": {"type": ["object", "null"]}},
                open_=True),
        True, _remember, authored=True),
    AgentTool(
        "memory_get",
        "Read one memory by id, with all its fields (forgotten ones too).",
        _schema({"memory_id": MEMORY_ID}, ("memory_id",)),
        False, _get),
    AgentTool(
        "memory_forget",
        "Forget a memory: a reversible tombstone (memory_recover undoes it). Protected memories cannot be forgotten.",
        _schema({"memory_id": MEMORY_ID,
                 "reason": {"type": "string", "maxLength": 64, "description": "Why (default `manual`)."}},
                ("memory_id",)),
        True, _forget, authored=True),
    AgentTool(
        "memory_recover",
        "Recover a forgotten memory (it comes back weak and strengthens with use).",
        _schema({"memory_id": MEMORY_ID}, ("memory_id",)),
        True, _recover, authored=True),
    AgentTool(
        "checkpoint_save",
        "Save a checkpoint of the current work (task, progress, next step, blocker) so the next session can resume. "
        "History is kept; the newest is the checkpoint.",
        _schema({"task": {"type": "string", "minLength": 1, "maxLength": 500, "description": "What you are doing."},
                 "progress": {"type": ["string", "null"]}, "next_step": {"type": ["string", "null"]},
                 "blocker": {"type": ["string", "null"]},
                 "pending": {"type": ["array", "null"], "items": {"type": "string"},
                             "description": "What is still to do, in order."},
                 "context": {"type": ["object", "string", "null"],
                             "description": "Any JSON object of your own, or a text."}},
                ("task",)),
        True, _checkpoint_save),
    AgentTool(
        "checkpoint_load",
        "Read the latest checkpoint, with warnings when it is stale or says nothing specific.",
        _schema({}), False, _checkpoint_load),
    AgentTool(
        "boot_get",
        "Read the stack's boot config (small key/value settings an agent reads at start): one `key`, or all.",
        _schema({"key": {"type": ["string", "null"], "minLength": 1, "maxLength": 100}}), False, _boot_get),
    AgentTool(
        "boot_set",
        "Set one boot config key to a string value.",
        _schema({"key": {"type": "string", "minLength": 1, "maxLength": 100}, "value": {"type": "string"}},
                ("key", "value")),
        True, _boot_set),
    AgentTool(
        "memory_md",
        "Export the stack's memories as MEMORY.md (markdown, grouped by kind), for agents that read a file.",
        _schema({}), False, _memory_md),
    AgentTool(
        "teleport_pack",
        "Get the link to upload a snapshot of your workspace (a tar.gz) so another agent of your school can restore "
        "it. The upload itself is an HTTP POST of the archive with your key (see `example`).",
        _schema({"name": {"type": ["string", "null"], "maxLength": 100, "description": "A label for the snapshot."},
                 "expires_in_days": {"type": ["integer", "null"], "minimum": 1, "maximum": 30}}),
        True, _teleport_pack, links=True),
    AgentTool(
        "teleport_restore",
        "Get the link to download a workspace snapshot: the stack's newest, one by `snapshot_id`, or the one a "
        "teleport `code` (tlp_…) from another agent of your school names.",
        _schema({"snapshot_id": {"type": ["string", "null"], "maxLength": 64},
                 "code": {"type": ["string", "null"], "maxLength": 100}}),
        False, _teleport_restore, links=True),
    AgentTool(
        "stack_stats",
        "How much the stack holds: live memories by kind (count and bytes), forgotten ones, storage used, last write.",
        _schema({}), False, _stack_stats),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}


def tools_for(principal: Principal) -> list[AgentTool]:
    """The tools a caller is offered: a read-only key is not offered the write tools (calling one anyway
    is refused like on REST, 403 `read_only_key`)."""
    return [tool for tool in TOOLS if not (tool.write and principal.read_only)]


@dataclass(frozen=True)
class ToolOutcome:
    payload: Payload
    is_error: bool

    def text(self) -> str:
        """What the model reads: MEMORY.md as markdown, anything else as JSON."""
        if not self.is_error and set(self.payload) == {"stack", "markdown"}:
            return str(self.payload["markdown"])
        return json.dumps(self.payload, ensure_ascii=False)


def call_tool(principal: Principal, name: str, arguments: Payload | None, base_url: str = "",
              client_name: Any = None) -> ToolOutcome:
    """Run one tool for `principal`. A refusal is the REST error contract's body (`error.code`,
    `error.message`, `error.fields`) — the same mapping as the API's, so a 422 `redaction_refused`
    there is `redaction_refused` here — never an exception out of this function.

    `client_name`: the MCP client's `clientInfo.name` (agents/mcp_server.py), the agent label of
    what the call writes (docs/privacy.md "Provenance"). It is checked like `X-Agent-Id` and a bad
    one refused, not cut: a tool call from a client named with more than 100 characters or control
    characters is a 400 `invalid` naming `clientInfo.name`, and nothing is stored."""
    try:
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            raise NotFound(f"No tool named {name!r}.", code="unknown_tool")
        author = author_of(principal, path=Path.MCP, agent=agent_label(client_name, field="clientInfo.name"))
        args = _arguments(tool, dict(arguments or {}))
        extra: dict[str, Any] = {"author": author} if tool.authored else {}
        with access_batch(reader=author):  # the access log's rows are written once the answer is built
            payload = tool.run(principal, args, base_url) if tool.links else tool.run(principal, args, **extra)
        return ToolOutcome(json.loads(json.dumps(payload, cls=JSONEncoder)), is_error=False)
    except Exception as exc:  # every failure becomes the contract's error, as on REST
        return ToolOutcome(error_payload(exc), is_error=True)


def error_payload(exc: Exception) -> Payload:
    """The REST error contract's body and HTTP status for `exc` (memoryhub.errors.api_exception_handler,
    which also logs what is not the caller's fault, by type only)."""
    response = api_exception_handler(exc, {})
    body = dict(response.data or {})
    body["status"] = response.status_code
    return body
