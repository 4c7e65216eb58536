"""The decay model: FSRS-6 maths and memory salience, as pure functions and one SQL expression.

Decisions pinned here (docs/algorithms.md §2-§3):

* **One curve.** Retrievability is the FSRS-6 curve R(t, S) = (1 + F·t/S)^(-w20) of §2.1, used
  for both the review scheduler and forgetting (the "Decide" of §2.1). We do not run Vestige's
  dual-strength curve next to it.
* **The clock runs from the last review, not the last read** (§3.1): the elapsed time t is
  measured from `last_reviewed_at`, or `created_at` for a memory that was never reviewed. Reads
  never change stability or the clock; only explicit feedback does (`memories.lifecycle.reviews.record_review`).
* **Unreviewed memories** are not FSRS "New" cards — somebody chose to write them. Until their first
  review their stability is the kind's *initial stability* below (in days); the stored
  `stability` column is authoritative only once `last_reviewed_at` is set. Emotional memories
  decay more slowly: S_eff = S·(1 + 0.5·|valence|·arousal) (Vestige's sentiment stretch).
* **Salience** (what forgetting ranks by) combines importance, access history and recency:

      importance = 0.6·base(kind) + 0.4·confidence                    (Kernle's 60/40, §8.2)
      access     = min(2, 1 + 0.25·ln(1 + times_accessed))             (diminishing, §3.1)
      recency    = R(t, S_eff)^(1/w20) = 1 / (1 + F·t/S_eff)
      salience   = min(1, importance · access · recency)

  `recency` is the FSRS retrievability raised to 1/w20. That is exactly Kernle's salience
  denominator 1/(days/half-life + 1) (§2.5) with the half-life S/F taken from the memory's own FSRS
  stability instead of a fixed 30 days, so reviews lengthen a memory's life the way FSRS says,
  while raw R — a recall probability with a very long power-law tail (R(365 d, S = 1) ≈ 0.40) —
  could never cross a forgetting threshold. With the defaults, an untouched episode (confidence
  0.8, never accessed) falls below the default threshold 0.05 after about five months; a belief
  after about fourteen.
* **Idempotent** (the "Avoid" of §2.5): salience is a function of stored state and `now`, never of
  the previous salience, so running the pass twice, or hourly instead of daily, changes nothing.
* Values and drives never fade (Kernle excludes them from forgetting), nor do protected memories.

`salience()` (Python) and `salience_sql()` (SQL) are the same formula; a test holds them together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum

# --- FSRS-6 -------------------------------------------------------------------------------------

# Standard FSRS-6 default weights (docs/algorithms.md §2.1), w0..w20.
W: tuple[float, ...] = (
    0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796,
    1.4835, 0.0614, 0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542,
)
DECAY = W[20]
FACTOR = 0.9 ** (-1.0 / DECAY) - 1.0  # ≈ 0.980346; makes R(S, S) = 0.9
MIN_STABILITY = 0.1
MAX_STABILITY = 36500.0
MIN_DIFFICULTY = 1.0
MAX_DIFFICULTY = 10.0
MAX_INTERVAL_DAYS = 36500
SECONDS_PER_DAY = 86400.0


class Grade(IntEnum):
    """FSRS review grades. Mapping of product signals (use these, so the meaning stays one):

    * demote ("thumbs down") → AGAIN (a lapse: stability drops sharply)
    * reinforcement by smart ingest, an agent-reported successful recall → GOOD
    * promote ("thumbs up") → GOOD, with stability at least 1.5x the prior (search/retrieval_feedback.py);
      EASY only from a recall the agent grades "easy"
    """

    AGAIN = 1
    HARD = 2
    GOOD = 3
    EASY = 4


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def retrievability(elapsed_days: float, stability: float) -> float:
    """R(t, S) = (1 + F·t/S)^(-w20); 1 for t ≤ 0, 0 for S ≤ 0 (§2.1)."""
    if stability <= 0:
        return 0.0
    if elapsed_days <= 0:
        return 1.0
    return (1.0 + FACTOR * elapsed_days / stability) ** (-DECAY)


def initial_stability(grade: Grade | int) -> float:
    """S0(G) = w[G-1]."""
    return W[int(grade) - 1]


def _initial_difficulty_unclamped(grade: Grade | int) -> float:
    return W[4] - math.exp(W[5] * (int(grade) - 1)) + 1.0


def initial_difficulty(grade: Grade | int) -> float:
    """D0(G) = clamp(w4 - e^(w5·(G-1)) + 1, 1, 10)."""
    return _clamp(_initial_difficulty_unclamped(grade), MIN_DIFFICULTY, MAX_DIFFICULTY)


def next_difficulty(difficulty: float, grade: Grade | int) -> float:
    """D' with linear damping and mean reversion toward the *unclamped* D0(Easy) (reference, §2.2)."""
    delta = -W[6] * (int(grade) - 3)
    damped = difficulty + delta * (10.0 - difficulty) / 9.0
    reverted = W[7] * _initial_difficulty_unclamped(Grade.EASY) + (1.0 - W[7]) * damped
    return _clamp(reverted, MIN_DIFFICULTY, MAX_DIFFICULTY)


