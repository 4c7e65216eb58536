"""The student page's "Storage and cost" and "Forgetting" cards, as the page renders them.

A reviewer saw "Stored, by kind" with only a "Snapshots 0 bytes" row, and blank salience charts,
for a stack with notes: that screenshot was of a page rendered while the stack was still empty,
whose notes then arrived over the live socket (which updates the list and the header figures, not
these cards). These tests pin what the page says once the memories are there — each kind with its
count and bytes, a total that agrees — and what it says in words while there is nothing to chart.
"""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from memories.models import Memory
from memories.services import memory_create, memory_forget, memory_set_protected
from stacks.models import Stack
from tests.actors import School
from tests.dashboard.pages import client_for

pytestmark = pytest.mark.django_db

NO_LIVE_MEMORIES = "This stack has no live memories, so nothing can fade yet"
NO_MEMORIES_STORED = "No memories stored yet"
NO_GROWTH = "so there is no growth to chart yet"
NOTHING_TO_FORECAST = "Nothing to forecast"
STALE = '<p class="small muted" data-live-stale role="status" hidden>Memories changed after this page was loaded'


def page(school: School, stack: Stack | None = None) -> str:
    response = client_for(school.admin).get(reverse("dashboard:student", args=[(stack or school.stack).slug]))
    assert response.status_code == 200
    return str(response.content.decode())


def section(body: str, section_id: str) -> str:
    start = body.index(f'<section id="{section_id}"')
    return body[start:body.index("</section>", start)]


def stored_by_kind(body: str) -> tuple[dict[str, tuple[int, str]], str]:
    """The "Stored, by kind" rows as {kind: (items, size)} and the total's size, as shown."""
    usage = section(body, "usage")
    tbody = usage[usage.index("<tbody>"):usage.index("</tbody>")]
    rows = re.findall(r'<tr><td>([^<]+)</td><td class="num">(\d+)</td><td class="num">([^<]+)</td></tr>', tbody)
    total = re.search(r'<tfoot><tr><th>Total</th><td></td><td class="num">([^<]+)</td>', usage)
    assert total, usage
    return {kind: (int(items), size.replace("\xa0", " ")) for kind, items, size in rows}, \
        total.group(1).replace("\xa0", " ")


def chart(body: str, element_id: str) -> dict[str, object] | None:
    found = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', body, re.S)
    return json.loads(found.group(1)) if found else None


def note(stack: Stack, text: str) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": text}, source="api")


def belief(stack: Stack, text: str) -> Memory:
    return memory_create(stack=stack, kind="belief", payload={"statement": text}, source="api")


def test_each_kind_is_listed_with_its_count_and_bytes_and_the_total_agrees(school: School) -> None:
    notes = [note(school.stack, "Fractions click with pizza slices"), note(school.stack, "Reads aloud well")]
    beliefs = [belief(school.stack, "Pictures help with fractions")]
    # Forgotten memories still take space (and count for the quota) until they are purged.
    memory_forget(memory=notes[1], reason="parent asked")
    note(school.other_stack, "Bob's note, never counted on Alice's page")

    rows, total = stored_by_kind(page(school))

    note_bytes, belief_bytes = sum(m.size_bytes for m in notes), sum(m.size_bytes for m in beliefs)
    assert 0 < note_bytes + belief_bytes < 1024  # shown in plain bytes, so the figures compare exactly
    assert rows == {"Belief": (1, f"{belief_bytes} bytes"), "Note": (2, f"{note_bytes} bytes"),
                    "Snapshots": (0, "0 bytes")}
    assert total == f"{note_bytes + belief_bytes} bytes"
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == note_bytes + belief_bytes
    assert NO_MEMORIES_STORED not in page(school)


def test_the_cards_show_what_was_stored_when_the_page_was_rendered(school: School) -> None:
    """The screenshot's case: rendered empty, then written to — the next render lists the notes."""
    before = page(school)
    assert stored_by_kind(before) == ({"Snapshots": (0, "0 bytes")}, "0 bytes")
    assert NO_MEMORIES_STORED in section(before, "usage")

    written = [note(school.stack, f"Note {n}") for n in range(3)]

    after = page(school)
    rows, total = stored_by_kind(after)
    assert rows["Note"] == (3, f"{sum(m.size_bytes for m in written)} bytes")
    assert total == f"{sum(m.size_bytes for m in written)} bytes"
    assert NO_MEMORIES_STORED not in after and NO_GROWTH not in after


