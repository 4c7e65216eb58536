"""`MemoryHubStore`: LangGraph's long-term memory (`BaseStore`) kept in a MemoryHub stack.

``MemoryHubStore(hub, stack="ada")`` with a :class:`~memoryhub_client.MemoryHub`; install the
extra ``memoryhub-client[langgraph]``. Each item ``(namespace, key) → value`` is one note in the
stack, so it gets MemoryHub's redaction, privacy grants, decay, access log and dashboard:

* the note's text is what search reads: the item's fields named by ``index`` (default: every
  top-level text field of the value; the value as JSON when it has none);
* the item itself (namespace, key, value) is kept under the note's ``extra["langgraph"]``;
* tags place it: ``langgraph`` on every item, one ``lg:ns:…`` per namespace prefix (so a search
  of a prefix is a tag filter) and one ``lg:key:…`` for its namespace and key (a get is a lookup).

``search`` with a ``query`` is MemoryHub's hybrid search (keywords and meaning; ``score`` is the
hit's score); without one, the newest items of the prefix. ``filter`` is applied to the values
as LangGraph's in-memory store does (equality, ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``,
``$lte``). ``delete`` forgets the note (MemoryHub's reversible tombstone). TTLs are not supported:
MemoryHub's own retention and decay apply. ``abatch`` runs ``batch`` in a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from itertools import islice
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from memoryhub_client.client import MemoryHub
from memoryhub_client.models import Memory

MARKER_TAG = "langgraph"
_TEXT_LIMIT = 20000  # a note's content, at most (the API refuses more)
_SEARCH_LIMIT = 100  # the search API's largest page


def _digest(parts: Iterable[str]) -> str:
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:24]


def namespace_tag(prefix: tuple[str, ...]) -> str:
    """The tag every item under `prefix` carries (the marker tag for the empty prefix)."""
    return f"lg:ns:{_digest(prefix)}" if prefix else MARKER_TAG


def key_tag(namespace: tuple[str, ...], key: str) -> str:
    return "lg:key:" + _digest([*namespace, "\x00", key])


def _tags(namespace: tuple[str, ...], key: str) -> list[str]:
    return [MARKER_TAG, *(namespace_tag(namespace[:n]) for n in range(1, len(namespace) + 1)),
            key_tag(namespace, key)]


def _text(key: str, value: dict[str, Any], index: list[str] | None) -> str:
    """What search reads for the item: the `index` fields (dotted paths), else its top-level texts."""
    parts = [_at(value, path) for path in index] if index else [v for v in value.values() if isinstance(v, str)]
    texts = [part if isinstance(part, str) else json.dumps(part, sort_keys=True, default=str)
             for part in parts if part not in (None, "")]
    text = "\n".join(texts) or json.dumps(value, sort_keys=True, default=str)
    return (text if text.strip() else key)[:_TEXT_LIMIT]


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        if part == "$":
            continue
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _stored(memory: Memory) -> dict[str, Any] | None:
    extra = memory.get("extra")
    item = extra.get("langgraph") if isinstance(extra, dict) else None
    return item if isinstance(item, dict) and isinstance(item.get("value"), dict) else None


def _item(memory: Memory) -> Item | None:
    stored = _stored(memory)
    if stored is None:
        return None
    return Item(value=stored["value"], key=str(stored["key"]), namespace=tuple(stored["namespace"]),
                created_at=_time(memory["created_at"]), updated_at=_time(memory["updated_at"]))


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics (its in-memory store's): nested equality and $-operators."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(value, op, arg) for op, arg in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(wanted)
                and all(_matches(v, w) for v, w in zip(value, wanted, strict=False)))
    return bool(value == wanted)


def _operator(value: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    if value is None:
        return False
    comparisons = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}
    if op not in comparisons:
        raise ValueError(f"Unsupported filter operator: {op}")
    return bool(comparisons[op](float(value), float(arg)))


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[:len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(p == "*" or p == n for n, p in zip(part, path, strict=True))


class MemoryHubStore(BaseStore):
    """A LangGraph `BaseStore` over one MemoryHub stack (module docstring: how items map)."""

    def __init__(self, hub: MemoryHub, *, stack: str) -> None:
        if not isinstance(hub, MemoryHub):
            raise TypeError("MemoryHubStore takes a MemoryHub (the sync client); abatch runs it in a thread")
        self.hub = hub
        self.stack = stack

    # --- BaseStore ---------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise TypeError(f"Unknown store operation: {op!r}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # --- the operations ----------------------------------------------------------------------------

    def _find(self, namespace: tuple[str, ...], key: str) -> list[Memory]:
        return [memory for memory in self.hub.memories(self.stack, kinds=["note"], tags=[key_tag(namespace, key)])
                if (stored := _stored(memory)) is not None
                and tuple(stored["namespace"]) == namespace and stored["key"] == key]

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        found = self._find(namespace, key)
        return _item(found[0]) if found else None

    def _put(self, op: PutOp) -> None:
        found = self._find(op.namespace, op.key)
        if op.value is None:
            for memory in found:
                self.hub.forget(self.stack, memory["id"], reason="langgraph_delete")
            return
        value = dict(op.value)
        index = None if op.index is None or op.index is False else list(op.index)
        fields = {"content": _text(op.key, value, index),
                  "extra": {"langgraph": {"namespace": list(op.namespace), "key": op.key, "value": value}}}
        if not found:
            self.hub.remember(self.stack, kind="note", tags=_tags(op.namespace, op.key), **fields)
            return
        self.hub.update(self.stack, found[0]["id"], **fields)
        for duplicate in found[1:]:  # two writers raced: the newest one stays
            self.hub.forget(self.stack, duplicate["id"], reason="langgraph_duplicate")

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        candidates = self._ranked(prefix, op.query, op.limit + op.offset) if op.query else self._newest(prefix)
        kept = ((item, score) for item, score in candidates
                if item.namespace[:len(prefix)] == prefix
                and all(_matches(item.value.get(k), v) for k, v in (op.filter or {}).items()))
        return [SearchItem(namespace=item.namespace, key=item.key, value=item.value, created_at=item.created_at,
                           updated_at=item.updated_at, score=score)
                for item, score in islice(kept, op.offset, op.offset + op.limit)]

    def _newest(self, prefix: tuple[str, ...]) -> Iterator[tuple[Item, float | None]]:
        for memory in self.hub.memories(self.stack, kinds=["note"], tags=[namespace_tag(prefix)]):
            if (item := _item(memory)) is not None:
                yield item, None

    def _ranked(self, prefix: tuple[str, ...], query: str, wanted: int) -> Iterator[tuple[Item, float | None]]:
        hits = self.hub.search(self.stack, query, limit=min(_SEARCH_LIMIT, max(wanted * 2, 10)), kinds=["note"],
                               tags=[namespace_tag(prefix)])["results"]
        for hit in hits:
            if (item := _item(self.hub.get(self.stack, hit["id"]))) is not None:
                yield item, float(hit["score"])

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces: set[tuple[str, ...]] = set()
        for memory in self.hub.memories(self.stack, kinds=["note"], tags=[MARKER_TAG]):
            stored = _stored(memory)
            if stored is None:
                continue
            namespace = tuple(stored["namespace"])
            if all(_namespace_matches(condition, namespace) for condition in op.match_conditions or ()):
                namespaces.add(namespace[:op.max_depth] if op.max_depth is not None else namespace)
        return sorted(namespaces)[op.offset:op.offset + op.limit]
