"""Every request the clients make, built in one place for `MemoryHub` and `AsyncMemoryHub`.

A :class:`Call` is a request (method, path, query, body) with how to read its answer. The two
clients only send calls and apply :class:`RetryPolicy`; everything about the API (routes, bodies,
which answers are "nothing there", how a list continues to its next cursor page) lives here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, cast
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from memoryhub_client import models
from memoryhub_client.errors import error_from_response, retry_after_seconds

T = TypeVar("T")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
USER_AGENT = "memoryhub-client-python/0.1.0"


def _json(response: httpx.Response) -> Any:
    return response.json()


def _text(response: httpx.Response) -> str:
    return response.text


def _nothing(response: httpx.Response) -> None:
    return None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its successful answer is read. `none_on`: error codes that mean
    "nothing there" (the call returns None instead of raising)."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: Any = None
    parse: Callable[[httpx.Response], T] = _json
    accept: str = "application/json"
    none_on: frozenset[str] = field(default_factory=frozenset)

    def result(self, response: httpx.Response) -> T:
        """The parsed answer, or the error-contract exception for an error answer."""
        if response.is_success:
            return self.parse(response)
        error = error_from_response(response)
        if error.code in self.none_on:
            return cast(T, None)
        raise error

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"headers": {"Accept": self.accept}}
        if self.params:
            kwargs["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.body is not None:
            kwargs["json"] = self.body
        return kwargs


@dataclass(frozen=True)
class RetryPolicy:
    """429 and 503 are retried after their `Retry-After` (else exponential back-off from
    `backoff`), each wait capped at `max_backoff` seconds, at most `max_retries` times; so is a
    connection that could not be opened (nothing was sent). Both refusals store nothing, so a
    retried write is written once."""

    max_retries: int = 3
    max_backoff: float = 30.0
    backoff: float = 0.5

    def _wait(self, attempt: int, hinted: float | None) -> float:
        if hinted is not None:
            return min(hinted, self.max_backoff)
        return min(self.backoff * 2 ** attempt * (1 + random.random() / 4), self.max_backoff)

    def delay(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before retrying this answer, or None: do not retry."""
        if response.status_code not in (429, 503) or attempt >= self.max_retries:
            return None
        return self._wait(attempt, retry_after_seconds(response))

    def delay_after(self, error: httpx.TransportError, attempt: int) -> float | None:
        if not isinstance(error, httpx.ConnectError) or attempt >= self.max_retries:
            return None
        return self._wait(attempt, None)


def client_headers(api_key: str, agent_id: str | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}
    if agent_id:
        headers["X-Agent-Id"] = agent_id
    return headers


def _q(part: str) -> str:
    return quote(str(part), safe="")


def _stack(stack: str, rest: str = "") -> str:
    return f"/api/v1/stacks/{_q(stack)}/{rest}"


def _memory(stack: str, memory_id: str, rest: str = "") -> str:
    return _stack(stack, f"memories/{_q(memory_id)}" + (f"/{rest}" if rest else ""))


# --- cursor pages ----------------------------------------------------------------------------------

def page(path: str, params: Mapping[str, Any] | None = None) -> Call[dict[str, Any]]:
    """The first page of a cursor-paginated list (`{"next", "previous", "results"}`)."""
    return Call("GET", path, params=dict(params or {}))


def next_page(call: Call[dict[str, Any]], answer: dict[str, Any]) -> Call[dict[str, Any]] | None:
    """The call for the page after `answer`, from its `next` link's cursor; None on the last page."""
    link = answer.get("next")
    if not link:
        return None
    cursor = parse_qs(urlsplit(str(link)).query).get("cursor")
    if not cursor:
        return None
    return replace(call, params={**(call.params or {}), "cursor": cursor[0]})


def page_items(answer: dict[str, Any]) -> list[Any]:
    return list(answer.get("results") or [])


# --- memories --------------------------------------------------------------------------------------

def remember(stack: str, kind: str, fields: Mapping[str, Any]) -> Call[models.Memory]:
    return Call("POST", _stack(stack, "memories"), body={"kind": kind, **fields})


def batch(stack: str, items: Sequence[Mapping[str, Any]]) -> Call[models.MemoryBatchResult]:
    return Call("POST", _stack(stack, "memories/batch"), body={"items": [dict(item) for item in items]})


def get(stack: str, memory_id: str) -> Call[models.MemoryDetail]:
    return Call("GET", _memory(stack, memory_id))


def update(stack: str, memory_id: str, fields: Mapping[str, Any]) -> Call[models.Memory]:
    return Call("PATCH", _memory(stack, memory_id), body=dict(fields))


def forget(stack: str, memory_id: str, reason: str) -> Call[models.Memory]:
    return Call("POST", _memory(stack, memory_id, "forget"), body={"reason": reason})


def recover(stack: str, memory_id: str) -> Call[models.Memory]:
    return Call("POST", _memory(stack, memory_id, "recover"), body={})


def protect(stack: str, memory_id: str, protected: bool) -> Call[models.Memory]:
    return Call("POST", _memory(stack, memory_id, "protect" if protected else "unprotect"), body={})


