"""Redaction at ingest: secrets and PII become typed placeholders before anything is derived.

docs/algorithms.md §11 has the rules. The one entry point for free text and JSON values is
`redact_value` (value in → redacted value + report); `redact_memory` applies it to a whole
`NormalizedMemory` and is called by the write kernel itself (`memories.writes.hooks.prepare_memory`),
so every memory write path (native create / update / batch, kernle and native sync push, smart
ingest, promotion) redacts before the row, its full-text vector, its embedding input, its
revisions or its change events exist. Checkpoints, boot-config values and forget reasons call
`redact_value` / `redact_text` in their services.

* **What the rules see** (`_folded`): each string NFKC-normalised (fullwidth letters and digits,
  ligatures, no-break spaces become their plain forms) with the invisible characters removed
  (zero-width space / joiners, word joiner, BOM, soft hyphen: `_INVISIBLE`). A match is mapped back
  onto the original characters, so only what matched is replaced: the rest of the text is stored
  exactly as sent. ASCII text is its own fold and costs nothing more.
* A CRITICAL match (private keys — a PEM/PGP/PuTTY header in any case or dash count, or a bare
  base64 body that decodes to a private key's structure — and `Authorization:` headers with any
  scheme) raises `RedactionRefused` (422 `redaction_refused`, naming the rule and the field, never
  the value): nothing is stored.
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
* **Identifiers cannot be rewritten** (a record id is how the client syncs; a boot-config key name
  is how it reads its setting back): `refuse_sensitive_identifier` refuses one holding a secret or
  an e-mail address with 400 `sensitive_identifier`, naming the rule, never the value.
* **Kept originals** (memories.privacy.originals) never hold a secret: `redact_secrets` is the secret rules
  alone (the PII a school redacts is what an original is kept for), replacing CRITICAL matches
  instead of refusing them.
* Phone numbers: a pattern for the North-American and `+<country>` shapes, and for national
  numbers (UK, Germany: `020 7946 0958`, `030/12345678`, `+49 (0)30 …`) a pattern that finds
  candidates which Google's libphonenumber (`phonenumbers`) must then accept as a valid number, so
  dates, scores and version numbers are left alone.
* Speed: the patterns are compiled once, and one combined trigger search over the record's JSON
  renderings (which the schema already made) lets clean records through without walking them.
* For benchmarks only, `MEMORYHUB_REDACTION=off` turns the kernel's step off (bench/redaction.py
  measures a push with and without it); settings refuse it outside a benchmark run on development
  secrets (`memoryhub.settings.REDACTION_OFF_FOR_BENCH`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import phonenumbers
from django.conf import settings

from memories.records.normalize import NormalizedMemory, assemble_memory, normalize_memory
from memoryhub.errors import InvalidInput, Unprocessable

if TYPE_CHECKING:
    from stacks.models import Stack

PLACEHOLDER = "<REDACTED:{}>"
_PLACEHOLDER = re.compile(r"<REDACTED:([A-Z0-9_]+)>")

Span = tuple[int, int]


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


# --- what the rules see --------------------------------------------------------------------------------

# Characters that render as nothing and so can split a secret unseen: zero-width space, non-joiner
# and joiner, word joiner, the invisible operators, the BOM / zero-width no-break space, the soft
# hyphen and the Mongolian vowel separator.
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff"))


def _fold(text: str) -> str:
    """`text` as the rules see it (module docstring), for the pre-checks: no map back."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", text.translate(_INVISIBLE))


@dataclass(frozen=True)
class _Folded:
    text: str  # what the rules see
    origin: list[Span] | None  # per character of `text`, the original characters it came from; None: the same


