"""Redaction at ingest: secrets and PII become typed placeholders before anything is derived.

docs/algorithms.md §11 has the rules. The one entry point for free text and JSON values is
`redact_value` (value in → redacted value + report); `redact_memory` applies it to a whole
`NormalizedMemory` and is called by the write kernel itself (`memories.writes.hooks.prepare_memory`),
so every memory write path (native create / update / batch, kernle and native sync push, smart
ingest, promotion) redacts before the row, its full-text vector, its embedding input, its
revisions or its change events exist. Checkpoints and boot config call `redact_value` in their
services.

* A CRITICAL match (private-key blocks, `Authorization:` headers) raises `RedactionRefused`
  (422 `redaction_refused`, naming the rule and the field, never the value): nothing is stored.
* Every other match becomes `<REDACTED:RULE>`; the report is `[{"rule", "count"}]`, never a value.
  For a memory the report counts the placeholders in the final record, so re-normalising an
  already redacted record (sync merges list fields into stored records) is idempotent and keeps
  its report.
* Per school (docs/privacy.md "Redaction"): secrets — every key and token shape, JWTs and
  Luhn-checked card numbers — are always redacted, and CRITICAL refusals always apply; the PII
  categories (`PII_CATEGORIES`: e-mail addresses, phone numbers, IP addresses) are the school's
  choice, `Organization.redaction_categories` (None: all of them). A `RedactionPolicy` carries that
  choice: writers resolve it once per request or batch (`stack_policy`, from the stack row and the
  organization it was loaded with) and hand it to the kernel.
* Speed: the patterns are compiled once, and one combined trigger search over the record's JSON
  renderings (which the schema already made) lets clean records through without walking them.
* For benchmarks only, `MEMORYHUB_REDACTION=off` turns the kernel's step off (bench/redaction.py
  measures a push with and without it); settings refuse it outside a benchmark run on development
  secrets (`memoryhub.settings.REDACTION_OFF_FOR_BENCH`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings

from memories.schemas import NormalizedMemory, assemble_memory, normalize_memory
from memoryhub.errors import InvalidInput, Unprocessable

if TYPE_CHECKING:
    from stacks.models import Stack

PLACEHOLDER = "<REDACTED:{}>"
_PLACEHOLDER = re.compile(r"<REDACTED:([A-Z0-9_]+)>")


class RedactionRefused(Unprocessable):
    """A CRITICAL secret: the write is refused and nothing is stored. Names the rule, never the value."""

    code = "redaction_refused"

    def __init__(self, rule: str, field: str):
        super().__init__(
            f"Refused: the content contains a secret that is never stored ({rule}); nothing was stored.",
            fields={field or "non_field_errors": [f"Matches the CRITICAL rule {rule}."]})
        self.rule = rule


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    group: int = 0  # the group replaced (a label such as `api_key=` stays readable)
    check: Callable[[str], bool] | None = None  # e.g. Luhn: a match that fails it is left alone
    in_ids: bool = True  # also applied to the entity-id columns (secrets are; PII and card numbers not)
    category: str = ""  # a PII category a school may switch off ("" : always applied)


def _luhn(candidate: str) -> bool:
    digits = [int(c) for c in candidate if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


_TOKEN = r"[A-Za-z0-9\-._~+/]+=*"  # noqa: S105 (a token's shape, not a password)

# docs/algorithms.md §11.1: refuse the write.
CRITICAL: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ssh_private_key", re.compile(r"-----BEGIN (?:RSA |DSA |EC |OPENSSH |ENCRYPTED )?PRIVATE KEY-----")),
    ("pgp_private_key", re.compile(r"-----BEGIN PGP PRIVATE KEY BLOCK-----")),
    ("auth_header", re.compile(r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic)\s+" + _TOKEN)),
)
_AUTH_VALUE = re.compile(r"(?i)^\s*(?:bearer|basic)\s+" + _TOKEN)

# docs/algorithms.md §11.2, in the order they apply: the secrets (the §10.2 order, MemoryHub's own
# key shapes after GitHub's, the JWT before any PII rule can cut a token apart), then the PII.
# Card numbers count as a secret (always redacted): a card number is a payment credential whose
# storage no school purpose needs (PCI DSS keeps it out of systems like this), not a contact detail
# a school may want its tutors to remember.
RULES: tuple[Rule, ...] = (
    Rule("api_key", re.compile(r"(?i)\bapi[_-]?key[\"']?\s*[=:]\s*[\"']?([A-Za-z0-9_\-]{32,})"), group=1),
    Rule("aws_access_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    Rule("aws_secret_key", re.compile(
        r"(?i)\baws_?secret_?(?:access_?)?key[\"']?\s*[=:]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"), group=1),
    Rule("github_token", re.compile(r"\b(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{36,}")),
    Rule("knl_api_key", re.compile(r"\bknl_sk_[A-Za-z0-9]{16,}")),
    Rule("sk_secret_key", re.compile(r"\bsk[-_](?:proj-|ant-|live_|test_)?[A-Za-z0-9_\-]{20,}")),
    Rule("slack_token", re.compile(r"\bxox[abprse]-[A-Za-z0-9\-]{10,}")),
    Rule("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    # A bare bearer token outside an Authorization header: redacted, not refused (§11.1). The token
    # must hold a digit so prose ("the bearer of bad news") is left alone.
    Rule("bearer_token", re.compile(r"(?i)\bbearer\s+((?=[A-Za-z0-9\-._~+/]*\d)[A-Za-z0-9\-._~+/]{8,}=*)"), group=1),
    Rule("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),
    Rule("email", re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b"),
         in_ids=False, category="EMAIL"),
    Rule("credit_card", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), check=_luhn, in_ids=False),
    Rule("phone", re.compile(
        r"(?<![\w+])(?:\+?1[-.\s]?)?(?:\(\d{3}\)\s?|\d{3}[-.\s]?)\d{3}[-.\s]?\d{4}(?!\d)"
        r"|(?<![\w+])\+[2-9]\d{0,2}[-.\s]?\d{1,4}(?:[-.\s]?\d{2,4}){2,3}(?!\d)"), in_ids=False, category="PHONE"),
    Rule("ip_address", re.compile(
        r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])"),
         in_ids=False, category="IP_ADDRESS"),
)
RULE_NAMES = tuple(rule.name for rule in RULES)

# The PII categories a school chooses from (Organization.redaction_categories), in rule order. These
# names are stable: they are stored in schools' settings and are the placeholders' names. Every
# other rule — and every CRITICAL refusal — applies whatever a school chose.
PII_CATEGORIES: tuple[str, ...] = tuple(rule.category for rule in RULES if rule.category)


def redaction_categories_validated(value: Any) -> list[str] | None:
    """A school's PII category choice as stored: None (every category, the default) or a list of
    `PII_CATEGORIES` names (case-insensitive in, upper-case, deduplicated and in rule order out;
    an empty list redacts no PII — secrets still are). `InvalidInput` names unknown categories."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise InvalidInput("Redaction categories must be a list of names.", code="invalid",
                           fields={"redaction_categories": [f"A list of: {', '.join(PII_CATEGORIES)}."]})
    chosen = {item.strip().upper() for item in value}
    unknown = sorted(chosen - set(PII_CATEGORIES))
    if unknown:
        raise InvalidInput("Unknown redaction categories.", code="invalid", fields={"redaction_categories": [
            f"Unknown: {', '.join(unknown)}. Choose from {', '.join(PII_CATEGORIES)} "
            "(secrets are always redacted)."]})
    return [name for name in PII_CATEGORIES if name in chosen]