def stability_after_recall(stability: float, difficulty: float, r: float, grade: Grade | int) -> float:
    """S'r for a successful review (grade ≥ Hard)."""
    hard_penalty = W[15] if int(grade) == Grade.HARD else 1.0
    easy_bonus = W[16] if int(grade) == Grade.EASY else 1.0
    gain = (
        math.exp(W[8]) * (11.0 - difficulty) * stability ** (-W[9]) * (math.exp(W[10] * (1.0 - r)) - 1.0)
        * hard_penalty * easy_bonus
    )
    return _clamp(stability * (1.0 + gain), MIN_STABILITY, MAX_STABILITY)


def stability_after_lapse(stability: float, difficulty: float, r: float) -> float:
    """S'f for a lapse (Again), capped at S / e^(w17·w18) (reference behaviour, §2.2)."""
    forgotten = W[11] * difficulty ** (-W[12]) * ((stability + 1.0) ** W[13] - 1.0) * math.exp(W[14] * (1.0 - r))
    cap = stability / math.exp(W[17] * W[18])
    return _clamp(min(forgotten, cap), MIN_STABILITY, MAX_STABILITY)


def stability_same_day(stability: float, grade: Grade | int) -> float:
    """S' for a review less than a day after the previous one; never drops for Good/Easy (§2.2)."""
    factor = math.exp(W[17] * (int(grade) - 3 + W[18])) * stability ** (-W[19])
    if int(grade) >= Grade.GOOD:
        factor = max(factor, 1.0)
    return _clamp(stability * factor, MIN_STABILITY, MAX_STABILITY)


def interval_days(stability: float, desired_retention: float = 0.9) -> int:
    """Days until R falls to `desired_retention`: round(S/F·(r^(-1/w20) - 1)), within [1, 36500]."""
    raw = stability / FACTOR * (desired_retention ** (-1.0 / DECAY) - 1.0)
    return int(_clamp(round(raw), 1, MAX_INTERVAL_DAYS))


# --- Kinds ----------------------------------------------------------------------------------------

# Kernle's type base priorities (§8.2); raw entries and playbooks are not in Kernle's table.
BASE_PRIORITY: dict[str, float] = {
    "value": 0.90,
    "belief": 0.70,
    "goal": 0.65,
    "drive": 0.60,
    "playbook": 0.50,
    "episode": 0.40,
    "note": 0.35,
    "relationship": 0.30,
    "raw": 0.20,
}
DEFAULT_BASE_PRIORITY = 0.5

# Stability (days) of a memory that was never reviewed. Chosen so the default threshold 0.05 is
# crossed after months, not days, scaled like Kernle's per-type half-lives (30 d default; goals
# longer): raw scratch entries go first, beliefs and goals last.
INITIAL_STABILITY_DAYS: dict[str, float] = {
    "raw": 7.0,
    "episode": 14.0,
    "note": 14.0,
    "relationship": 30.0,
    "playbook": 30.0,
    "belief": 30.0,
    "goal": 60.0,
    "value": 365.0,
    "drive": 365.0,
}
DEFAULT_INITIAL_STABILITY_DAYS = 14.0

# Kinds the decay pass never tombstones, whatever their salience (§2.5: values and drives).
NEVER_FADE_KINDS: frozenset[str] = frozenset({"value", "drive"})

# Why the decay pass tombstoned a memory (Memory.forgotten_reason).
FORGOTTEN_REASON_DECAY = "salience_decay"

ACCESS_WEIGHT = 0.25
ACCESS_CAP = 2.0
EMOTION_STRETCH = 0.5


def initial_stability_for(kind: str) -> float:
    return INITIAL_STABILITY_DAYS.get(kind, DEFAULT_INITIAL_STABILITY_DAYS)


@dataclass(frozen=True)
class DecayState:
    """What salience depends on: a memory's stored columns (see `DecayState.of`)."""

    kind: str
    confidence: float
    times_accessed: int
    emotional_valence: float
    emotional_arousal: float
    stability: float
    last_reviewed_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, memory: object) -> DecayState:
        return cls(**{name: getattr(memory, name) for name in cls.__dataclass_fields__})

    @property
    def baseline(self) -> datetime:
        """Where the decay clock starts: the last review, else creation."""
        return self.last_reviewed_at or self.created_at


def elapsed_days(since: datetime, now: datetime) -> float:
    return max(0.0, (now - since).total_seconds() / SECONDS_PER_DAY)


def base_stability(state: DecayState) -> float:
    """Stability in days before the emotional stretch: stored once reviewed, else the kind's initial one."""
    if state.last_reviewed_at is not None:
        return max(state.stability, MIN_STABILITY)
    return initial_stability_for(state.kind)


def effective_stability(state: DecayState) -> float:
    """Stability the curve uses: emotional memories decay more slowly."""
    base = base_stability(state)
    stretch = 1.0 + EMOTION_STRETCH * min(1.0, abs(state.emotional_valence)) * _clamp(state.emotional_arousal, 0.0, 1.0)
    return base * stretch