def _folded(text: str) -> _Folded:
    """`text` folded (module docstring) with the map back to its characters. NFKC is applied per
    character and the combining marks that follow it, so every folded character knows its source."""
    if text.isascii():
        return _Folded(text, None)
    if len(text.translate(_INVISIBLE)) == len(text) and unicodedata.is_normalized("NFKC", text):
        return _Folded(text, None)
    pieces: list[str] = []
    origin: list[Span] = []
    index, size = 0, len(text)
    while index < size:
        if ord(text[index]) in _INVISIBLE:
            index += 1
            continue
        end = index + 1
        while end < size and unicodedata.combining(text[end]):
            end += 1
        piece = text[index:end]
        if not piece.isascii():
            piece = unicodedata.normalize("NFKC", piece)
        pieces.append(piece)
        origin.extend([(index, end)] * len(piece))
        index = end
    return _Folded("".join(pieces), origin)


def _substitute(text: str, folded: _Folded, spans: list[Span], placeholder: str) -> tuple[str, int]:
    """`text` with the folded `spans` (in order, not overlapping) replaced by `placeholder`; how many."""
    if folded.origin is not None:
        spans = [(folded.origin[start][0], folded.origin[end - 1][1]) for start, end in spans]
    parts: list[str] = []
    last = hits = 0
    for start, end in spans:
        if start < last:  # two folded matches inside one original character (a ligature): one placeholder
            continue
        parts += (text[last:start], placeholder)
        last = end
        hits += 1
    parts.append(text[last:])
    return "".join(parts), hits


# --- the rules -----------------------------------------------------------------------------------------

class _View:
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

    def opens(self, view: _View) -> bool:
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


_CARD_SEPARATORS = re.compile(r"[ ./\-]")


def _card(candidate: str) -> bool:
    """Luhn, and with dots or slashes (`4111.1111.1111.1111`) one separator throughout between
    groups of 3+ digits, so a run of dotted numbers is not read as a card."""
    if not _luhn(candidate):
        return False
    separators = set(_CARD_SEPARATORS.findall(candidate))
    if separators & {".", "/"}:
        return len(separators) == 1 and all(len(group) >= 3 for group in _CARD_SEPARATORS.split(candidate))
    return True


def _token_like(token: str, minimum: int = 8) -> bool:
    """Whether a word after `Bearer` (or an auth scheme) is a credential rather than prose: a digit,
    a token symbol or base64 padding, mixed case inside the word, or a length no English word has."""
    core = token.rstrip("=")
    if len(core) < minimum:
        return False
    if core != token or any(c.isdigit() or c in "_~+/" for c in core):
        return True
    if sum(c.isupper() for c in core[1:]) >= 2 and sum(c.islower() for c in core) >= 2:
        return True
    return len(core) >= 24 or (len(core) >= 20 and ("-" in core or "." in core))


def _jwt(token: str) -> bool:
    """A JWT's first segment is a JSON object with an `alg`: `eyJ` is `{"` in base64url; another
    start (`{ "`, `{\\n`) is decoded to check."""
    if token.startswith("eyJ"):
        return True
    header = token.split(".", 1)[0].rstrip("=")
    try:
        raw = base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))
    except (binascii.Error, ValueError):
        return False
    return raw.lstrip().startswith(b"{") and b'"alg"' in raw


# Private keys without their header: the base64 run must decode to the start of a key structure.
_PBE_OIDS = (bytes.fromhex("2a864886f70d0105"), bytes.fromhex("2a864886f70d010c01"))  # PKCS#5 / PKCS#12 PBE
_PGP_ALGORITHMS = frozenset({1, 2, 3, 16, 17, 18, 19, 20, 22, 25, 26, 27, 28})


def _der_length(raw: bytes, index: int) -> tuple[int, int] | None:
    """(length, index after it) of the DER length at `index`."""
    if index >= len(raw):
        return None
    first = raw[index]
    if first < 0x80:
        return first, index + 1
    size = first & 0x7F
    if not 1 <= size <= 3 or index + 1 + size > len(raw):
        return None
    return int.from_bytes(raw[index + 1:index + 1 + size], "big"), index + 1 + size


