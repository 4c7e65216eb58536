"""`MemoryHub`, the synchronous client. Each method sends one call built in `_calls` (shared with
`AsyncMemoryHub`, whose methods have the same names, arguments and answers)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from memoryhub_client import _calls, models
from memoryhub_client._calls import DEFAULT_TIMEOUT, Call, RetryPolicy
from memoryhub_client.errors import TransportError

T = TypeVar("T")


class MemoryHub:
    """A MemoryHub API client.

    ``MemoryHub(base_url, api_key, agent_id=None)``: `agent_id` is sent as ``X-Agent-Id``, so every
    memory written names the agent in ``written_by``. A key bound to one stack reaches that stack
    only; a school key names the stack in each call. 429 and 503 answers are retried after their
    ``Retry-After`` (at most `max_retries` times, each wait capped at `max_backoff` seconds); every
    other refusal raises an :class:`~memoryhub_client.ApiError` subclass carrying the error code
    and fields. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, base_url: str, api_key: str, agent_id: str | None = None, *,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT, max_retries: int = 3, max_backoff: float = 30.0,
                 http_client: httpx.Client | None = None) -> None:
        self.retry = RetryPolicy(max_retries=max_retries, max_backoff=max_backoff)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)
        self._base_url = base_url.rstrip("/")
        self._headers = _calls.client_headers(api_key, agent_id)

    def __enter__(self) -> MemoryHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def send(self, call: Call[T]) -> T:
        """Send one call, retrying as the policy says; its answer, or the error's exception."""
        attempt = 0
        while True:
            kwargs = call.request_kwargs()
            kwargs["headers"] = {**self._headers, **kwargs["headers"]}
            try:
                response = self._http.request(call.method, self._base_url + call.path, **kwargs)
            except httpx.TransportError as error:
                wait = self.retry.delay_after(error, attempt)
                if wait is None:
                    raise TransportError(f"{call.method} {call.path}: {error!r}") from error
            else:
                wait = self.retry.delay(response, attempt)
                if wait is None:
                    return call.result(response)
            time.sleep(wait)
            attempt += 1

    def _pages(self, call: Call[dict[str, Any]] | None) -> Iterator[Any]:
        while call is not None:
            answer = self.send(call)
            yield from _calls.page_items(answer)
            call = _calls.next_page(call, answer)

    # --- memories ----------------------------------------------------------------------------------

    def remember(self, stack: str, kind: str = "note", **fields: Any) -> models.Memory:
        """Store a memory: `kind` and that kind's fields, e.g. ``remember(s, kind="note", content=…)``,
        ``remember(s, kind="belief", statement=…, confidence=0.9)``; your own fields under ``extra``."""
        return self.send(_calls.remember(stack, kind, fields))

    def batch(self, stack: str, items: Sequence[Mapping[str, Any]]) -> models.MemoryBatchResult:
        """Store many memories (each ``{"kind": …, …}``), all or nothing."""
        return self.send(_calls.batch(stack, items))

    def get(self, stack: str, memory_id: str) -> models.MemoryDetail:
        return self.send(_calls.get(stack, memory_id))

    def update(self, stack: str, memory_id: str, **fields: Any) -> models.Memory:
        """Change some fields of a memory (None resets a field)."""
        return self.send(_calls.update(stack, memory_id, fields))

    def forget(self, stack: str, memory_id: str, reason: str = "manual") -> models.Memory:
        """Forget a memory (a reversible tombstone: :meth:`recover` brings it back)."""
        return self.send(_calls.forget(stack, memory_id, reason))

    def recover(self, stack: str, memory_id: str) -> models.Memory:
        return self.send(_calls.recover(stack, memory_id))

    def protect(self, stack: str, memory_id: str, protected: bool = True) -> models.Memory:
        """Protect a memory from decay and forgetting (or lift that with ``protected=False``)."""
        return self.send(_calls.protect(stack, memory_id, protected))

    def memories(self, stack: str, *, kinds: Sequence[str] | None = None, tags: Sequence[str] | None = None,
                 forgotten: str | None = None, created_after: str | None = None, created_before: str | None = None,
                 page_size: int | None = None) -> Iterator[models.Memory]:
        """Every memory matching the filters, newest first, fetched page by page as you iterate.
        `tags`: a memory must carry all of them; `forgotten`: "exclude" (default), "include", "only"."""
        return self._pages(_calls.memories(stack, kinds=kinds, tags=tags, forgotten=forgotten,
                                           created_after=created_after, created_before=created_before,
                                           page_size=page_size))

    # --- getting memory back -----------------------------------------------------------------------

    def search(self, stack: str, query: str, limit: int = 10, **options: Any) -> models.SearchResponse:
        """Hybrid search (keywords and meaning). Each hit explains its rank: `keyword_score`,
        `semantic_score`, `fused_score`, `combined_score`, `match_type`, `retention`, `boosts`.
        Options: `kinds`, `tags` (any of), `created_after`, `created_before`, `min_similarity`."""
        return self.send(_calls.search(stack, query, limit, options))

    def search_school(self, query: str, limit: int = 10, *, stacks: Sequence[str] | None = None,
                      **options: Any) -> models.SearchResponse:
        """A school key: search across the school's stacks (`stacks`: only these), as its privacy
        grants allow; each hit names its ``stack``. Options as for :meth:`search`."""
        return self.send(_calls.search_school(query, limit, stacks, options))

    def load(self, stack: str, budget: int = 8000, *, item_chars: int | None = None,
             no_truncate: bool = False) -> models.LoadResult:
        """What fits in `budget` tokens: the checkpoint, boot config, then memories by priority."""
        return self.send(_calls.load(stack, budget, item_chars, no_truncate))

    def memory_md(self, stack: str) -> str:
        """The stack as MEMORY.md (markdown text)."""
        return self.send(_calls.memory_md(stack))

    def ingest(self, stack: str, kind: str = "note", **fields: Any) -> models.SmartIngestResponse:
        """Smart ingest: create, reinforce, update or supersede, as the stack's memories suggest."""
        return self.send(_calls.ingest(stack, kind, fields))

    def save_session(self, stack: str, session_id: str,
                     **fields: Any) -> models.SessionStored | models.SessionDryRun:
        """Store a session (``summary``, ``tool_name``, ``success``, ``tags``, …) as an episode and
        its memory card; ``dry_run=True`` returns the card and stores nothing."""
        return self.send(_calls.session(stack, session_id, fields))

    # --- working state -----------------------------------------------------------------------------

    def checkpoint_save(self, stack: str, task: str | None = None, **fields: Any) -> models.Checkpoint:
        """Save a checkpoint: `task` and ``progress``, ``next_step``, ``blocker``, ``pending``, ``context``."""
        return self.send(_calls.checkpoint_save(stack, {"task": task, **fields} if task is not None else fields))

    def checkpoint_latest(self, stack: str) -> models.Checkpoint | None:
        """The newest checkpoint, or None when none was saved."""
        return self.send(_calls.checkpoint_latest(stack))

    def checkpoint_history(self, stack: str, *, page_size: int | None = None) -> Iterator[models.Checkpoint]:
        return self._pages(_calls.checkpoint_history(stack, page_size))

    def boot_config(self, stack: str) -> dict[str, str]:
        """The stack's boot config as a dict."""
        return self.send(_calls.boot_config(stack))

    def boot_get(self, stack: str, key: str) -> str | None:
        return self.send(_calls.boot_get(stack, key))

    def boot_set(self, stack: str, key: str, value: str) -> models.BootConfigEntry:
        return self.send(_calls.boot_set(stack, key, value))

    def boot_delete(self, stack: str, key: str) -> None:
        self.send(_calls.boot_delete(stack, key))

    # --- native sync -------------------------------------------------------------------------------

    def sync_push(self, stack: str, operations: Sequence[Mapping[str, Any]]) -> models.NativePushResponse:
        """Apply up to 1,000 operations (``{"op", "kind", "record_id", "data"}``), one result each."""
        return self.send(_calls.sync_push(stack, operations))

    def sync_pull(self, stack: str, cursor: str | None = None, limit: int | None = None) -> models.NativePullResponse:
        """One page of the stack's changes after `cursor`; pass its ``next_cursor`` back while ``has_more``."""
        return self.send(_calls.sync_pull(stack, cursor, limit))

    # --- the school: stacks and keys (a school key) ------------------------------------------------

    def stacks(self, *, page_size: int | None = None) -> Iterator[models.Stack]:
        return self._pages(_calls.stacks(page_size))

    def stack(self, stack: str) -> models.Stack:
        return self.send(_calls.stack_get(stack))

    def create_stack(self, stack_id: str, display_name: str = "", kind: str = "student") -> models.Stack:
        return self.send(_calls.stack_create(stack_id, display_name, kind))

    def keys(self, *, page_size: int | None = None) -> Iterator[models.KeySummary]:
        return self._pages(_calls.keys(page_size))

    def issue_key(self, name: str = "", *, stack_id: str | None = None, read_only: bool = False,
                  expires_at: str | None = None, stack_agent: bool = False) -> models.KeyCreated:
        """A new key (its secret is in ``key``, shown once): school-wide, or bound to `stack_id`."""
        return self.send(_calls.key_issue({"name": name, "stack_id": stack_id, "read_only": read_only,
                                           "expires_at": expires_at, "stack_agent": stack_agent}))

    def revoke_key(self, key_id: str) -> None:
        self.send(_calls.key_revoke(key_id))

    def cycle_key(self, key_id: str) -> models.KeyCycled:
        return self.send(_calls.key_cycle(key_id))