def memory_retrievability(state: DecayState, now: datetime) -> float:
    """FSRS R of this memory at `now`."""
    return retrievability(elapsed_days(state.baseline, now), effective_stability(state))


def salience(state: DecayState, now: datetime) -> float:
    """The memory's salience at `now` (module docstring); mirrored by `salience_sql`."""
    importance = 0.6 * BASE_PRIORITY.get(state.kind, DEFAULT_BASE_PRIORITY) + 0.4 * _clamp(state.confidence, 0.0, 1.0)
    access = min(ACCESS_CAP, 1.0 + ACCESS_WEIGHT * math.log1p(max(0, state.times_accessed)))
    recency = 1.0 / (1.0 + FACTOR * elapsed_days(state.baseline, now) / effective_stability(state))
    return min(1.0, importance * access * recency)


def _f(value: float) -> str:
    """A float8 SQL literal: a bare `0.6` is NUMERIC in Postgres, and numeric arithmetic (LN above
    all) made the per-row salience several times slower than float8's."""
    return f"{float(value)!r}::float8"


def _kind_case(column: str, mapping: dict[str, float], default: float) -> str:
    whens = " ".join(f"WHEN '{kind}' THEN {_f(value)}" for kind, value in sorted(mapping.items()))
    return f"(CASE {column} {whens} ELSE {_f(default)} END)"


def salience_sql(alias: str = "m", now_param: str = "%(now)s", *, baseline: str | None = None) -> str:
    """The salience of row `alias` of memories_memory at timestamp `now_param`, as SQL.

    Only constants from this module are interpolated (no user input); `now_param` is a
    placeholder the caller binds. `baseline` overrides where the clock starts (an SQL
    expression; default: last review, else creation). All float8 (see `_f`); `date_part`, not
    EXTRACT, which returns numeric.
    """
    m = alias
    one, zero = _f(1.0), _f(0.0)
    start = baseline or f"COALESCE({m}.last_reviewed_at, {m}.created_at)"
    base = _kind_case(f"{m}.kind", BASE_PRIORITY, DEFAULT_BASE_PRIORITY)
    initial = _kind_case(f"{m}.kind", INITIAL_STABILITY_DAYS, DEFAULT_INITIAL_STABILITY_DAYS)
    elapsed = f"GREATEST({zero}, date_part('epoch', {now_param}::timestamptz - {start}) / {_f(SECONDS_PER_DAY)})"
    stability = (
        f"((CASE WHEN {m}.last_reviewed_at IS NULL THEN {initial}"
        f" ELSE GREATEST({m}.stability, {_f(MIN_STABILITY)}) END)"
        f" * ({one} + {_f(EMOTION_STRETCH)} * LEAST({one}, ABS({m}.emotional_valence))"
        f" * LEAST({one}, GREATEST({zero}, {m}.emotional_arousal))))"
    )
    importance = f"({_f(0.6)} * {base} + {_f(0.4)} * LEAST({one}, GREATEST({zero}, {m}.confidence)))"
    access = (f"LEAST({_f(ACCESS_CAP)}, {one} + {_f(ACCESS_WEIGHT)}"
              f" * LN({one} + GREATEST(0, {m}.times_accessed)::float8))")
    return f"LEAST({one}, {importance} * {access} / ({one} + {_f(FACTOR)} * {elapsed} / {stability}))"


def never_fades_sql(alias: str = "m") -> str:
    kinds = ", ".join(f"'{k}'" for k in sorted(NEVER_FADE_KINDS))
    return f"({alias}.is_protected OR {alias}.kind IN ({kinds}))"


# --- Reviews ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewOutcome:
    stability: float
    difficulty: float
    retrievability_before: float
    interval_days: int


def review(state: DecayState, difficulty: float, grade: Grade | int, now: datetime) -> ReviewOutcome:
    """The FSRS update for one explicit review at `now` (pure; `memories.lifecycle.reviews.record_review` stores it).

    The prior stability is the stored one (the kind's initial stability for a memory never
    reviewed) and R is read off the memory's own curve at `now`; a review less than a day after
    the previous one uses the same-day formula.
    """
    grade = Grade(int(grade))
    prior = base_stability(state)  # stored unstretched, so the stretch is never applied twice
    days = elapsed_days(state.baseline, now)
    r = retrievability(days, effective_stability(state))
    difficulty = _clamp(difficulty, MIN_DIFFICULTY, MAX_DIFFICULTY)
    if state.last_reviewed_at is not None and days < 1.0:
        new_stability = stability_same_day(prior, grade)
    elif grade == Grade.AGAIN:
        new_stability = stability_after_lapse(prior, difficulty, r)
    else:
        new_stability = stability_after_recall(prior, difficulty, r, grade)
    return ReviewOutcome(
        stability=new_stability,
        difficulty=next_difficulty(difficulty, grade),
        retrievability_before=r,
        interval_days=interval_days(new_stability),
    )