def _der_private_key(raw: bytes) -> bool:
    """PKCS#1 (RSA, DSA), SEC1 (EC), PKCS#8 (plain or encrypted) or PKCS#12: a SEQUENCE whose first
    element is the version INTEGER followed by the key or its algorithm, or an encryption
    AlgorithmIdentifier. A certificate, a public key or a signature starts otherwise."""
    if raw[:1] != b"\x30":
        return False
    outer = _der_length(raw, 1)
    if outer is None or outer[0] < 40:
        return False
    index = outer[1]
    inner = raw[index:index + 4]
    if inner[:3] in (b"\x02\x01\x00", b"\x02\x01\x01") and inner[3:4] in (b"\x02", b"\x04", b"\x30"):
        return True
    if inner == b"\x02\x01\x03\x30":  # PKCS#12 (PFX, version 3)
        return True
    if inner[:1] != b"\x30":
        return False
    algorithm = _der_length(raw, index + 1)
    if algorithm is None or raw[algorithm[1]:algorithm[1] + 1] != b"\x06":
        return False
    oid = _der_length(raw, algorithm[1] + 1)
    return oid is not None and raw[oid[1]:oid[1] + oid[0]].startswith(_PBE_OIDS)


def _pgp_secret_key(raw: bytes) -> bool:
    """An OpenPGP secret-key packet (tag 5, old or new format) with a known version and algorithm."""
    if len(raw) < 12:
        return False
    tag = raw[0]
    if tag == 0xC5:
        first = raw[1]
        index = 2 if first < 192 else 3 if first < 224 else 6 if first == 255 else 0
        if not index:
            return False
    elif tag & 0xFC == 0x94:
        index = 1 + (1, 2, 4, 0)[tag & 3]
    else:
        return False
    version = raw[index]
    algorithm_at = index + (7 if version == 3 else 5)
    return version in (3, 4, 5, 6) and algorithm_at < len(raw) and raw[algorithm_at] in _PGP_ALGORITHMS


