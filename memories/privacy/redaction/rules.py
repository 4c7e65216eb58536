"""The redaction rules and their tables (docs/algorithms.md §11): the CRITICAL refusals (private keys,
`Authorization:` headers), the ordered secret and PII rules, the PII categories a school chooses
from, what an identifier may not hold, and the cheap pre-check (`suspicious`) that lets clean text
through without running any rule. A rule matches the folded text (`memories.privacy.redaction.folding`);
its gate, a few substring tests, decides whether its pattern is run at all. Which rules one school's
writes apply is `memories.privacy.redaction.policy`; applying them is `memories.privacy.redaction.engine`.
Patterns are compiled once, at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from memories.privacy.redaction.detectors import (
    card_number,
    jwt_header,
    library_phones,
    private_key_body,
    token_like,
)
from memories.privacy.redaction.folding import Span


class View:
    """A folded string and what the gates ask of it, each worked out once."""

    __slots__ = ("_digits", "_lowered", "text")

    def __init__(self, text: str):
        self.text = text
        self._lowered: str | None = None
        self._digits: bool | None = None

    @property
    def lowered(self) -> str:
        if self._lowered is None:
            self._lowered = self.text.lower()
        return self._lowered

    @property
    def digits(self) -> bool:
        if self._digits is None:
            self._digits = _DIGITS.search(self.text) is not None
        return self._digits


@dataclass(frozen=True)
class Gate:
    """Cheap tests one of which every match of a rule passes: a rule whose gate stays shut is not run
    on that string. No test at all: always run."""

    hints: tuple[str, ...] = ()  # substrings of the folded text
    lower: tuple[str, ...] = ()  # substrings of the folded text lower-cased
    digits: bool = False  # `_DIGITS` finds a run of digits

    def opens(self, view: View) -> bool:
        if not (self.hints or self.lower or self.digits):
            return True
        return (any(hint in view.text for hint in self.hints) or any(word in view.lowered for word in self.lower)
                or (self.digits and view.digits))


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    group: int = 0  # the group replaced (a label such as `api_key=` stays readable)
    check: Callable[[str], bool] | None = None  # on the replaced part, e.g. Luhn: a match that fails it stays
    in_ids: bool = True  # also applied to the entity-id columns (secrets are; PII and card numbers not)
    category: str = ""  # a PII category a school may switch off ("" : always applied)
    finder: Callable[[str], list[Span]] | None = None  # more matches than the pattern's (library-checked)
    gate: Gate = Gate()


@dataclass(frozen=True)
class Critical:
    """A refusal rule. `check` (on the match) must hold too; `block`: what `redact_secrets` replaces
    instead of refusing (a whole key block, not only its header)."""

    name: str
    pattern: re.Pattern[str]
    check: Callable[[re.Match[str]], bool] | None = None
    block: re.Pattern[str] | None = None
    gate: Gate = Gate()


_TOKEN = r"[A-Za-z0-9\-._~+/]+=*"  # noqa: S105 (a token's shape, not a password)
_KEY_TYPES = r"(?:(?:RSA|DSA|EC|ECDSA|OPENSSH|ENCRYPTED|SSH2|ED25519|ED448|X25519|X448|DH|OPENSSL|SM2)\s+){0,2}"
# Authorization schemes: Bearer and Basic refuse whatever follows; the others (and a bare value)
# only what looks like a credential (`token_like`), so "Authorization: pending" stays prose.
_AUTH_SCHEMES = (r"(?:token|digest|negotiate|ntlm|oauth|jwt|apikey|api-key|key|dpop|mac|hoba|vapid|gnap"
                 r"|aws4-hmac-sha256|hmac(?:-sha\d+)?|sharedkey|sso-key|splunk|privatetoken|scram-sha-\d+)")
_AUTH_VALUE_BODY = (r"(?:(?:bearer|basic)\s+(" + _TOKEN + r")|" + _AUTH_SCHEMES + r"\s+(" + _TOKEN + r")|("
                    + _TOKEN + r"))")


def auth_value(match: re.Match[str]) -> bool:
    bearer_or_basic, scheme_token, bare = match.group(1, 2, 3)
    if bearer_or_basic:
        return True
    if scheme_token:
        return token_like(scheme_token)
    return bool(bare) and token_like(bare, 16)


# Private-key headers in any case, with any number of dashes (2+), BEGIN or END; PuTTY key files and
# encrypted PEM's Proc-Type and DEK-Info lines (its body is ciphertext: nothing else tells it apart).
_KEY_MARK = (r"-{2,}\s*(?:BEGIN|END)\s+" + _KEY_TYPES + r"PRIVATE\s+KEY|PuTTY-User-Key-File-\d"
             r"|Proc-Type:\s*4,\s*ENCRYPTED|DEK-Info:\s*[A-Z0-9\-]+,[0-9A-F]{16}")
_KEY_BLOCK = (r"(?:-{2,}\s*BEGIN\s+" + _KEY_TYPES + r"PRIVATE\s+KEY|PuTTY-User-Key-File-\d|Proc-Type:\s*4,\s*ENCRYPTED)"
              r".*?(?:END\s+" + _KEY_TYPES + r"PRIVATE\s+KEY[^\n]*|Private-MAC:[^\n]*|\Z)")

_KEY_GATE = Gate(lower=("private", "putty", "proc-type", "dek-info"))

# docs/algorithms.md §11.1: refuse the write.
CRITICAL: tuple[Critical, ...] = (
    Critical("pgp_private_key", re.compile(r"(?i)-{2,}\s*(?:BEGIN|END)\s+PGP\s+PRIVATE\s+KEY"), gate=_KEY_GATE,
             block=re.compile(r"(?is)-{2,}\s*BEGIN\s+PGP\s+PRIVATE\s+KEY.*?(?:END\s+PGP\s+PRIVATE\s+KEY[^\n]*|\Z)")),
    Critical("ssh_private_key", re.compile(r"(?i)" + _KEY_MARK), block=re.compile(r"(?is)" + _KEY_BLOCK),
             gate=_KEY_GATE),
    Critical("private_key_body", re.compile(
        r"(?<![A-Za-z0-9+/])(?:[Mlx]|b3Bl)[A-Za-z0-9+/]{59,}(?:\s{1,3}[A-Za-z0-9+/]{16,})*={0,2}"),
             check=lambda match: private_key_body(match.group(0))),
    Critical("auth_header", re.compile(r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?" + _AUTH_VALUE_BODY),
             check=auth_value, gate=Gate(lower=("authoriz",))),
)
AUTH_VALUE = re.compile(r"(?i)^\s*" + _AUTH_VALUE_BODY)


def critical_spans(critical: Critical, view: View) -> list[Span]:
    if not critical.gate.opens(view):
        return []
    spans = []
    for match in critical.pattern.finditer(view.text):
        if critical.check is None or critical.check(match):
            spans.append(match.span())
    return spans


# E-mail addresses: the usual shape with Unicode letters (`jörg@beispiel.de`, IDN domains), and the
# obfuscated ones — `ada (at) example (dot) org`, `ada[at]example.org`, and with plain words
# (`ada at example dot org`) only when a common top-level domain ends it, so a sentence with "at"
# and "dot" stays as it is.
_AT_BRACKETED = r"\s*[(\[{<](?i:at)[)\]}>]\s*"
_DOT_BRACKETED = r"\s*[(\[{<](?i:dot)[)\]}>]\s*"
_DOT_ANY = r"(?:\.|" + _DOT_BRACKETED + r"| +(?i:dot) +)"
_DOT_WORDY = r"(?:" + _DOT_BRACKETED + r"| +(?i:dot) +)"
_LABEL = r"[\w\-]+"
_COMMON_TLDS = (r"(?i:com|org|net|edu|gov|mil|info|biz|io|co|uk|de|fr|es|it|nl|eu|ie|ch|be|us|ca|au|nz|in|"
                r"me|ac|sch|email|mail)")
_EMAIL_WORDS = ("(at)", "[at]", "{at}", "<at>", " dot ", "(dot)", "[dot]", "{dot}", "<dot>")
_EMAIL = re.compile(
    r"(?<![\w.%+\-])[\w.%+\-]+(?:"
    r"@" + _LABEL + r"(?:" + _DOT_ANY + _LABEL + r")*" + _DOT_ANY + r"(?:[^\W\d_]{2,}|xn--[A-Za-z0-9\-]+)\b"
    r"|" + _AT_BRACKETED + _LABEL + r"(?:" + _DOT_ANY + _LABEL + r")*" + _DOT_ANY + r"[^\W\d_]{2,}\b"
    r"| +(?i:at) +" + _LABEL + r"(?:" + _DOT_WORDY + _LABEL + r")*" + _DOT_WORDY + _COMMON_TLDS + r"\b)")

# A JWT's first segment: `{"` (`eyJ`), `{ "`, or `{` and a line break, in base64url.
_JWT_STARTS = ("eyJ", "eyAi", "ewog", "ewoJ", "ewoi", "ew0K")

# docs/algorithms.md §11.2, in the order they apply: the secrets (the §10.2 order, MemoryHub's own
# key shapes after GitHub's, the JWT before any PII rule can cut a token apart), then the PII.
# Card numbers count as a secret (always redacted): a card number is a payment credential whose
# storage no school purpose needs (PCI DSS keeps it out of systems like this), not a contact detail
# a school may want its tutors to remember. Distinctive key prefixes need no word boundary: a key
# glued to a word (`keyAKIA…`, `AKIA…_prod`) is still a key.
RULES: tuple[Rule, ...] = (
    Rule("api_key", re.compile(r"(?i)\bapi[_-]?key[\"']?\s*[=:]\s*[\"']?([A-Za-z0-9_\-]{32,})"), group=1,
         gate=Gate(lower=("api",))),
    Rule("aws_access_key", re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"), gate=Gate(hints=("AKIA", "ASIA"))),
    Rule("aws_secret_key", re.compile(
        r"(?i)aws_?secret_?(?:access_?)?key[\"']?\s*[=:]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"), group=1,
         gate=Gate(lower=("secret",))),
    Rule("github_token", re.compile(r"(?:gh[pousr]_|github_pat_)[A-Za-z0-9_]{36,}")),
    Rule("knl_api_key", re.compile(r"knl_sk_[A-Za-z0-9]{16,}")),
    Rule("sk_secret_key", re.compile(r"(?<![A-Za-z0-9])sk[-_](?:proj-|ant-|live_|test_)?[A-Za-z0-9_\-]{20,}")),
    Rule("slack_token", re.compile(r"xox[abprse]-[A-Za-z0-9\-]{10,}")),
    Rule("google_api_key", re.compile(r"AIza[0-9A-Za-z_\-]{35}")),
    # A bare bearer token outside an Authorization header: redacted, not refused (§11.1). The token
    # must look like one (`token_like`) so prose ("the bearer of bad news") is left alone.
    Rule("bearer_token", re.compile(r"(?i)\bbearer[\"']?\s*[:=]?\s*([A-Za-z0-9\-._~+/]{8,}=*)"), group=1,
         check=token_like, gate=Gate(lower=("bearer",))),
    Rule("jwt", re.compile(r"(?:" + "|".join(_JWT_STARTS) + r")[A-Za-z0-9_\-]{4,}={0,2}\.[A-Za-z0-9_\-]{2,}={0,2}"
                           r"\.[A-Za-z0-9_\-]*"), check=jwt_header, gate=Gate(hints=_JWT_STARTS)),
    Rule("email", _EMAIL, in_ids=False, category="EMAIL", gate=Gate(hints=("@",), lower=_EMAIL_WORDS)),
    Rule("credit_card", re.compile(r"(?<!\d)(?<!\d[./\-])\d(?:[ ./\-]?\d){12,18}(?!\d|[./\-]\d)"), check=card_number,
         in_ids=False, gate=Gate(digits=True)),
    Rule("phone", re.compile(
        r"(?<![\w+])(?:\+?1[-.\s]?)?(?:\(\d{3}\)\s?|\d{3}[-.\s]?)\d{3}[-.\s]?\d{4}(?!\d)"
        r"|(?<![\w+])\+[2-9]\d{0,2}[-.\s]?\d{1,4}(?:[-.\s]?\d{2,4}){2,3}(?!\d)"), in_ids=False, category="PHONE",
         finder=library_phones, gate=Gate(digits=True)),
    Rule("ip_address", re.compile(
        r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])"),
         in_ids=False, category="IP_ADDRESS", gate=Gate(digits=True)),
)
RULE_NAMES = tuple(rule.name for rule in RULES)

# What an identifier may not hold (`refuse_sensitive_identifier`): the CRITICAL rules, every secret
# rule that applies to ids, and e-mail addresses. Not phone, card or IP numbers: ids are often
# numeric (timestamps, counters) and those rules would refuse ordinary ones.
IDENTIFIER_RULES = tuple(rule for rule in RULES if rule.in_ids or rule.category == "EMAIL")

# Hex digits and dashes, shorter than a private key body's run (kernle's record ids are UUIDs): no
# rule in IDENTIFIER_RULES or CRITICAL can match such a string. Each needs a letter past `f`, an `@`,
# an `_` or a run of 60 base64 characters. tests/memories/test_redaction.py checks this against the
# rules themselves, so a new rule that could match one fails there.
_PLAIN_IDENTIFIER = re.compile(r"[0-9A-Fa-f-]{1,59}")


def plain_identifier(value: str) -> bool:
    """`value` cannot hold anything `refuse_sensitive_identifier` refuses: skip the rules."""
    return _PLAIN_IDENTIFIER.fullmatch(value) is not None


# The PII categories a school chooses from (Organization.redaction_categories), in rule order. These
# names are stable: they are stored in schools' settings and are the placeholders' names. Every
# other rule — and every CRITICAL refusal — applies whatever a school chose.
PII_CATEGORIES: tuple[str, ...] = tuple(rule.category for rule in RULES if rule.category)


# The cheap pre-check (`suspicious`, on folded text): substring tests and two searches that find
# nothing in clean prose. Together a superset of every rule's necessary part (and of an existing
# placeholder, so a redacted record keeps its report), run over the record's JSON renderings — hence
# the slack for escapes such as `\n` between digits. Not one combined regex, which is much slower
# (docs/algorithms.md §11.5): an alternation without a common literal prefix is tried at every position.
_LITERALS = ("@", "<REDACTED:", "--", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
             "github_pat_", "knl_sk_", "sk-", "sk_", "xox", "AIza", *_JWT_STARTS, "PuTTY", "Proc-Type",
             "DEK-Info")
# in lower-cased text: labels, and the obfuscated e-mail separators
_WORDS = ("api_key", "apikey", "api-key", "secret", "bearer", "authoriz", *_EMAIL_WORDS)
_DIGITS = re.compile(r"\d(?:\D{0,3}\d){5}|\d\.\d+\.\d")  # phones (6+ digits), cards, dotted quads
# A private key's body without its header starts with a line of 60+ base64 characters (a PEM line is 64,
# OpenSSH's 70; in the JSON renderings line breaks are `\n` escapes): some whitespace-free word is
# that long.
# Splitting is 3x cheaper than a search for such a run.
_KEY_BODY_WORD = 60


def suspicious(text: str) -> bool:
    """`text` (folded) may hold something a rule matches."""
    for literal in _LITERALS:
        if literal in text:
            return True
    lowered = text.lower()
    for word in _WORDS:
        if word in lowered:
            return True
    return _DIGITS.search(text) is not None or max(map(len, text.split()), default=0) >= _KEY_BODY_WORD


def rule_spans(rule: Rule, view: View) -> list[Span]:
    """Where `rule` matches the folded text: the replaced group of each match its check accepts, and
    its finder's matches that overlap none of them — in order."""
    if not rule.gate.opens(view):
        return []
    text = view.text
    spans = []
    for match in rule.pattern.finditer(text):
        if rule.check is None or rule.check(match.group(rule.group)):
            spans.append(match.span(rule.group))
    if rule.finder is not None:
        found = rule.finder(text)
        if found:
            merged: list[Span] = []
            for start, end in sorted(spans + found):
                if merged and start < merged[-1][1]:
                    continue
                merged.append((start, end))
            spans = merged
    return spans
