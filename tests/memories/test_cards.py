"""Session memory cards (memories/sessions/cards.py; docs/algorithms.md §12): redact first, then derive.
The §10.4-style fixture with an e-mail address: every card field, the stored episode and card, their
revisions and change events are free of the raw address; the card is stable; a dry run stores
nothing; the decision heuristics keep "v2.3.1" whole; tags match exactly; other schools and
stacks are out of reach."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memories.models import ChangeEvent, Memory, MemoryRevision
from memories.privacy.redaction.policy import ALL_CATEGORIES
from memories.sessions.cards import memory_card, session_allowlisted, session_cards, session_redacted
from stacks.models import Stack
from tests.actors import School
from tests.factories import bearer_client, make_key, session_client

pytestmark = pytest.mark.django_db

EMAIL = "ada.mum@example.org"
SESSION: dict[str, Any] = {
    "session_id": "s-2026-11-24",
    "timestamp": "2026-11-24T10:00:00Z",
    "tool_name": "tutor",
    "success": True,
    "tags": ["math", "a", " math "],
    "summary": (
        "Investigated the flaky login test with Ada Lovelace from Hill School. "
        "We decided to roll back to v2.3.1 after the deploy broke sessions. "
        "Chose to pin redis at 7.2 for the exam week. "
        "Ada said \"the pizza diagrams finally made fractions click\" during review. "
        f"TODO: email the parents at {EMAIL} about the new schedule. "
        "We need to update the onboarding guide before Friday. "
        f"Contact {EMAIL} if the tutor stalls."
    ),
}


def _post(client: Any, school: School, body: dict[str, Any], stack: str | None = None) -> Any:
    slug = stack or school.stack.slug
    return client.post(f"/api/v1/stacks/{slug}/sessions", body, format="json")


def _no_email(value: Any) -> None:
    rendered = json.dumps(value, default=str)
    assert EMAIL not in rendered and "ada.mum" not in rendered and "example.org" not in rendered


def test_dry_run_card_has_every_field_and_no_raw_email(school: School) -> None:
    answer = _post(school.agent, school, {**SESSION, "dry_run": True})
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["stored"] is False
    assert body["redaction"] == [{"rule": "email", "count": 2}]
    card = body["card"]
    assert card["title"] == "Investigated the flaky login test with Ada Lovelace from…"
    assert card["summary_bullets"][0] == "Tool: tutor (succeeded)"
    assert "We decided to roll back to v2.3.1 after the deploy broke sessions." in card["summary_bullets"]
    assert card["summary_bullets"][-1] == "Tags: math, a"
    assert 3 <= len(card["summary_bullets"]) <= 7
    # "v2.3.1" stays whole: a sentence ends only at punctuation followed by a space.
    assert card["decisions"] == ["roll back to v2.3.1 after the deploy broke sessions",
                                 "pin redis at 7.2 for the exam week"]
    assert card["todos"] == ["email the parents at <REDACTED:EMAIL> about the new schedule",
                             "update the onboarding guide before Friday"]
    assert card["entities"][:2] == ["Ada Lovelace", "Hill School"]
    assert "Investigated" not in card["entities"]
    assert card["notable_quotes"] == ["the pizza diagrams finally made fractions click"]
    # By frequency, then first appearance; placeholders are not words.
    assert card["keywords"][:4] == ["ada", "tutor", "investigated", "flaky"]
    assert len(card["keywords"]) == 20 and "redacted" not in card["keywords"]
    assert card["tags"] == ["math", "a"]  # trimmed and exact: " math " is "math", never a substring
    for value in card.values():
        _no_email(value)
    _no_email(body)


def test_card_is_stable_and_pure() -> None:
    session, report = session_redacted(session_allowlisted(SESSION), ALL_CATEGORIES)
    first = memory_card(session)
    assert memory_card(session) == first
    again, _ = session_redacted(session_allowlisted(dict(SESSION)), ALL_CATEGORIES)
    assert memory_card(again) == first
    assert report == [{"rule": "email", "count": 2}]


def test_title_fallbacks_and_padding() -> None:
    short = memory_card(session_allowlisted({"session_id": "x1", "summary": "Fixed it."}))
    assert short["title"] == "Fixed it"
    assert short["summary_bullets"] == ["Session: x1"]  # only what exists: no invented bullets
    padded = memory_card(session_allowlisted({"session_id": "x2", "summary": "Short.", "timestamp": "t0",
                                              "tool_name": "shell", "success": False}))
    assert padded["summary_bullets"] == ["Tool: shell (failed)", "Session: x2", "Time: t0"]


def test_dry_run_stores_nothing(school: School) -> None:
    before = Stack.objects.get(pk=school.stack.pk).bytes_used
    events = ChangeEvent.objects.count()
    assert _post(school.agent, school, {**SESSION, "dry_run": True}).status_code == 200
    assert not Memory.objects.filter(stack=school.stack).exists()
    assert Stack.objects.get(pk=school.stack.pk).bytes_used == before
    assert ChangeEvent.objects.count() == events


def test_store_writes_episode_and_card_without_the_raw_email(school: School) -> None:
    answer = _post(school.agent, school, SESSION)
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert body["stored"] is True
    episode = Memory.objects.get(pk=body["episode"]["id"])
    card = Memory.objects.get(pk=body["card_memory"]["id"])
    assert episode.kind == "episode" and episode.record_id == "session:s-2026-11-24"
    assert episode.data["outcome"].count("<REDACTED:EMAIL>") == 2
    assert episode.data["outcome_type"] == "success"
    assert card.kind == "note" and card.data["note_type"] == "session_card"
    assert card.derived_from == ["episode:session:s-2026-11-24"]
    assert card.extra["memory_card"] == body["card"]
    assert "roll back to v2.3.1" in card.text
    for memory in (episode, card):
        _no_email([memory.text, memory.data, memory.extra, memory.tags, memory.redaction_report])
        assert [entry["rule"] for entry in memory.redaction_report] == ["email"]
    _no_email(list(MemoryRevision.objects.filter(memory__stack=school.stack).values()))
    _no_email(list(ChangeEvent.objects.filter(stack_id=school.stack.pk).values()))
    assert Stack.objects.get(pk=school.stack.pk).memory_count == 2

    # Searchable like any memory, and listed for the dashboard.
    found = school.agent.post(school.stack_url("search"), {"query": "onboarding guide"}, format="json")
    assert found.status_code == 200
    assert str(card.pk) in json.dumps(found.json())
    [listed] = session_cards(school.stack, audience=None)
    assert listed["card"] == body["card"] and listed["memory_id"] == card.pk

    # A session id is stored once per stack.
    again = _post(school.agent, school, SESSION)
    assert again.status_code == 409
    assert Memory.objects.filter(stack=school.stack).count() == 2


def test_tags_filter_matches_exactly(school: School) -> None:
    assert _post(school.agent, school, {"session_id": "j", "summary": "Java session.", "tags": ["java"]}
                 ).status_code == 201
    assert _post(school.agent, school, {"session_id": "a", "summary": "Plain session.", "tags": ["a"]}
                 ).status_code == 201
    listed = school.agent.get(school.stack_url("memories") + "?tags=a").json()
    records = {item["record_id"] for item in listed["results"]}
    assert records == {"session:a", "session-card:a"}


def test_secrets_and_unlisted_fields_store_nothing(school: School) -> None:
    refused = _post(school.agent, school, {
        **SESSION, "summary": "Sent Authorization: Bearer abcdefghijklmnop1234 to the API."})
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "redaction_refused"
    unlisted = _post(school.agent, school, {**SESSION, "error_message": f"mail {EMAIL}", "output": "x"})
    assert unlisted.status_code == 400
    assert unlisted.json()["error"]["code"] == "unknown_field"
    assert set(unlisted.json()["error"]["fields"]) == {"error_message", "output"}
    _no_email(unlisted.json())
    missing = _post(school.agent, school, {"summary": "no id"})
    assert missing.status_code == 400 and "session_id" in missing.json()["error"]["fields"]
    assert not Memory.objects.filter(stack=school.stack).exists()


def test_other_schools_stacks_and_read_only_keys_cannot_post(school: School, other_school: School) -> None:
    for body in (SESSION, {**SESSION, "dry_run": True}):
        assert _post(other_school.agent, school, body).status_code == 404
        assert _post(other_school.admin_api, school, body).status_code == 404
        assert _post(school.agent, school, body, stack=school.other_stack.slug).status_code == 404
    _, secret = make_key(school.org, stack=school.stack, user=school.admin, read_only=True)
    assert _post(bearer_client(secret), school, SESSION).status_code == 403
    assert not Memory.objects.exists()


def test_student_page_shows_cards_and_usage(school: School, other_school: School) -> None:
    assert _post(school.agent, school, SESSION).status_code == 201
    page = session_client(school.teacher).get(f"/dashboard/students/{school.stack.slug}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Session cards" in html and "roll back to v2.3.1 after the deploy broke sessions" in html
    assert "Storage and cost" in html and "chart-usage-growth" in html
    assert "School&#x27;s monthly cost" not in html and "School's monthly cost" not in html  # teachers: no bill
    _no_email(html)
    admin_html = session_client(school.admin).get(f"/dashboard/students/{school.stack.slug}/").content.decode()
    assert "School's monthly cost" in admin_html or "School&#x27;s monthly cost" in admin_html
    # Another school's admin reaches neither the page nor the card.
    assert session_client(other_school.admin).get(f"/dashboard/students/{school.stack.slug}/").status_code == 404