def _private_key_body(run: str) -> bool:
    compact = "".join(run.split()).rstrip("=")
    if len(compact) < 60:
        return False
    head = compact[:64]
    try:
        raw = base64.b64decode(head[:len(head) // 4 * 4])
    except (binascii.Error, ValueError):
        return False
    return raw.startswith(b"openssh-key-v1\x00") or _pgp_secret_key(raw) or _der_private_key(raw)


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
# only what looks like a credential (`_token_like`), so "Authorization: pending" stays prose.
_AUTH_SCHEMES = (r"(?:token|digest|negotiate|ntlm|oauth|jwt|apikey|api-key|key|dpop|mac|hoba|vapid|gnap"
                 r"|aws4-hmac-sha256|hmac(?:-sha\d+)?|sharedkey|sso-key|splunk|privatetoken|scram-sha-\d+)")
_AUTH_VALUE_BODY = (r"(?:(?:bearer|basic)\s+(" + _TOKEN + r")|" + _AUTH_SCHEMES + r"\s+(" + _TOKEN + r")|("
                    + _TOKEN + r"))")


def _auth_value(match: re.Match[str]) -> bool:
    bearer_or_basic, scheme_token, bare = match.group(1, 2, 3)
    if bearer_or_basic:
        return True
    if scheme_token:
        return _token_like(scheme_token)
    return bool(bare) and _token_like(bare, 16)


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
             check=lambda match: _private_key_body(match.group(0))),
    Critical("auth_header", re.compile(r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?" + _AUTH_VALUE_BODY),
             check=_auth_value, gate=Gate(lower=("authoriz",))),
)
_AUTH_VALUE = re.compile(r"(?i)^\s*" + _AUTH_VALUE_BODY)


def _critical_spans(critical: Critical, view: _View) -> list[Span]:
    if not critical.gate.opens(view):
        return []
    spans = []
    for match in critical.pattern.finditer(view.text):
        if critical.check is None or critical.check(match):
            spans.append(match.span())
    return spans


# Phone numbers in national form (UK, Germany) are candidates that the phone-number library must
# accept as a valid number; dates in the same shape (`03.04.2024`, valid German numbers) and runs of
# two-digit groups are left alone.
_PHONE_CANDIDATE = re.compile(
    r"(?<![\w+.])(?:(?:\+|00)[1-9]\d{0,2}[ ./\-]?(?:\(0\)[ ./\-]?)?|\(0\d{1,4}\)[ ./\-]?|0(?=\d))"
    r"\d(?:[ ./\-]?\d){5,13}(?!\d)")
_DATE_SHAPE = re.compile(r"\d{1,2}([./\-])\d{1,2}\1\d{2,4}")
_PHONE_GROUPS = re.compile(r"\d+")
PHONE_REGIONS = ("GB", "DE")


def _library_phones(text: str) -> list[Span]:
    spans = []
    for match in _PHONE_CANDIDATE.finditer(text):
        candidate = match.group(0)
        groups = _PHONE_GROUPS.findall(candidate)
        if _DATE_SHAPE.fullmatch(candidate) or (len(groups) > 1 and max(map(len, groups[1:])) < 3):
            continue
        if _valid_phone(candidate):
            spans.append(match.span())
    return spans


def _valid_phone(candidate: str) -> bool:
    for region in PHONE_REGIONS:
        try:
            number = phonenumbers.parse(candidate, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True
    return False


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
    # must look like one (`_token_like`) so prose ("the bearer of bad news") is left alone.
    Rule("bearer_token", re.compile(r"(?i)\bbearer[\"']?\s*[:=]?\s*([A-Za-z0-9\-._~+/]{8,}=*)"), group=1,
         check=_token_like, gate=Gate(lower=("bearer",))),
    Rule("jwt", re.compile(r"(?:" + "|".join(_JWT_STARTS) + r")[A-Za-z0-9_\-]{4,}={0,2}\.[A-Za-z0-9_\-]{2,}={0,2}"
                           r"\.[A-Za-z0-9_\-]*"), check=_jwt, gate=Gate(hints=_JWT_STARTS)),
    Rule("email", _EMAIL, in_ids=False, category="EMAIL", gate=Gate(hints=("@",), lower=_EMAIL_WORDS)),
    Rule("credit_card", re.compile(r"(?<!\d)(?<!\d[./\-])\d(?:[ ./\-]?\d){12,18}(?!\d|[./\-]\d)"), check=_card,
         in_ids=False, gate=Gate(digits=True)),
    Rule("phone", re.compile(
        r"(?<![\w+])(?:\+?1[-.\s]?)?(?:\(\d{3}\)\s?|\d{3}[-.\s]?)\d{3}[-.\s]?\d{4}(?!\d)"
        r"|(?<![\w+])\+[2-9]\d{0,2}[-.\s]?\d{1,4}(?:[-.\s]?\d{2,4}){2,3}(?!\d)"), in_ids=False, category="PHONE",
         finder=_library_phones, gate=Gate(digits=True)),
    Rule("ip_address", re.compile(
        r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\d.])"),
         in_ids=False, category="IP_ADDRESS", gate=Gate(digits=True)),
)
RULE_NAMES = tuple(rule.name for rule in RULES)

# What an identifier may not hold (`refuse_sensitive_identifier`): the CRITICAL rules, every secret
# rule that applies to ids, and e-mail addresses. Not phone, card or IP numbers: ids are often
# numeric (timestamps, counters) and those rules would refuse ordinary ones.
_IDENTIFIER_RULES = tuple(rule for rule in RULES if rule.in_ids or rule.category == "EMAIL")

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
# The secret rules alone (card numbers included): what a kept original must not hold.
SECRETS_ONLY = _policy(frozenset())


@cache
def _disabled() -> bool:
    """The benchmark-only switch (module docstring); settings decide whether it may be honoured."""
    return bool(getattr(settings, "REDACTION_OFF_FOR_BENCH", False))

# The cheap pre-check (`_suspicious`, on folded text): substring tests and two searches that find
# nothing in clean prose. Together a superset of every rule's necessary part (and of an existing
# placeholder, so a redacted record keeps its report), run over the record's JSON renderings — hence
# the slack for escapes such as `\n` between digits. One combined regex was measured 5x slower: an
# alternation without a common literal prefix is tried at every position.
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


