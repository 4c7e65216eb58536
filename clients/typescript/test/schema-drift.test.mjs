// The committed types (src/schema.d.ts) are what openapi-typescript makes of the live service's
// OpenAPI document: regenerate from MEMORYHUB_URL's /api/schema/ and compare.

import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { test } from "node:test";

import { generate, SCHEMA_DTS } from "../scripts/generate.mjs";

test("src/schema.d.ts matches the live /api/schema/", async () => {
  const url = `${process.env.MEMORYHUB_URL}/api/schema/?format=json`;
  const fresh = await generate(url);
  const committed = await readFile(SCHEMA_DTS, "utf8");
  if (fresh === committed) return;
  const freshLines = fresh.split("\n");
  const committedLines = committed.split("\n");
  const at = freshLines.findIndex((line, i) => line !== committedLines[i]);
  const saved = path.join(tmpdir(), "memoryhub-schema.d.ts");
  await writeFile(saved, fresh);
  assert.fail(`src/schema.d.ts is out of date with the service's schema (first difference at line ${at + 1}:\n`
    + `  committed: ${committedLines[at]}\n  live:      ${freshLines[at]}\n). The regenerated file is ${saved}; `
    + "regenerate with `npm run generate -- <schema.json>` (from `python manage.py spectacular --format "
    + "openapi-json --file <schema.json>`) and commit it.");
});
