"""`memoryhub_client.langgraph.MemoryHubStore` against a live MemoryHub: LangGraph's store
behaviour (put/get/search/delete/list_namespaces, sync and async — the cases of LangGraph's own
store tests, which its packages do not ship), and a tiny graph that writes a memory in one run
and recalls it in a later one (clients/python/README.md "LangGraph")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from memoryhub_client import MemoryHub
from memoryhub_client.langgraph import MemoryHubStore

from memories.models import Memory
from tests.actors import School

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_store_behaves_as_langgraph_expects(hub_url: str, school: School) -> None:
    with MemoryHub(hub_url, school.agent_secret, agent_id="langgraph") as hub:
        store = MemoryHubStore(hub, stack="alice")
        assert isinstance(store, BaseStore)

        # put / get, and a put again replaces the value (one memory, not two).
        store.put(("users", "ada", "prefs"), "food", {"text": "Ada loves pizza on Fridays", "rank": 1})
        first = store.get(("users", "ada", "prefs"), "food")
        assert first is not None and first.value == {"text": "Ada loves pizza on Fridays", "rank": 1}
        assert (first.namespace, first.key) == (("users", "ada", "prefs"), "food")
        store.put(("users", "ada", "prefs"), "food", {"text": "Ada loves pizza and pasta", "rank": 2})
        again = store.get(("users", "ada", "prefs"), "food")
        assert again is not None and again.value["rank"] == 2 and again.created_at == first.created_at
        assert store.get(("users", "ada", "prefs"), "missing") is None
        assert store.get(("users", "bob", "prefs"), "food") is None  # the key, in another namespace

        store.put(("users", "ada", "facts"), "pet", {"text": "Ada walks her grandmother's dog", "rank": 3})
        store.put(("users", "bob", "prefs"), "food", {"text": "Bob prefers sushi", "rank": 5})
        stored = Memory.objects.filter(stack=school.stack, tags__contains=["langgraph"])
        assert stored.count() == 3 and {m.kind for m in stored} == {"note"}

        # search: a prefix (newest first), a query, a filter, limit and offset.
        assert {i.key for i in store.search(("users", "ada"))} == {"food", "pet"}
        assert len(store.search(("users",))) == 3
        hits = store.search(("users",), query="pizza pasta")
        assert [(h.namespace, h.key) for h in hits][:1] == [(("users", "ada", "prefs"), "food")]
        assert hits[0].score is not None
        assert [i.key for i in store.search(("users",), filter={"rank": {"$gte": 3}})] == ["food", "pet"]
        assert [i.value["rank"] for i in store.search(("users",), filter={"rank": 5})] == [5]
        assert len(store.search(("users",), limit=1)) == 1
        assert len(store.search(("users",), limit=2, offset=2)) == 1

        # list_namespaces: all, by prefix, by suffix, to a depth.
        assert store.list_namespaces() == [("users", "ada", "facts"), ("users", "ada", "prefs"),
                                           ("users", "bob", "prefs")]
        assert store.list_namespaces(prefix=("users", "bob")) == [("users", "bob", "prefs")]
        assert store.list_namespaces(suffix=("prefs",)) == [("users", "ada", "prefs"), ("users", "bob", "prefs")]
        assert store.list_namespaces(prefix=("users", "*", "facts")) == [("users", "ada", "facts")]
        assert store.list_namespaces(max_depth=2) == [("users", "ada"), ("users", "bob")]
        assert store.list_namespaces(limit=1, offset=1) == [("users", "ada", "prefs")]

        # delete: gone for LangGraph; in MemoryHub a forgotten (recoverable) memory.
        store.delete(("users", "ada", "facts"), "pet")
        assert store.get(("users", "ada", "facts"), "pet") is None
        assert ("users", "ada", "facts") not in store.list_namespaces()
        assert Memory.objects.get(stack=school.stack, text__contains="grandmother").forgotten_at is not None

        # The async methods (abatch) see the same store.
        async def async_part() -> None:
            await store.aput(("users", "ada", "facts"), "music", {"text": "Ada plays the violin"})
            item = await store.aget(("users", "ada", "facts"), "music")
            assert item is not None and item.value == {"text": "Ada plays the violin"}
            found = await store.asearch(("users", "ada"), query="violin")
            assert [i.key for i in found][:1] == ["music"]
            assert ("users", "ada", "facts") in await store.alist_namespaces(prefix=("users",))
            await store.adelete(("users", "ada", "facts"), "music")
            assert await store.aget(("users", "ada", "facts"), "music") is None
        asyncio.run(async_part())


@dataclass
class TutorState:
    student: str
    fact: str = ""
    question: str = ""
    recalled: list[str] = field(default_factory=list)


def remember_or_recall(state: TutorState) -> dict[str, Any]:
    """Remember the run's fact, or recall what answers its question (added to what it recalled)."""
    store = get_store()
    namespace = ("students", state.student, "memories")
    if state.fact:
        store.put(namespace, f"fact-{len(store.search(namespace)) + 1}", {"text": state.fact})
        return {}
    found = store.search(namespace, query=state.question, limit=3)
    return {"recalled": [*state.recalled, *(item.value["text"] for item in found)]}


def test_a_graph_writes_a_memory_and_recalls_it_in_a_later_run(hub_url: str, school: School) -> None:
    builder = StateGraph(TutorState)
    builder.add_node("tutor", remember_or_recall)
    builder.add_edge(START, "tutor")
    builder.add_edge("tutor", END)
    with MemoryHub(hub_url, school.agent_secret, agent_id="tutor-graph") as hub:
        graph: Any = builder.compile(store=MemoryHubStore(hub, stack="alice"))  # its generics stay unbound
        graph.invoke(TutorState(student="ada", fact="Fractions click with pizza diagrams"))
        graph.invoke(TutorState(student="ada", fact="Ada reads comics at lunch"))
        later = graph.invoke(TutorState(student="ada", question="pizza fractions"))
        assert later["recalled"][0] == "Fractions click with pizza diagrams"
        elsewhere = asyncio.run(graph.ainvoke(TutorState(student="bob", question="pizza fractions")))
        assert elsewhere["recalled"] == []  # another namespace recalls nothing of Ada's
    note = Memory.objects.get(stack=school.stack, text="Fractions click with pizza diagrams")
    assert note.written_by.get("agent") == "tutor-graph"