@dataclass(frozen=True)
class RedactionPolicy:
    """The rules one school's writes apply: every secret rule plus its PII categories."""

    categories: frozenset[str]
    rules: tuple[Rule, ...]  # in order, for free text
    id_rules: tuple[Rule, ...]  # in order, for the entity-id columns


@cache
def _policy(categories: frozenset[str]) -> RedactionPolicy:
    rules = tuple(rule for rule in RULES if not rule.category or rule.category in categories)
    return RedactionPolicy(categories=categories, rules=rules, id_rules=tuple(r for r in rules if r.in_ids))


def policy_for(categories: Any) -> RedactionPolicy:
    """The policy of a stored choice (`Organization.redaction_categories`). A stored value that is no
    longer valid (a category since renamed) redacts everything rather than failing a write."""
    if categories is None:
        return ALL_CATEGORIES
    try:
        chosen = redaction_categories_validated(categories)
    except InvalidInput:
        return ALL_CATEGORIES
    return _policy(frozenset(chosen or ()))


def stack_policy(stack: Stack) -> RedactionPolicy:
    """The policy of the school owning `stack`: resolve it once per request or batch. Reads
    `stack.organization`, which the access decision (stacks.selectors) loads with the stack."""
    return policy_for(stack.organization.redaction_categories)


