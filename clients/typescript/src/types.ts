/**
 * Friendly names for the generated schema types (src/schema.d.ts, from the service's OpenAPI
 * document): one source of truth, so a change in the API shows up here at compile time.
 */

import type { components, operations } from "./schema.js";

type S = components["schemas"];
type QueryOf<Op extends keyof operations> = NonNullable<operations[Op]["parameters"]["query"]>;

export type MemoryKind = S["MemoryKindEnum"];
/** A memory as the API returns it. */
export type Memory = S["Memory"];
/** A memory with its provenance (`written_by`) and newest revisions. */
export type MemoryDetail = S["MemoryDetail"];
/** What `remember` takes: `kind` and that kind's fields, flat (`{kind: "note", content: "…"}`). */
export type MemoryInput = S["MemoryWriteRequest"];
/** A partial update: any fields of the memory's kind; null resets a field to its default. */
export type MemoryUpdate = S["PatchedMemoryUpdateRequest"];
export type MemoryBatchResult = S["MemoryBatchResult"];
export type ListMemoriesOptions = Omit<QueryOf<"api_v1_stacks_memories_list">, "cursor" | "kind" | "tags"> & {
  kind?: MemoryKind | readonly MemoryKind[];
  tags?: readonly string[];
  /** Start after this page (the `cursor` of a previous page's `next`). */
  cursor?: string;
};

export type SearchOptions = Omit<S["SearchInRequest"], "query">;
export type SchoolSearchOptions = Omit<S["SchoolSearchInRequest"], "query">;
export type SearchResponse = S["SearchResponse"];
export type SearchHit = S["SearchHit"];

export type LoadOptions = QueryOf<"api_v1_stacks_load_retrieve">;
export type LoadResult = S["LoadResult"];
export type LoadedMemory = S["LoadedMemory"];

export type CheckpointInput = S["CheckpointInRequest"];
export type Checkpoint = S["Checkpoint"];
export type BootConfigEntry = S["BootConfigEntry"];

/** Smart ingest: a memory the service creates, reinforces, updates or supersedes with. */
export type IngestInput = S["SmartIngestInRequest"];
export type IngestResult = S["SmartIngestResponse"];

/** A session for a memory card (`summary`, `tool_name`, `tags`, `dry_run`, …). */
export type SessionInput = S["SessionRequest"];
export type SessionStored = S["SessionStored"];
export type SessionDryRun = S["SessionDryRun"];

export type SyncOperation = S["NativeOperationRequest"];
export type SyncPushResult = S["NativePushResponse"];
export type SyncPullPage = S["NativePullResponse"];
export type SyncChange = S["NativeChange"];

export type Stack = S["Stack"];
export type StackCreate = S["StackCreateRequest"];
export type StackUpdate = S["PatchedStackUpdateRequest"];
export type StackStatus = S["StackStatusEnum"];
export type KeySummary = S["KeySummary"];
export type KeyIssue = S["KeyIssueRequest"];
export type KeyCreated = S["KeyCreated"];
export type KeyCycled = S["KeyCycled"];

/** One page of a cursor-paginated list, as the service sends it. */
export interface Page<T> {
  next: string | null;
  previous: string | null;
  results: T[];
}
