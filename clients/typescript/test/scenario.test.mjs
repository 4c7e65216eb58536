// An agent's session against a live MemoryHub, through the built client (dist/).
//
// Run by tests/clients/test_typescript_client.py, which starts the service on the test database
// and passes, in the environment:
//   MEMORYHUB_URL          the live server
//   MEMORYHUB_KEY          the agent key of stack MEMORYHUB_STACK
//   MEMORYHUB_SCHOOL_KEY   a school key of the same school
//   MEMORYHUB_OTHER_STACK  a stack of another school
//   MEMORYHUB_THROTTLED    "sync_push": native sync push is limited to 1 request per second

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  MemoryHub, MemoryHubError, NotFoundError, BadRequestError, UnknownFieldError, RateLimitError,
} from "../dist/index.js";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run tests/clients/test_typescript_client.py`);
  return value;
};
const baseUrl = env("MEMORYHUB_URL");
const stack = env("MEMORYHUB_STACK");
const otherStack = env("MEMORYHUB_OTHER_STACK");
const retries = [];
const hub = new MemoryHub({
  baseUrl, apiKey: env("MEMORYHUB_KEY"), agentId: "ts-client-test", timeoutMs: 20_000,
  onRetry: (retry) => retries.push(retry),
});
const school = new MemoryHub({ baseUrl, apiKey: env("MEMORYHUB_SCHOOL_KEY"), timeoutMs: 20_000 });

const EVERY_KIND = [
  { kind: "raw", content: "Ada typed: I like the pizza slices way of doing fractions" },
  { kind: "episode", objective: "Practise equivalent fractions", outcome: "Solved 8 of 10", lessons: ["Draw the pie first"] },
  { kind: "note", content: "Ada understands fractions much better when the teacher cuts a pizza into equal slices.",
    tags: ["math"] },
  { kind: "belief", statement: "Pictures help Ada with abstract ideas", confidence: 0.9 },
  { kind: "value", name: "Patience", statement: "Give Ada time to think before hinting" },
  { kind: "goal", title: "Master fractions by spring", priority: "high", extra: { term: "spring" } },
  { kind: "drive", drive_type: "curiosity", intensity: 0.7 },
  { kind: "relationship", entity_name: "Mr Okafor", relationship_type: "teacher" },
  { kind: "playbook", name: "Stuck on a problem", description: "Ask Ada to draw it, then to explain the drawing" },
];

test("remember every kind, then get, update, forget and recover", async () => {
  const stored = [];
  for (const memory of EVERY_KIND) {
    const saved = await hub.remember(stack, memory);
    assert.equal(saved.kind, memory.kind);
    stored.push(saved);
  }
  const goal = stored.find((m) => m.kind === "goal");
  const detail = await hub.get(stack, goal.id);
  assert.equal(detail.written_by.agent, "ts-client-test");
  assert.deepEqual(detail.extra, { term: "spring" });

  const changed = await hub.update(stack, goal.id, { title: "Master fractions and decimals by spring" });
  assert.match(changed.text, /decimals/);
  assert.equal((await hub.forget(stack, goal.id, "test")).forgotten, true);
  assert.equal((await hub.recover(stack, goal.id)).forgotten, false);

  const batch = await hub.rememberMany(stack, [
    { kind: "note", content: "Ada walks her grandmother's dog after school" },
    { kind: "note", content: "Ada plays the violin in the school orchestra" },
  ]);
  assert.equal(batch.created, 2);

  // Cursor pages as an async iterator: two memories a page, all eleven, each once.
  const seen = [];
  let pages = 0;
  for await (const page of hub.memories(stack, { limit: 2 }).pages()) {
    pages += 1;
    seen.push(...page.results.map((m) => m.id));
  }
  assert.equal(seen.length, EVERY_KIND.length + 2);
  assert.equal(new Set(seen).size, seen.length);
  assert.ok(pages >= 6, `${pages} pages`);
  const notes = await hub.memories(stack, { kind: "note" }).toArray();
  assert.deepEqual(new Set(notes.map((m) => m.kind)), new Set(["note"]));
});

test("search finds a memory by its meaning, not its words", async () => {
  // No word of the question is in the note: only the semantic leg can find it. The vectors are
  // written in the background, as in the service: ask until the stack's memories are embedded.
  const question = "What helps this student grasp parts of a whole?";
  let found;
  for (let i = 0; i < 100; i++) {
    found = await hub.search(stack, question, { limit: 3 });
    if (found.legs.semantic === "ran" && found.results.length) break;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.equal(found.legs.semantic, "ran", JSON.stringify(found.legs));
  assert.match(found.results[0].text, /pizza into equal slices/);
  assert.ok(found.results[0].semantic_score > 0);
  assert.ok(found.results.length <= 3);
});

test("load stays within its budget", async () => {
  const all = await hub.load(stack, { budget: 8000 });
  const loaded = await hub.load(stack, { budget: 100 });
  assert.equal(loaded.meta.budget_total, 100);
  assert.ok(loaded.meta.budget_used <= 100, JSON.stringify(loaded.meta));
  assert.ok(loaded.memories.length > 0);
  // The smallest budget holds fewer memories than a generous one: the rest were left out.
  assert.ok(loaded.memories.length < all.memories.length,
    `${loaded.memories.length} of ${all.memories.length}: ${JSON.stringify(loaded.meta)}`);
});

test("checkpoint round trip, boot config, MEMORY.md, smart ingest and a session card", async () => {
  assert.equal(await hub.checkpoint.latest(stack), null);
  const saved = await hub.checkpoint.save(stack, {
    current_task: "Fractions unit, lesson 3", pending: ["Mark the quiz", "Start decimals"],
    context: "Halfway through equivalent fractions",
  });
  const latest = await hub.checkpoint.latest(stack);
  assert.equal(latest.id, saved.id);
  assert.equal(latest.task, "Fractions unit, lesson 3");
  assert.deepEqual(latest.pending, ["Mark the quiz", "Start decimals"]);
  assert.deepEqual(latest.context, { text: "Halfway through equivalent fractions" });
  assert.equal((await hub.checkpoint.history(stack).toArray()).length, 1);

  await hub.bootConfig.set(stack, "tone", "encouraging");
  assert.equal((await hub.bootConfig.get(stack, "tone")).value, "encouraging");
  assert.equal((await hub.load(stack, { budget: 8000 })).boot_config.tone, "encouraging");
  await hub.bootConfig.delete(stack, "tone");
  assert.deepEqual(await hub.bootConfig.list(stack), []);

  const markdown = await hub.memoryMd(stack);
  assert.equal(typeof markdown, "string");
  assert.match(markdown, /Patience/);

  const ingested = await hub.ingest(stack, { kind: "note", content: "Ada's favourite book is about a dragon baker" });
  assert.equal(ingested.decision, "create");

  const session = await hub.recordSession(stack, {
    session_id: "s-1", summary: "We practised fractions with pizza drawings. Decided: decimals next week.",
    tool_name: "tutor", success: true, tags: ["math"],
  });
  assert.equal(session.stored, true);
  assert.ok(session.card.title);
});

test("native sync: push, then pull every page with the cursor", async () => {
  const pushed = await hub.sync.push(stack, [
    { op: "upsert", kind: "note", record_id: "device-note-1", data: { content: "Pushed from a device" } },
  ]);
  assert.equal(pushed.applied, 1, JSON.stringify(pushed));
  let cursor = null;
  const changes = [];
  for await (const page of hub.sync.pages(stack, { limit: 5 })) {
    changes.push(...page.changes);
    cursor = page.next_cursor;
  }
  assert.ok(changes.some((c) => c.record_id === "device-note-1" && c.op === "upsert"));
  const after = await hub.sync.pull(stack, { cursor });
  assert.deepEqual(after.changes, []);
  assert.equal(after.has_more, false);
});

test("a 429 is retried after its Retry-After", async () => {
  assert.equal(process.env.MEMORYHUB_THROTTLED, "sync_push");
  const op = { op: "upsert", kind: "note", record_id: "throttled-note", data: { content: "again" } };
  // The limit is one push a second: two pushes in a row meet it, unless a new second began between
  // them (then try once more).
  for (let pair = 0; pair < 3 && !retries.some((r) => r.status === 429); pair++) {
    await hub.sync.push(stack, [op]);
    retries.length = 0; // only the second push's: the first may itself have met the last second's limit
    const started = performance.now();
    const second = await hub.sync.push(stack, [op]);
    assert.equal(second.rejected, 0);
    const waited = performance.now() - started;
    const retry = retries.find((r) => r.status === 429);
    if (retry) {
      assert.ok(retry.retryAfter >= 1, JSON.stringify(retry));
      assert.equal(retry.delayMs, retry.retryAfter * 1000);
      assert.ok(waited >= retry.delayMs, `${waited} ms`);
    }
  }
  assert.ok(retries.some((r) => r.status === 429), "no push was throttled");

  // With no retries left the caller gets the 429 itself, with the service's Retry-After.
  const impatient = new MemoryHub({ baseUrl, apiKey: env("MEMORYHUB_KEY"), maxRetries: 0 });
  let refused;
  for (let i = 0; i < 3 && !refused; i++) {
    await impatient.sync.push(stack, [op]).catch(() => {});
    refused = await impatient.sync.push(stack, [op]).then(() => undefined, (error) => error);
  }
  assert.ok(refused instanceof RateLimitError, String(refused));
  assert.equal(refused.status, 429);
  assert.ok(refused.retryAfter >= 1);
});

test("an unknown field is an error naming it", async () => {
  const error = await hub.remember(stack, { kind: "goal", title: "Typo", priorty: "high" }).catch((e) => e);
  assert.ok(error instanceof UnknownFieldError, String(error));
  assert.ok(error instanceof BadRequestError && error instanceof MemoryHubError);
  assert.equal(error.status, 400);
  assert.equal(error.code, "unknown_field");
  assert.deepEqual(Object.keys(error.fields), ["priorty"]);
  assert.match(String(error.fields.priorty), /priority/);
  // Nothing was stored.
  const goals = await hub.memories(stack, { kind: "goal" }).toArray();
  assert.ok(!goals.some((m) => m.text.includes("Typo")));
});

test("another school's stack is not found", async () => {
  for (const client of [hub, school]) {
    const error = await client.search(otherStack, "fractions").catch((e) => e);
    assert.ok(error instanceof NotFoundError, String(error));
    assert.equal(error.status, 404);
    assert.match(error.code, /not_found/);
    await assert.rejects(client.remember(otherStack, { kind: "note", content: "leak?" }), NotFoundError);
    await assert.rejects(client.load(otherStack), NotFoundError);
  }
  await assert.rejects(school.stacks.get(otherStack), NotFoundError);
});

test("school calls: stacks and keys", async () => {
  const stacks = await school.stacks.list().toArray();
  assert.ok(stacks.some((s) => s.stack_id === stack));
  assert.ok(!stacks.some((s) => s.stack_id === otherStack));
  const issued = await school.keys.issue({ name: "ts-client", stack_id: stack, read_only: true });
  assert.match(issued.key, /^knl_sk_/);
  const reader = new MemoryHub({ baseUrl, apiKey: issued.key });
  assert.ok((await reader.load(stack, { budget: 500 })).memories.length > 0);
  const keys = await school.keys.list().toArray();
  assert.ok(keys.some((k) => k.key_id === issued.key_id));
  await school.keys.revoke(issued.key_id);
  const refused = await reader.load(stack).catch((e) => e);
  assert.equal(refused.status, 401);
});
