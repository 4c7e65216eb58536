// Compile-time checks of the client's types (`npm run typecheck`, run by the suite): the calls as
// the README writes them compile, and the mistakes the schema rules out do not.

import {
  MemoryHub, UnknownFieldError, type Checkpoint, type LoadResult, type Memory, type SearchResponse,
} from "../src/index.js";

const hub = new MemoryHub({ baseUrl: "http://127.0.0.1:8000", apiKey: "knl_sk_example", agentId: "tutor" });

export async function asTheReadmeWrites(): Promise<void> {
  const note: Memory = await hub.remember("ada", { kind: "note", content: "Fractions click with pizza", tags: ["math"] });
  await hub.remember("ada", { kind: "goal", title: "Master fractions", priority: "high", extra: { term: "spring" } });
  await hub.remember("ada", { kind: "episode", objective: "Practise", outcome: "8 of 10", lessons: ["Draw it"] });
  await hub.rememberMany("ada", [{ kind: "belief", statement: "Pictures help" }, { kind: "drive", drive_type: "curiosity" }]);
  const found: SearchResponse = await hub.search("ada", "parts of a whole", { limit: 10, kinds: ["note"] });
  const score: number = found.results[0]?.semantic_score ?? 0;
  const loaded: LoadResult = await hub.load("ada", { budget: 8000 });
  const used: number = loaded.meta.budget_used;
  const saved: Checkpoint = await hub.checkpoint.save("ada", { task: "Fractions", pending: ["Quiz"] });
  const latest: Checkpoint | null = await hub.checkpoint.latest("ada");
  for await (const memory of hub.memories("ada", { kind: ["note", "goal"], limit: 50 })) void memory.text;
  for await (const page of hub.sync.pages("ada", { cursor: null })) void page.next_cursor;
  await hub.sync.push("ada", [{ op: "upsert", kind: "note", record_id: "n-1", data: { content: "x" } }]);
  const markdown: string = await hub.memoryMd("ada");
  try {
    await hub.update("ada", note.id, { tags: ["math"] });
  } catch (error) {
    if (error instanceof UnknownFieldError) void error.fields;
  }
  void [score, used, saved, latest, markdown];
}

export async function whatTheSchemaRulesOut(): Promise<void> {
  // @ts-expect-error a field the goal kind does not have
  await hub.remember("ada", { kind: "goal", title: "x", priorty: "high" });
  // @ts-expect-error a note needs its content
  await hub.remember("ada", { kind: "note" });
  // @ts-expect-error no such kind
  await hub.remember("ada", { kind: "memo", content: "x" });
  // @ts-expect-error the budget is a number
  await hub.load("ada", { budget: "8000" });
  // @ts-expect-error a sync operation names its kind
  await hub.sync.push("ada", [{ record_id: "n-1" }]);
}
