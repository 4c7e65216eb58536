"""Redaction applied (docs/algorithms.md §11; the contract is the package docstring,
memories.privacy.redaction): `redact_text` / `redact_value` for one string or JSON value,
`redact_memory` for a whole `NormalizedMemory` (the write kernel's step), `redact_secrets` for kept
originals, `refuse_sensitive_identifier` for ids that cannot be rewritten, `redaction_preview` for
the dry run, and the two refusals (`RedactionRefused` 422, `SensitiveIdentifier` 400), which name
the rule and the field, never the value.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from functools import cache
from typing import Any

from django.conf import settings

from memories.privacy.redaction.folding import Folded, fold, fold_mapped, substitute
from memories.privacy.redaction.policy import ALL_CATEGORIES, SECRETS_ONLY, RedactionPolicy
from memories.privacy.redaction.rules import (
    AUTH_VALUE,
    CRITICAL,
    IDENTIFIER_RULES,
    RULE_NAMES,
    Rule,
    View,
    auth_value,
    critical_spans,
    plain_identifier,
    rule_spans,
    suspicious,
)
from memories.records.normalize import NormalizedMemory, assemble_memory, normalize_memory
from memoryhub.errors import InvalidInput, Unprocessable

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


class SensitiveIdentifier(InvalidInput):
    """An identifier (a record id, a boot-config key name) holding a secret or personal data. It
    cannot be redacted — a rewritten id would break the client's sync — so it is refused (400).
    Names the rule, never the value."""

    code = "sensitive_identifier"

    def __init__(self, rule: str, field: str):
        label = field.rsplit(".", 1)[-1].replace("_", " ")
        super().__init__(
            f"Refused: the {label} looks like it holds a secret or personal data ({rule}). Ids are stored and "
            "returned as sent, so they cannot be redacted; use an opaque id such as a UUID. Nothing was stored.",
            fields={field: [f"Matches the redaction rule {rule}."]})
        self.rule = rule


@cache
def _disabled() -> bool:
    """The benchmark-only switch (the package docstring); settings decide whether it may be honoured."""
    return bool(getattr(settings, "REDACTION_OFF_FOR_BENCH", False))


# Columns that hold entity ids (grants match them exactly) or record ids: secrets are redacted
# there too, PII is not (an id must stay the id the grant rules compare).
_ID_COLUMNS = ("subject_ids", "access_grants", "consent_grants", "derived_from", "source_episodes")
_TEXT_COLUMNS = ("tags", "emotional_tags", "source_entity")


def redact_text(text: str, *, field: str = "", secrets_only: bool = False,
                counts: Counter[str] | None = None, policy: RedactionPolicy | None = None) -> str:
    """One string: CRITICAL → `RedactionRefused`; otherwise the policy's rules in order (every rule
    without one; with `secrets_only` those for entity-id columns) on the folded text, each match
    replaced in the original. `counts` (if given) gains one per replacement."""
    folded = fold_mapped(text)
    if not suspicious(folded.text):  # most strings of a record that needs a scan: cheaper than every rule
        return text
    view = View(folded.text)
    for critical in CRITICAL:
        if critical_spans(critical, view):
            raise RedactionRefused(critical.name, field)
    return _apply_rules(text, folded, (policy or ALL_CATEGORIES).id_rules if secrets_only
                        else (policy or ALL_CATEGORIES).rules, counts)


def _apply_rules(text: str, folded: Folded, rules: tuple[Rule, ...], counts: Counter[str] | None) -> str:
    view = View(folded.text)
    for rule in rules:
        spans = rule_spans(rule, view)
        if not spans:
            continue
        text, hits = substitute(text, folded, spans, PLACEHOLDER.format(rule.name.upper()))
        folded = fold_mapped(text) if folded.origin is not None else Folded(text, None)
        view = View(folded.text)
        if counts is not None and hits:
            counts[rule.name] += hits
    return text


def redact_secrets(text: str) -> str:
    """`text` without any secret, whatever a school chose, and never refused: CRITICAL matches are
    replaced too (a private key's whole block). For kept originals (memories.privacy.originals): they keep
    the PII a school redacts, never a secret."""
    folded = fold_mapped(text)
    if not suspicious(folded.text):
        return text
    for critical in CRITICAL:
        spans = critical_spans(critical, View(folded.text))
        if spans:
            if critical.block is not None:
                spans = [match.span() for match in critical.block.finditer(folded.text)] or spans
            text, _ = substitute(text, folded, spans, PLACEHOLDER.format(critical.name.upper()))
            folded = fold_mapped(text)
    return _apply_rules(text, folded, SECRETS_ONLY.rules, None)


def refuse_sensitive_identifier(value: str, *, field: str) -> str:
    """`value`, an identifier that cannot be rewritten (a record id, a boot-config key name), or
    `SensitiveIdentifier` (400 `sensitive_identifier`) when it holds a secret (a CRITICAL one
    included) or an e-mail address."""
    if plain_identifier(value):  # a UUID, as kernle's record ids are: no rule can match it
        return value
    folded = fold(value)
    if not suspicious(folded):
        return value
    view = View(folded)
    for critical in CRITICAL:
        if critical_spans(critical, view):
            raise SensitiveIdentifier(critical.name, field)
    for rule in IDENTIFIER_RULES:
        if rule_spans(rule, view):
            raise SensitiveIdentifier(rule.name, field)
    return value


def redact_value(value: Any, *, field: str = "", secrets_only: bool = False,
                 counts: Counter[str] | None = None, policy: RedactionPolicy | None = None) -> Any:
    """A JSON value (strings, lists, dicts — keys included — at any depth) with every string redacted.
    A dict key naming an Authorization header with a credential as its value is CRITICAL too."""
    if isinstance(value, str):
        return redact_text(value, field=field, secrets_only=secrets_only, counts=counts, policy=policy)
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            path = f"{field}.{key}" if field else str(key)
            if isinstance(key, str) and isinstance(item, str) and "authoriz" in fold(key).lower():
                match = AUTH_VALUE.match(fold(item))
                if match is not None and auth_value(match):
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
    """One `suspicious` over the record's data and extra JSON (already rendered by the schema) and
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
    return suspicious(fold("\n".join(parts)))


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
