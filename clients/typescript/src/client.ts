/**
 * `MemoryHub`: what an agent (and a school's system) calls, one method per route of the native
 * API under `/api/v1/` (the service's docs/api.md §2). Bodies and answers are typed from the
 * service's OpenAPI document (src/types.ts); transport, retries and errors are in http.ts.
 *
 * `stack` is a stack id (`"ada"`, `"student-4521"`). A key bound to one stack reaches that stack
 * only; a school key names the stack in each call. A stack the key may not see is a `NotFoundError`.
 */

import { type Call, type ClientOptions, pathOf, type Query, type RequestOptions, Transport } from "./http.js";
import { NotFoundError } from "./errors.js";
import type {
  BootConfigEntry, Checkpoint, CheckpointInput, IngestInput, IngestResult, KeyCreated, KeyCycled, KeyIssue,
  KeySummary, ListMemoriesOptions, LoadOptions, LoadResult, Memory, MemoryBatchResult, MemoryDetail, MemoryInput,
  MemoryUpdate, Page, SchoolSearchOptions, SearchOptions, SearchResponse, SessionDryRun, SessionInput,
  SessionStored, Stack, StackCreate, StackStatus, StackUpdate, SyncOperation, SyncPullPage, SyncPushResult,
} from "./types.js";

const V1 = "api/v1";

/** The `cursor` query parameter of a page's `next` link, or null at the end. */
function cursorOf(next: string | null): string | null {
  if (!next) return null;
  return new URL(next, "http://unused.invalid").searchParams.get("cursor");
}

/** An async iterable over every item of a cursor-paginated list; `.pages()` yields whole pages. */
export class CursorList<T> implements AsyncIterable<T> {
  constructor(private readonly transport: Transport, private readonly call: Call) {}

  /** Each page in turn (`next`/`previous` as sent); follow `cursorOf(page.next)` to resume later. */
  async *pages(): AsyncGenerator<Page<T>> {
    let cursor = typeof this.call.query?.cursor === "string" ? this.call.query.cursor : null;
    for (;;) {
      const page = await this.transport.request<Page<T>>({ ...this.call, query: { ...this.call.query, cursor } });
      yield page;
      cursor = cursorOf(page.next);
      if (cursor === null) return;
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for await (const page of this.pages()) yield* page.results;
  }

  /** Every item, gathered (mind the size of what you list). */
  async toArray(): Promise<T[]> {
    const items: T[] = [];
    for await (const item of this) items.push(item);
    return items;
  }
}

export class MemoryHub {
  readonly transport: Transport;

  constructor(options: ClientOptions) {
    this.transport = new Transport(options);
  }

  private req<T>(call: Call): Promise<T> {
    return this.transport.request<T>(call);
  }

  private list<T>(path: string, query: Query, options: RequestOptions = {}): CursorList<T> {
    return new CursorList<T>(this.transport, { method: "GET", path, query, ...options });
  }

  // --- memories -----------------------------------------------------------------------------

