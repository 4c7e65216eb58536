"""Redaction at ingest: secrets and PII become typed placeholders before anything is derived.

docs/algorithms.md §11 has the rules. The one entry point for free text and JSON values is
`engine.redact_value` (value in → redacted value + report); `engine.redact_memory` applies it to a whole
`NormalizedMemory` and is called by the write kernel itself (`memories.writes.hooks.prepare_memory`),
so every memory write path (native create / update / batch, kernle and native sync push, smart
ingest, promotion) redacts before the row, its full-text vector, its embedding input, its
revisions or its change events exist. Checkpoints, boot-config values and forget reasons call
`redact_value` / `redact_text` in their services.

* **What the rules see** (`folding`): each string NFKC-normalised (fullwidth letters and digits,
  ligatures, no-break spaces become their plain forms) with the invisible characters removed
  (zero-width space / joiners, word joiner, BOM, soft hyphen). A match is mapped back
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
  choice, `Organization.redaction_categories` (None: all of them). A `policy.RedactionPolicy` carries that
  choice: writers resolve it once per request or batch (`stack_policy`, from the stack row and the
  organization it was loaded with) and hand it to the kernel.
* **Identifiers cannot be rewritten** (a record id is how the client syncs; a boot-config key name
  is how it reads its setting back): `refuse_sensitive_identifier` refuses one holding a secret or
  an e-mail address with 400 `sensitive_identifier`, naming the rule, never the value.
* **Kept originals** (memories.privacy.originals) never hold a secret: `redact_secrets` is the secret rules
  alone (the PII a school redacts is what an original is kept for), replacing CRITICAL matches
  instead of refusing them.
* Phone numbers (`detectors`): a pattern for the North-American and `+<country>` shapes, and for national
  numbers (UK, Germany: `020 7946 0958`, `030/12345678`, `+49 (0)30 …`) a pattern that finds
  candidates which Google's libphonenumber (`phonenumbers`) must then accept as a valid number, so
  dates, scores and version numbers are left alone.
* Speed: the patterns (`rules`) are compiled once, and one combined trigger search over the record's JSON
  renderings (which the schema already made) lets clean records through without walking them.
* For benchmarks only, `MEMORYHUB_REDACTION=off` turns the kernel's step off (bench/redaction.py
  measures a push with and without it); settings refuse it outside a benchmark run on development
  secrets (`memoryhub.settings.REDACTION_OFF_FOR_BENCH`).

The package, by seam: `folding` (what the rules see, and the map back), `detectors` (the checks a
match must pass: Luhn, token shape, JWT header, private-key structure, valid phone numbers), `rules`
(the patterns, the CRITICAL and ordered rule tables, the pre-check), `policy` (which rules a school's
writes apply) and `engine` (applying them: the entry points above and the two refusals).
"""