def _suspicious(text: str) -> bool:
    """`text` (folded) may hold something a rule matches."""
    for literal in _LITERALS:
        if literal in text:
            return True
    lowered = text.lower()
    for word in _WORDS:
        if word in lowered:
            return True
    return _DIGITS.search(text) is not None or max(map(len, text.split()), default=0) >= _KEY_BODY_WORD


# Columns that hold entity ids (grants match them exactly) or record ids: secrets are redacted
# there too, PII is not (an id must stay the id the grant rules compare).
_ID_COLUMNS = ("subject_ids", "access_grants", "consent_grants", "derived_from", "source_episodes")
_TEXT_COLUMNS = ("tags", "emotional_tags", "source_entity")


def _rule_spans(rule: Rule, view: _View) -> list[Span]:
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


def redact_text(text: str, *, field: str = "", secrets_only: bool = False,
                counts: Counter[str] | None = None, policy: RedactionPolicy | None = None) -> str:
    """One string: CRITICAL → `RedactionRefused`; otherwise the policy's rules in order (every rule
    without one; with `secrets_only` those for entity-id columns) on the folded text, each match
    replaced in the original. `counts` (if given) gains one per replacement."""
    folded = _folded(text)
    if not _suspicious(folded.text):  # most strings of a record that needs a scan: cheaper than every rule
        return text
    view = _View(folded.text)
    for critical in CRITICAL:
        if _critical_spans(critical, view):
            raise RedactionRefused(critical.name, field)
    return _apply_rules(text, folded, (policy or ALL_CATEGORIES).id_rules if secrets_only
                        else (policy or ALL_CATEGORIES).rules, counts)


def _apply_rules(text: str, folded: _Folded, rules: tuple[Rule, ...], counts: Counter[str] | None) -> str:
    view = _View(folded.text)
    for rule in rules:
        spans = _rule_spans(rule, view)
        if not spans:
            continue
        text, hits = _substitute(text, folded, spans, PLACEHOLDER.format(rule.name.upper()))
        folded = _folded(text) if folded.origin is not None else _Folded(text, None)
        view = _View(folded.text)
        if counts is not None and hits:
            counts[rule.name] += hits
    return text


def redact_secrets(text: str) -> str:
    """`text` without any secret, whatever a school chose, and never refused: CRITICAL matches are
    replaced too (a private key's whole block). For kept originals (memories.privacy.originals): they keep
    the PII a school redacts, never a secret."""
    folded = _folded(text)
    if not _suspicious(folded.text):
        return text
    for critical in CRITICAL:
        spans = _critical_spans(critical, _View(folded.text))
        if spans:
            if critical.block is not None:
                spans = [match.span() for match in critical.block.finditer(folded.text)] or spans
            text, _ = _substitute(text, folded, spans, PLACEHOLDER.format(critical.name.upper()))
            folded = _folded(text)
    return _apply_rules(text, folded, SECRETS_ONLY.rules, None)


def refuse_sensitive_identifier(value: str, *, field: str) -> str:
    """`value`, an identifier that cannot be rewritten (a record id, a boot-config key name), or
    `SensitiveIdentifier` (400 `sensitive_identifier`) when it holds a secret (a CRITICAL one
    included) or an e-mail address."""
    folded = _fold(value)
    if not _suspicious(folded):
        return value
    view = _View(folded)
    for critical in CRITICAL:
        if _critical_spans(critical, view):
            raise SensitiveIdentifier(critical.name, field)
    for rule in _IDENTIFIER_RULES:
        if _rule_spans(rule, view):
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
            if isinstance(key, str) and isinstance(item, str) and "authoriz" in _fold(key).lower():
                match = _AUTH_VALUE.match(_fold(item))
                if match is not None and _auth_value(match):
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
    return _suspicious(_fold("\n".join(parts)))


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