def memories(stack: str, *, kinds: Sequence[str] | None, tags: Sequence[str] | None, forgotten: str | None,
             created_after: str | None, created_before: str | None, page_size: int | None) -> Call[dict[str, Any]]:
    return page(_stack(stack, "memories"), {
        "kind": ",".join(kinds) if kinds else None, "tags": ",".join(tags) if tags else None,
        "forgotten": forgotten, "created_after": created_after, "created_before": created_before,
        "limit": page_size})


# --- getting memory back ---------------------------------------------------------------------------

def search(stack: str, query: str, limit: int, options: Mapping[str, Any]) -> Call[models.SearchResponse]:
    body = {"query": query, "limit": limit, **{k: v for k, v in options.items() if v is not None}}
    return Call("POST", _stack(stack, "search"), body=body)


def search_school(query: str, limit: int, stacks: Sequence[str] | None,
                  options: Mapping[str, Any]) -> Call[models.SearchResponse]:
    body = {"query": query, "limit": limit, "stacks": list(stacks) if stacks else None, **options}
    return Call("POST", "/api/v1/search", body={k: v for k, v in body.items() if v is not None})


def load(stack: str, budget: int | None, item_chars: int | None, no_truncate: bool) -> Call[models.LoadResult]:
    return Call("GET", _stack(stack, "load"), params={
        "budget": budget, "item_chars": item_chars, "no_truncate": "true" if no_truncate else None})


def memory_md(stack: str) -> Call[str]:
    return Call("GET", _stack(stack, "export/memory.md"), parse=_text, accept="text/markdown")


def ingest(stack: str, kind: str, fields: Mapping[str, Any]) -> Call[models.SmartIngestResponse]:
    return Call("POST", _stack(stack, "ingest"), body={"kind": kind, **fields})


def session(stack: str, session_id: str, fields: Mapping[str, Any]) -> Call[Any]:
    return Call("POST", _stack(stack, "sessions"), body={"session_id": session_id, **fields})


# --- working state ---------------------------------------------------------------------------------

def checkpoint_save(stack: str, fields: Mapping[str, Any]) -> Call[models.Checkpoint]:
    return Call("POST", _stack(stack, "checkpoint"), body=dict(fields))


def checkpoint_latest(stack: str) -> Call[models.Checkpoint | None]:
    return Call("GET", _stack(stack, "checkpoint"), none_on=frozenset({"no_checkpoint"}))


def checkpoint_history(stack: str, page_size: int | None) -> Call[dict[str, Any]]:
    return page(_stack(stack, "checkpoint/history"), {"limit": page_size})


def _boot_map(response: httpx.Response) -> dict[str, str]:
    return {entry["key"]: entry["value"] for entry in response.json()}


def boot_config(stack: str) -> Call[dict[str, str]]:
    return Call("GET", _stack(stack, "boot-config"), parse=_boot_map)


def _boot_value(response: httpx.Response) -> str:
    return str(response.json()["value"])


def boot_get(stack: str, key: str) -> Call[str | None]:
    return Call("GET", _stack(stack, f"boot-config/{_q(key)}"), parse=_boot_value,
                none_on=frozenset({"boot_key_not_found"}))


def boot_set(stack: str, key: str, value: str) -> Call[models.BootConfigEntry]:
    return Call("PUT", _stack(stack, f"boot-config/{_q(key)}"), body={"value": value})


def boot_delete(stack: str, key: str) -> Call[None]:
    return Call("DELETE", _stack(stack, f"boot-config/{_q(key)}"), parse=_nothing)


# --- native sync -----------------------------------------------------------------------------------

def sync_push(stack: str, operations: Sequence[Mapping[str, Any]]) -> Call[models.NativePushResponse]:
    return Call("POST", _stack(stack, "sync/push"), body={"operations": [dict(op) for op in operations]})


def sync_pull(stack: str, cursor: str | None, limit: int | None) -> Call[models.NativePullResponse]:
    return Call("GET", _stack(stack, "sync/pull"), params={"cursor": cursor or None, "limit": limit})


# --- the school: stacks and keys -------------------------------------------------------------------

def stacks(page_size: int | None) -> Call[dict[str, Any]]:
    return page("/api/v1/stacks/", {"limit": page_size})


def stack_get(stack: str) -> Call[models.Stack]:
    return Call("GET", _stack(stack))


def stack_create(stack_id: str, display_name: str, kind: str) -> Call[models.Stack]:
    return Call("POST", "/api/v1/stacks/", body={"stack_id": stack_id, "display_name": display_name, "kind": kind})


def keys(page_size: int | None) -> Call[dict[str, Any]]:
    return page("/api/v1/keys/", {"limit": page_size})


def key_issue(fields: Mapping[str, Any]) -> Call[models.KeyCreated]:
    return Call("POST", "/api/v1/keys/", body={k: v for k, v in fields.items() if v is not None})


def key_revoke(key_id: str) -> Call[None]:
    return Call("DELETE", f"/api/v1/keys/{_q(key_id)}/", parse=_nothing)


def key_cycle(key_id: str) -> Call[models.KeyCycled]:
    return Call("POST", f"/api/v1/keys/{_q(key_id)}/cycle", body={})