ALL_CATEGORIES = _policy(frozenset(PII_CATEGORIES))


@cache
def _disabled() -> bool:
    """The benchmark-only switch (module docstring); settings decide whether it may be honoured."""
    return bool(getattr(settings, "REDACTION_OFF_FOR_BENCH", False))

# The cheap pre-check (`_suspicious`): substring tests and one digit search that find nothing in
# clean text. Together a superset of every rule's necessary part (and of an existing placeholder, so
# a redacted record keeps its report), run over the record's JSON renderings — hence the slack for
# escapes such as `\n` between digits. One combined regex was measured 5x slower: an alternation
# without a common literal prefix is tried at every position.
_LITERALS = ("@", "<REDACTED:", "-----BEGIN", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
             "github_pat_", "knl_sk_", "sk-", "sk_", "xox", "AIza", "eyJ")
_WORDS = ("api_key", "apikey", "api-key", "secret", "bearer", "authoriz")  # in lower-cased text
_DIGITS = re.compile(r"\d(?:\D{0,3}\d){5}|\d\.\d+\.\d")  # phones (6+ digits), cards, dotted quads


def _suspicious(text: str) -> bool:
    for literal in _LITERALS:
        if literal in text:
            return True
    lowered = text.lower()
    for word in _WORDS:
        if word in lowered:
            return True
    return _DIGITS.search(text) is not None


# Columns that hold entity ids (grants match them exactly) or record ids: secrets are redacted
# there too, PII is not (an id must stay the id the grant rules compare).
_ID_COLUMNS = ("subject_ids", "access_grants", "consent_grants", "derived_from", "source_episodes")
_TEXT_COLUMNS = ("tags", "emotional_tags", "source_entity")


def redact_text(text: str, *, field: str = "", secrets_only: bool = False,
                counts: Counter[str] | None = None, policy: RedactionPolicy | None = None) -> str:
    """One string: CRITICAL → `RedactionRefused`; otherwise the policy's rules in order (every rule
    without one; with `secrets_only` those for entity-id columns). `counts` (if given) gains one
    per replacement."""
    for name, pattern in CRITICAL:
        if pattern.search(text) is not None:
            raise RedactionRefused(name, field)
    policy = policy or ALL_CATEGORIES
    for rule in policy.id_rules if secrets_only else policy.rules:
        if rule.pattern.search(text) is None:
            continue
        text, hits = _apply(rule, text)
        if counts is not None and hits:
            counts[rule.name] += hits
    return text


def _apply(rule: Rule, text: str) -> tuple[str, int]:
    placeholder = PLACEHOLDER.format(rule.name.upper())
    hits = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal hits
        if rule.check is not None and not rule.check(match.group(0)):
            return match.group(0)
        hits += 1
        if rule.group:
            start, end = match.span(rule.group)
            base = match.start()
            whole = match.group(0)
            return whole[:start - base] + placeholder + whole[end - base:]
        return placeholder

    return rule.pattern.sub(replace, text), hits


def redact_value(value: Any, *, field: str = "", secrets_only: bool = False,
                 counts: Counter[str] | None = None, policy: RedactionPolicy | None = None) -> Any:
    """A JSON value (strings, lists, dicts — keys included — at any depth) with every string redacted.
    A dict key naming an Authorization header with a bearer/basic value is CRITICAL too."""
    if isinstance(value, str):
        return redact_text(value, field=field, secrets_only=secrets_only, counts=counts, policy=policy)
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            path = f"{field}.{key}" if field else str(key)
            if (isinstance(key, str) and isinstance(item, str) and "authoriz" in key.lower()
                    and _AUTH_VALUE.match(item)):
                raise RedactionRefused("auth_header", path)
            new_key = redact_text(key, field=path, secrets_only=secrets_only, counts=counts, policy=policy) \
                if isinstance(key, str) else key
            result[new_key] = redact_value(item, field=path, secrets_only=secrets_only, counts=counts, policy=policy)
        return result
    if isinstance(value, list):
        return [redact_value(item, field=field, secrets_only=secrets_only, counts=counts, policy=policy)
                for item in value]
    return value


