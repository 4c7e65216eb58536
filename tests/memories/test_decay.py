"""FSRS-6 maths and salience: docs/algorithms.md §2.3 test vectors (to 4 decimals) and properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from memories.lifecycle.decay import (
    FACTOR,
    DecayState,
    Grade,
    initial_difficulty,
    initial_stability,
    interval_days,
    memory_retrievability,
    next_difficulty,
    retrievability,
    review,
    salience,
    stability_after_lapse,
    stability_after_recall,
    stability_same_day,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def state(kind: str = "episode", *, days_ago: float = 0.0, reviewed_days_ago: float | None = None,
          stability: float = 1.0, confidence: float = 0.8, times_accessed: int = 0,
          valence: float = 0.0, arousal: float = 0.0) -> DecayState:
    return DecayState(
        kind=kind, confidence=confidence, times_accessed=times_accessed, emotional_valence=valence,
        emotional_arousal=arousal, stability=stability,
        last_reviewed_at=None if reviewed_days_ago is None else NOW - timedelta(days=reviewed_days_ago),
        created_at=NOW - timedelta(days=days_ago),
    )


def test_curve_constant():
    assert pytest.approx(0.980346, abs=1e-6) == FACTOR


@pytest.mark.parametrize(("t", "expected"), [(0, 1.0), (1, 0.98568), (10, 0.90000), (30, 0.80939), (100, 0.69283)])
def test_retrievability_vectors_s10(t, expected):
    assert retrievability(t, 10) == pytest.approx(expected, abs=5e-5)


def test_retrievability_vector_year():
    assert retrievability(365, 100) == pytest.approx(0.79090, abs=5e-5)


def test_retrievability_edges_and_monotonic():
    assert retrievability(-3, 10) == 1.0
    assert retrievability(5, 0) == 0.0
    values = [retrievability(t, 7.5) for t in range(0, 400, 7)]
    assert all(a > b for a, b in pairwise(values))
    assert retrievability(42.0, 42.0) == pytest.approx(0.9, abs=1e-9)


@pytest.mark.parametrize(("grade", "expected"), [(1, 0.212), (2, 1.2931), (3, 2.3065), (4, 8.2956)])
def test_initial_stability(grade, expected):
    assert initial_stability(grade) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(("grade", "expected"), [(1, 6.4133), (2, 5.1122), (3, 2.1181), (4, 1.0)])
def test_initial_difficulty(grade, expected):
    assert initial_difficulty(grade) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(("grade", "expected"), [(1, 7.3945), (2, 4.7529), (3, 2.1112), (4, 1.0)])
def test_next_difficulty_reference(grade, expected):
    assert next_difficulty(initial_difficulty(Grade.GOOD), grade) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(("grade", "expected"), [(2, 8.082), (3, 11.909), (4, 20.291)])
def test_stability_after_recall_first_review(grade, expected):
    assert stability_after_recall(2.3065, 2.1181, 0.9, grade) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize(("r", "expected"), [(0.9, 32.027), (0.7, 81.706)])
def test_stability_after_recall_good(r, expected):
    assert stability_after_recall(10, 5, r, Grade.GOOD) == pytest.approx(expected, abs=5e-4)


def test_stability_after_lapse():
    assert stability_after_lapse(10, 2.1181, 0.9) == pytest.approx(1.4674, abs=5e-5)
    assert stability_after_lapse(10, 5, 0.7) == pytest.approx(1.9356, abs=5e-5)


@pytest.mark.parametrize(("grade", "expected"), [(1, 3.0512), (2, 5.2491), (3, 10.0), (4, 15.5343)])
def test_same_day_reference(grade, expected):
    assert stability_same_day(10, grade) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize(("s", "r", "expected"), [(10, 0.9, 10), (10, 0.8, 33), (10, 0.95, 4), (100, 0.9, 100)])
def test_interval(s, r, expected):
    assert interval_days(s, r) == expected


def test_interval_round_trips_to_stability():
    for s in (3, 17, 250, 4000):
        assert interval_days(s) == s


# --- salience -----------------------------------------------------------------------------------


def test_untouched_episode_fades_below_default_threshold_in_months():
    assert salience(state(days_ago=0), NOW) == pytest.approx(0.56)
    assert salience(state(days_ago=120), NOW) > 0.05  # four months: still there
    assert salience(state(days_ago=180), NOW) < 0.05  # six months: faded


def test_salience_is_a_function_of_elapsed_time_not_of_runs():
    # Idempotence: the value at a time does not depend on how often it was computed before.
    s = state(days_ago=90)
    assert salience(s, NOW) == salience(s, NOW)
    later = [salience(s, NOW + timedelta(days=d)) for d in range(0, 60, 5)]
    assert all(a > b for a, b in pairwise(later))


def test_importance_access_and_emotion_slow_fading():
    base = salience(state(days_ago=100), NOW)
    assert salience(state("belief", days_ago=100), NOW) > base
    assert salience(state(days_ago=100, confidence=1.0), NOW) > base
    assert salience(state(days_ago=100, times_accessed=20), NOW) > base
    assert salience(state(days_ago=100, valence=-0.9, arousal=1.0), NOW) > base
    assert salience(state("raw", days_ago=100), NOW) < base


def test_clock_runs_from_last_review_not_creation():
    old_but_reviewed = state(days_ago=400, reviewed_days_ago=2, stability=30)
    assert salience(old_but_reviewed, NOW) > 0.5
    assert memory_retrievability(old_but_reviewed, NOW) == pytest.approx(retrievability(2, 30))


def test_reviews_follow_fsrs():
    fresh = state(days_ago=14)  # never reviewed: prior stability = the episode's 14 days, R = 0.9
    good = review(fresh, 5.0, Grade.GOOD, NOW)
    assert good.retrievability_before == pytest.approx(0.9, abs=1e-9)
    assert good.stability == pytest.approx(stability_after_recall(14, 5.0, 0.9, Grade.GOOD))
    assert good.difficulty == pytest.approx(next_difficulty(5.0, Grade.GOOD))
    easy = review(fresh, 5.0, Grade.EASY, NOW)
    again = review(fresh, 5.0, Grade.AGAIN, NOW)
    assert again.stability < 14 < good.stability < easy.stability
    assert again.difficulty > 5.0 > easy.difficulty
    same_day = review(state(days_ago=30, reviewed_days_ago=0.2, stability=10), 5.0, Grade.GOOD, NOW)
    assert same_day.stability == pytest.approx(10.0)


def test_review_does_not_double_apply_the_emotional_stretch():
    emotional = state(days_ago=30, reviewed_days_ago=30, stability=10, valence=1.0, arousal=1.0)
    outcome = review(emotional, 5.0, Grade.GOOD, NOW)
    r = retrievability(30, 15)  # curve read with the stretch ...
    assert outcome.stability == pytest.approx(stability_after_recall(10, 5.0, r, Grade.GOOD))  # ... prior without


def test_grade_must_be_valid():
    with pytest.raises(ValueError):
        review(state(), 5.0, 7, NOW)
