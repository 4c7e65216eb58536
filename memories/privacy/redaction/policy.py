"""Which redaction rules one school's writes apply (docs/privacy.md "Redaction"): every secret rule
always, and the PII categories the school chose (`Organization.redaction_categories`; None: all of
them). Writers resolve a `RedactionPolicy` once per request or batch (`stack_policy`) and hand it to
the write kernel; `SECRETS_ONLY` is what a kept original must not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from memories.privacy.redaction.rules import PII_CATEGORIES, RULES, Rule
from memoryhub.errors import InvalidInput

if TYPE_CHECKING:
    from stacks.models import Stack


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
# The secret rules alone (card numbers included): what a kept original must not hold.
SECRETS_ONLY = _policy(frozenset())
