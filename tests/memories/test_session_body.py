"""Lumera's session body on `POST …/sessions` (docs/algorithms.md §12.4): `mode`, no `summary`,
`metadata.dry_run`, and the raw-export opt-in `metadata.allow_raw_export` with `raw_export_ack`.
A dry run stores nothing, an opt-in is honoured only with the exact acknowledgement (and refused
clearly otherwise), the control flags are never stored, and another school's stack stays out of
reach."""

from __future__ import annotations

from typing import Any

import pytest

from memories.models import ChangeEvent, Memory
from stacks.models import Stack
from tests.actors import School

pytestmark = pytest.mark.django_db

ACK = "I understand the risk"
# What Lumera's `store_session_to_cascade` takes: the session by its id, with tags, metadata and a mode.
LUMERA: dict[str, Any] = {"session_id": "cass-7f3a", "tags": ["math", "fractions"], "mode": "mock",
                          "metadata": {"project": "tutor", "dry_run": False}}


def _post(school: School, body: dict[str, Any], stack: str | None = None, client: Any = None) -> Any:
    return (client or school.agent).post(f"/api/v1/stacks/{stack or school.stack.slug}/sessions", body, format="json")


def _nothing_stored(school: School, events_before: int) -> None:
    assert not Memory.objects.filter(stack=school.stack).exists()
    assert Stack.objects.get(pk=school.stack.pk).memory_count == 0
    assert ChangeEvent.objects.count() == events_before


def test_a_lumera_dry_run_stores_nothing(school: School) -> None:
    events = ChangeEvent.objects.count()
    answer = _post(school, {**LUMERA, "metadata": {"project": "tutor", "dry_run": True}})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["stored"] is False and body["raw_export"] is False
    assert body["card"]["title"] == "Session cass-7f3a" and body["card"]["tags"] == ["math", "fractions"]
    assert body["session"]["metadata"] == {"project": "tutor"}  # the control flag is not part of the session
    _nothing_stored(school, events)


def test_a_lumera_body_without_a_summary_is_stored_by_its_id_and_tags(school: School) -> None:
    answer = _post(school, LUMERA)
    assert answer.status_code == 201, answer.content
    episode = Memory.objects.get(pk=answer.json()["episode"]["id"])
    assert episode.record_id == "session:cass-7f3a"
    assert episode.data["objective"] == episode.data["outcome"] == "Session cass-7f3a"
    assert episode.extra["session"]["metadata"] == {"project": "tutor"}
    assert set(episode.tags) == {"session", "math", "fractions"}
    assert answer.json()["raw_export"] is False


def test_the_raw_export_opt_in_is_honoured_with_the_exact_acknowledgement(school: School) -> None:
    body = {**LUMERA, "summary": "Fractions with pizza diagrams.",
            "metadata": {"project": "tutor", "allow_raw_export": True, "raw_export_ack": ACK}}
    answer = _post(school, body)
    assert answer.status_code == 201, answer.content
    assert answer.json()["raw_export"] is True
    episode = Memory.objects.get(pk=answer.json()["episode"]["id"])
    assert episode.data["outcome"] == "Fractions with pizza diagrams."
    # The acknowledgement is a control flag, not data: stored nowhere.
    assert episode.extra["session"]["metadata"] == {"project": "tutor"}
    assert ACK not in str(list(Memory.objects.filter(stack=school.stack).values("data", "extra", "text")))


@pytest.mark.parametrize("ack", [None, "", "i understand the risk", "I understand the risk ", "yes"])
def test_a_raw_export_opt_in_without_the_exact_acknowledgement_is_refused(school: School, ack: Any) -> None:
    events = ChangeEvent.objects.count()
    metadata: dict[str, Any] = {"allow_raw_export": True, **({} if ack is None else {"raw_export_ack": ack})}
    for dry_run in (False, True):
        answer = _post(school, {**LUMERA, "metadata": {**metadata, "dry_run": dry_run}})
        assert answer.status_code == 400, answer.content
        error = answer.json()["error"]
        assert error["code"] == "raw_export_not_acknowledged" and "metadata.raw_export_ack" in error["fields"]
        assert ACK in error["message"]
    _nothing_stored(school, events)


@pytest.mark.parametrize("body", [
    {**LUMERA, "mode": "cloud"},
    {**LUMERA, "metadata": {"dry_run": "yes"}},
    {**LUMERA, "metadata": {"allow_raw_export": "true", "raw_export_ack": ACK}},
])
def test_bad_control_values_are_a_clear_400(school: School, body: dict[str, Any]) -> None:
    events = ChangeEvent.objects.count()
    answer = _post(school, body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["fields"]
    _nothing_stored(school, events)


def test_another_schools_stack_is_out_of_reach(school: School, other_school: School) -> None:
    dry = {**LUMERA, "metadata": {"dry_run": True}}
    for body in (LUMERA, dry):
        assert _post(school, body, client=other_school.agent).status_code == 404
        assert _post(school, body, client=other_school.admin_api).status_code == 404
        assert _post(school, body, stack=school.other_stack.slug).status_code == 404
    assert not Memory.objects.exists()