def test_an_empty_stack_says_in_words_why_there_are_no_charts(school: School) -> None:
    note(school.other_stack, "A sibling's memory does not fill Alice's charts")
    body = page(school)

    usage = section(body, "usage")
    assert NO_MEMORIES_STORED in usage and NO_GROWTH in usage
    assert chart(body, "chart-usage-growth") is None and 'data-chart="chart-usage-growth"' not in body

    forgetting = section(body, "candidates")
    assert NO_LIVE_MEMORIES in forgetting and NOTHING_TO_FORECAST in forgetting
    # …with when the next decay pass runs, as a machine-readable time.
    assert re.search(r"next decay pass is due at <time datetime=\"[^\"]+\">\d\d:\d\d</time>", forgetting)
    for element_id in ("chart-salience", "chart-forecast"):
        assert chart(body, element_id) is None and f'data-chart="{element_id}"' not in body


def test_new_memories_are_charted_before_any_decay_pass(school: School) -> None:
    """Fresh memories (no decay pass has run) have a salience now: the charts draw them."""
    for n in range(3):
        note(school.stack, f"Fresh note {n}")
    body = page(school)

    salience = chart(body, "chart-salience")
    assert salience is not None and 'data-chart="chart-salience"' in body
    datasets = salience["datasets"]
    assert isinstance(datasets, list)
    assert sum(datasets[0]["data"]) == 3 and sum(datasets[1]["data"]) == 0  # can fade / never fade
    forecast = chart(body, "chart-forecast")
    assert forecast is not None and 'data-chart="chart-forecast"' in body
    growth = chart(body, "chart-usage-growth")
    assert growth is not None and growth["empty"] is False
    month = timezone.now().strftime("%Y-%m")
    assert growth["labels"][-1] == month  # type: ignore[index]
    forgetting = section(body, "candidates")
    assert NO_LIVE_MEMORIES not in forgetting and NOTHING_TO_FORECAST not in forgetting
    assert "never fade (protected, values or drives), so decay" not in forgetting


def test_memories_that_never_fade_are_charted_and_said_to_be_safe(school: School) -> None:
    memory_create(stack=school.stack, kind="value", source="api", payload={"name": "kindness", "statement": "Be kind"})
    memory_set_protected(memory=note(school.stack, "Keep this one"), protected=True)
    body = page(school)

    forgetting = section(body, "candidates")
    assert "All 2 live memories never fade (protected, values or drives)" in forgetting
    salience = chart(body, "chart-salience")
    assert salience is not None
    datasets = salience["datasets"]
    assert isinstance(datasets, list) and sum(datasets[1]["data"]) == 2


def test_only_forgotten_memories_leave_nothing_to_fade_but_still_take_space(school: School) -> None:
    gone = note(school.stack, "Forgotten at the parent's request")
    memory_forget(memory=gone, reason="parent asked")
    body = page(school)

    assert NO_LIVE_MEMORIES in section(body, "candidates")
    rows, total = stored_by_kind(body)
    assert rows["Note"] == (1, f"{gone.size_bytes} bytes") and total == f"{gone.size_bytes} bytes"
    assert NO_MEMORIES_STORED not in body


def test_another_schools_admin_reads_neither_card(school: School, other_school: School) -> None:
    note(school.stack, "Alice's note")
    response = client_for(other_school.admin).get(reverse("dashboard:student", args=[school.stack.slug]))
    assert response.status_code == 404
    assert "Stored, by kind" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_live_page_can_say_its_cards_are_older_than_the_list(school: School) -> None:
    """Over ASGI the list and header figures follow writes live but these cards do not: each carries
    a hidden note that static/dashboard/live.js shows once memories change. A static page has none."""
    asgi = AsyncClient()
    await asgi.aforce_login(school.admin)
    body = (await asgi.get(reverse("dashboard:student", args=[school.stack.slug]))).content.decode()
    assert "data-live-seq=" in body
    assert STALE in section(body, "usage") and STALE in section(body, "candidates")
    assert 'data-live-stale' not in await sync_to_async(page)(school)