  /** Store one memory: `remember("ada", {kind: "note", content: "Fractions click with pizza"})`. */
  remember(stack: string, memory: MemoryInput, options?: RequestOptions): Promise<Memory> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "memories"), body: memory, ...options });
  }

  /** Store many memories, all or nothing. */
  rememberMany(stack: string, items: readonly MemoryInput[], options?: RequestOptions): Promise<MemoryBatchResult> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "memories", "batch"), body: { items },
      ...options });
  }

  /** One memory with `written_by` and its newest revisions. */
  get(stack: string, id: string, options?: RequestOptions): Promise<MemoryDetail> {
    return this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "memories", id), ...options });
  }

  /** Change some fields of a memory (its kind's fields; `extra` for your own). */
  update(stack: string, id: string, changes: MemoryUpdate, options?: RequestOptions): Promise<Memory> {
    return this.req({ method: "PATCH", path: pathOf(V1, "stacks", stack, "memories", id), body: changes,
      ...options });
  }

  /** Forget a memory (recoverable with `recover`). */
  forget(stack: string, id: string, reason?: string, options?: RequestOptions): Promise<Memory> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "memories", id, "forget"),
      body: reason === undefined ? {} : { reason }, ...options });
  }

  recover(stack: string, id: string, options?: RequestOptions): Promise<Memory> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "memories", id, "recover"), ...options });
  }

  /** The stack's memories, newest first, over cursor pages: `for await (const m of hub.memories("ada"))`. */
  memories(stack: string, filters: ListMemoriesOptions = {}, options?: RequestOptions): CursorList<Memory> {
    const { kind, tags, ...rest } = filters;
    const kinds = kind === undefined ? undefined : typeof kind === "string" ? [kind] : kind;
    return this.list(pathOf(V1, "stacks", stack, "memories"),
      { ...rest, kind: kinds?.join(","), tags: tags?.join(",") }, options);
  }

  // --- getting memory back -------------------------------------------------------------------

  /** Hybrid (keyword + meaning) search of one stack: `search("ada", "pizza", {limit: 10})`. */
  search(stack: string, query: string, opts: SearchOptions = {}, options?: RequestOptions): Promise<SearchResponse> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "search"), body: { ...opts, query },
      ...options });
  }

  /** Search across the stacks a school key may read. */
  searchSchool(query: string, opts: SchoolSearchOptions = {}, options?: RequestOptions): Promise<SearchResponse> {
    return this.req({ method: "POST", path: pathOf(V1, "search"), body: { ...opts, query }, ...options });
  }

  /** What to put in an agent's context, within a token budget: `load("ada", {budget: 8000})`. */
  load(stack: string, opts: LoadOptions = {}, options?: RequestOptions): Promise<LoadResult> {
    return this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "load"), query: { ...opts }, ...options });
  }

  /** The stack as a MEMORY.md document (Markdown text). */
  memoryMd(stack: string, options?: RequestOptions): Promise<string> {
    return this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "export", "memory.md"), as: "text",
      ...options });
  }

  // --- writing smartly --------------------------------------------------------------------------

  /** Smart ingest: the service decides to create, reinforce, update or supersede. */
  ingest(stack: string, memory: IngestInput, options?: RequestOptions): Promise<IngestResult> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "ingest"), body: memory, ...options });
  }

  /** Store a session as an episode and its memory card (`dry_run: true`: the card, nothing stored). */
  recordSession(stack: string, session: SessionInput, options?: RequestOptions)
    : Promise<SessionStored | SessionDryRun> {
    return this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "sessions"), body: session, ...options });
  }

  // --- working state ------------------------------------------------------------------------------

  readonly checkpoint = {
    /** Save a new checkpoint (history is kept; the newest is "the" checkpoint). */
    save: (stack: string, checkpoint: CheckpointInput, options?: RequestOptions): Promise<Checkpoint> =>
      this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "checkpoint"), body: checkpoint, ...options }),
    /** The newest checkpoint, or null when the stack has none (a stack not visible still throws). */
    latest: async (stack: string, options?: RequestOptions): Promise<Checkpoint | null> => {
      try {
        return await this.req<Checkpoint>({ method: "GET", path: pathOf(V1, "stacks", stack, "checkpoint"),
          ...options });
      } catch (error) {
        if (error instanceof NotFoundError && error.code === "no_checkpoint") return null;
        throw error;
      }
    },
    /** Every checkpoint, newest first. */
    history: (stack: string, options?: RequestOptions): CursorList<Checkpoint> =>
      this.list(pathOf(V1, "stacks", stack, "checkpoint", "history"), {}, options),
  };

  readonly bootConfig = {
    list: (stack: string, options?: RequestOptions): Promise<BootConfigEntry[]> =>
      this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "boot-config"), ...options }),
    get: (stack: string, key: string, options?: RequestOptions): Promise<BootConfigEntry> =>
      this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "boot-config", key), ...options }),
    set: (stack: string, key: string, value: string, options?: RequestOptions): Promise<BootConfigEntry> =>
      this.req({ method: "PUT", path: pathOf(V1, "stacks", stack, "boot-config", key), body: { value },
        ...options }),
    delete: (stack: string, key: string, options?: RequestOptions): Promise<void> =>
      this.req({ method: "DELETE", path: pathOf(V1, "stacks", stack, "boot-config", key), ...options }),
  };

  // --- native sync ----------------------------------------------------------------------------------

  readonly sync = {
    /** Apply up to 1,000 operations in order, one result each. */
    push: (stack: string, operations: readonly SyncOperation[], options?: RequestOptions): Promise<SyncPushResult> =>
      this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "sync", "push"), body: { operations },
        ...options }),
    /** One page of changes after `cursor` (none: from the start), oldest first. */
    pull: (stack: string, opts: { cursor?: string | null; limit?: number } = {}, options?: RequestOptions)
      : Promise<SyncPullPage> =>
      this.req({ method: "GET", path: pathOf(V1, "stacks", stack, "sync", "pull"),
        query: { cursor: opts.cursor || undefined, limit: opts.limit }, ...options }),
    /** Every page after `cursor` until `has_more` is false; keep the last page's `next_cursor`. */
    pages: (stack: string, opts: { cursor?: string | null; limit?: number } = {}, options?: RequestOptions)
      : AsyncGenerator<SyncPullPage> => this.pullPages(stack, opts, options),
  };

  private async *pullPages(stack: string, opts: { cursor?: string | null; limit?: number },
    options?: RequestOptions): AsyncGenerator<SyncPullPage> {
    let cursor = opts.cursor ?? null;
    for (;;) {
      const page = await this.sync.pull(stack, { cursor, limit: opts.limit }, options);
      yield page;
      if (!page.has_more) return;
      cursor = page.next_cursor;
    }
  }

  // --- school-wide calls (a school key, or a school admin's token) ---------------------------------

  readonly stacks = {
    list: (filters: { status?: StackStatus } = {}, options?: RequestOptions): CursorList<Stack> =>
      this.list(pathOf(V1, "stacks", ""), { ...filters }, options),
    get: (stack: string, options?: RequestOptions): Promise<Stack> =>
      this.req({ method: "GET", path: pathOf(V1, "stacks", stack, ""), ...options }),
    create: (stack: StackCreate, options?: RequestOptions): Promise<Stack> =>
      this.req({ method: "POST", path: pathOf(V1, "stacks", ""), body: stack, ...options }),
    update: (stack: string, changes: StackUpdate, options?: RequestOptions): Promise<Stack> =>
      this.req({ method: "PATCH", path: pathOf(V1, "stacks", stack, ""), body: changes, ...options }),
    archive: (stack: string, options?: RequestOptions): Promise<Stack> =>
      this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "archive"), ...options }),
    unarchive: (stack: string, options?: RequestOptions): Promise<Stack> =>
      this.req({ method: "POST", path: pathOf(V1, "stacks", stack, "unarchive"), ...options }),
  };

  readonly keys = {
    list: (options?: RequestOptions): CursorList<KeySummary> => this.list(pathOf(V1, "keys", ""), {}, options),
    /** A new key; its secret (`key`) is shown once, in this answer only. */
    issue: (key: KeyIssue, options?: RequestOptions): Promise<KeyCreated> =>
      this.req({ method: "POST", path: pathOf(V1, "keys", ""), body: key, ...options }),
    revoke: (keyId: string, options?: RequestOptions): Promise<void> =>
      this.req({ method: "DELETE", path: pathOf(V1, "keys", keyId, ""), ...options }),
    /** A new secret for the key; the old one stops working. */
    cycle: (keyId: string, options?: RequestOptions): Promise<KeyCycled> =>
      this.req({ method: "POST", path: pathOf(V1, "keys", keyId, "cycle"), ...options }),
  };
}