def report_of(counts: Counter[str]) -> list[dict[str, Any]]:
    """[{"rule", "count"}] in rule order; never a value."""
    known = [{"rule": name, "count": counts[name]} for name in RULE_NAMES if counts.get(name)]
    others = [{"rule": name, "count": n} for name, n in sorted(counts.items()) if name not in RULE_NAMES and n]
    return known + others


def _needs_scan(normalized: NormalizedMemory) -> bool:
    """One `_suspicious` over the record's data and extra JSON (already rendered by the schema) and
    its text columns, joined: one pass costs less than three."""
    parts = [normalized.data_json if normalized.data_json is not None
             else json.dumps(normalized.data, ensure_ascii=False, default=str)]
    if normalized.extra:
        parts.append(normalized.extra_json if normalized.extra_json is not None
                     else json.dumps(normalized.extra, ensure_ascii=False, default=str))
    columns = normalized.columns
    for name in (*_TEXT_COLUMNS, *_ID_COLUMNS):
        value = columns.get(name)
        if value:
            parts.append(value if isinstance(value, str) else "\n".join(value))
    return _suspicious("\n".join(parts))


def redact_memory(normalized: NormalizedMemory, policy: RedactionPolicy) -> NormalizedMemory:
    """The kernel's redaction step under a school's policy: a self-consistent, redacted
    NormalizedMemory (text, JSON and size rebuilt from the redacted fields) carrying its report.
    Idempotent."""
    if _disabled() or not _needs_scan(normalized):
        return normalized
    counts: Counter[str] = Counter()
    data = redact_value(normalized.data, counts=counts, policy=policy)
    extra = redact_value(normalized.extra, field="extra", counts=counts, policy=policy)
    columns = dict(normalized.columns)
    for name in _TEXT_COLUMNS:
        if columns.get(name):
            columns[name] = redact_value(columns[name], field=name, counts=counts, policy=policy)
    for name in _ID_COLUMNS:
        if columns.get(name):
            columns[name] = redact_value(columns[name], field=name, secrets_only=True, counts=counts, policy=policy)
    # The report counts the placeholders now in the record: what this write redacted plus what an
    # earlier write did (a stored, redacted record normalised again keeps its report).
    final: Counter[str] = Counter()
    _count_placeholders(data, final)
    _count_placeholders(extra, final)
    for name in (*_TEXT_COLUMNS, *_ID_COLUMNS):
        _count_placeholders(columns.get(name), final)
    if not counts and not final:
        return normalized  # a trigger without a match (an "@" in prose): nothing changed
    rebuilt = assemble_memory(normalized.kind, columns, data, extra) if counts else normalized
    return dataclasses.replace(rebuilt, redaction_report=report_of(
        Counter({name.lower(): n for name, n in final.items()})))


def _count_placeholders(value: Any, counts: Counter[str]) -> None:
    if isinstance(value, str):
        if "<REDACTED:" in value:
            counts.update(_PLACEHOLDER.findall(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            _count_placeholders(key, counts)
            _count_placeholders(item, counts)
    elif isinstance(value, list):
        for item in value:
            _count_placeholders(item, counts)


def redaction_preview(kind: str, record: dict[str, Any], policy: RedactionPolicy) -> dict[str, Any]:
    """The dry run (POST …/redaction/preview): the record as a create into the stack would store it
    under its school's policy — the schema's errors, `RedactionRefused` for a CRITICAL secret — and
    its report. Stores nothing."""
    normalized = redact_memory(normalize_memory(kind, record), policy)
    return {"kind": kind, "text": normalized.text, "data": normalized.data, "extra": normalized.extra,
            "tags": normalized.columns.get("tags", []), "redaction": normalized.redaction_report,
            "stored": False}
