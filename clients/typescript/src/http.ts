/**
 * The transport: one `request` per API call, on the platform's `fetch` (no runtime dependency).
 *
 * - Authentication: `Authorization: Bearer <key>`; `X-Agent-Id` when an agent id is set, so every
 *   memory written names the agent in `written_by` (the service's docs/api.md §1).
 * - Timeouts: every attempt is bounded by `AbortSignal.timeout(timeoutMs)` (combined with the
 *   caller's own `signal`, which is never retried).
 * - Retries: a 429 or 503 is retried after its `Retry-After` (seconds), or an exponential back-off
 *   when it sends none, at most `maxRetries` times; a wait longer than `maxRetryDelayMs` is not
 *   made: the error is thrown at once with its `retryAfter`, for the caller to decide. Both answers
 *   mean the request was not carried out (the service throttles before it acts, and fails closed),
 *   so every method is retried. A connection failure or a timeout is retried only for idempotent
 *   methods (GET, HEAD, PUT, DELETE): a POST may have been applied.
 * - Errors: any non-2xx answer becomes a `MemoryHubError` subclass (errors.ts).
 */

import {
  errorFor,
  MemoryHubConnectionError,
  MemoryHubError,
  MemoryHubTimeoutError,
} from "./errors.js";

export interface ClientOptions {
  /** The service's address, e.g. `http://127.0.0.1:8000` (the API is under `/api/v1/`). */
  baseUrl: string;
  /** A `knl_sk_…` API key (or a JWT). */
  apiKey: string;
  /** Sent as `X-Agent-Id`: names this agent in what it writes (at most 100 characters). */
  agentId?: string;
  /** Per-attempt timeout in milliseconds (default 30 000). */
  timeoutMs?: number;
  /** Retries after a 429/503 (or, idempotent calls only, a failed connection); default 3. */
  maxRetries?: number;
  /** The longest single wait, Retry-After included, in milliseconds (default 30 000). */
  maxRetryDelayMs?: number;
  /** Called before each retry's wait: for logging, metrics, tests. */
  onRetry?: (retry: RetryInfo) => void;
  /** A `fetch` of your own (a proxy agent, instrumentation); default: the global one. */
  fetch?: typeof fetch;
}

export interface RetryInfo {
  method: string;
  url: string;
  /** 1 for the first retry. */
  attempt: number;
  /** The answer's status, or 0 for a connection failure or timeout. */
  status: number;
  /** The answer's Retry-After in seconds, when sent. */
  retryAfter: number | null;
  /** How long the client waits before the retry. */
  delayMs: number;
}

export interface RequestOptions {
  /** An AbortSignal of the caller's: aborts the call (and any wait between retries). */
  signal?: AbortSignal;
  /** This call's timeout, overriding the client's. */
  timeoutMs?: number;
}

export type Query = Record<string, string | number | boolean | readonly string[] | null | undefined>;

export interface Call extends RequestOptions {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
  query?: Query;
  body?: unknown;
  /** `text`: return the body as text (MEMORY.md); default: parsed JSON (undefined for a 204). */
  as?: "json" | "text";
}

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT", "DELETE"]);
const BACKOFF_BASE_MS = 500;

/** A path from segments, each percent-encoded: `pathOf("api/v1/stacks", stack, "load")`. */
export function pathOf(...segments: readonly string[]): string {
  return "/" + segments.map((s, i) => (i === 0 ? s.replace(/^\/+|\/+$/g, "") : encodeURIComponent(s))).join("/");
}

/** Seconds from a Retry-After header (delta-seconds or an HTTP date), or null. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | null {
  if (value === null || value.trim() === "") return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - now) / 1000);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export class Transport {
  readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly agentId: string | undefined;
  private readonly timeoutMs: number;
  private readonly maxRetries: number;
  private readonly maxRetryDelayMs: number;
  private readonly onRetry: ((retry: RetryInfo) => void) | undefined;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options.baseUrl) throw new TypeError("MemoryHub: baseUrl is required");
    if (!options.apiKey) throw new TypeError("MemoryHub: apiKey is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.agentId = options.agentId;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.maxRetries = options.maxRetries ?? 3;
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 30_000;
    this.onRetry = options.onRetry;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  url(path: string, query?: Query): string {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value === undefined || value === null) continue;
      if (Array.isArray(value)) {
        for (const item of value) url.searchParams.append(name, item);
      } else {
        url.searchParams.set(name, String(value));
      }
    }
    return url.toString();
  }

  async request<T>(call: Call): Promise<T> {
    const url = this.url(call.path, call.query);
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.apiKey}`,
      Accept: call.as === "text" ? "text/markdown, text/plain, application/json" : "application/json",
    };
    if (this.agentId) headers["X-Agent-Id"] = this.agentId;
    let payload: string | undefined;
    if (call.body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(call.body);
    }
    for (let attempt = 0; ; attempt++) {
      const timeout = AbortSignal.timeout(call.timeoutMs ?? this.timeoutMs);
      const signal = call.signal ? AbortSignal.any([call.signal, timeout]) : timeout;
      let response: Response;
      try {
        response = await this.fetchImpl(url, { method: call.method, headers, body: payload, signal });
      } catch (cause) {
        if (call.signal?.aborted) throw cause;
        const timedOut = timeout.aborted;
        const error = new (timedOut ? MemoryHubTimeoutError : MemoryHubConnectionError)({
          status: 0, code: timedOut ? "timeout" : "connection_error", method: call.method, url, cause,
          message: timedOut ? `${call.method} ${url}: no answer within ${call.timeoutMs ?? this.timeoutMs} ms`
            : `${call.method} ${url}: ${(cause as Error)?.message ?? "connection failed"}`,
        });
        if (!IDEMPOTENT.has(call.method)) throw error;
        await this.retryOrThrow(error, attempt, call, url);
        continue;
      }
      if (response.ok) return (await this.read(response, call.as)) as T;
      const body = await this.read(response, "json").catch(() => undefined);
      const error = errorFor(response.status, body, {
        method: call.method, url, retryAfter: parseRetryAfter(response.headers.get("Retry-After")),
      });
      if (response.status !== 429 && response.status !== 503) throw error;
      await this.retryOrThrow(error, attempt, call, url);
    }
  }

  private async retryOrThrow(error: MemoryHubError, attempt: number, call: Call, url: string): Promise<void> {
    if (attempt >= this.maxRetries) throw error;
    let delayMs: number;
    if (error.retryAfter !== null) {
      delayMs = Math.ceil(error.retryAfter * 1000);
      if (delayMs > this.maxRetryDelayMs) throw error; // longer than we may wait: the caller decides
    } else {
      const backoff = Math.min(this.maxRetryDelayMs, BACKOFF_BASE_MS * 2 ** attempt);
      delayMs = Math.round(backoff / 2 + Math.random() * (backoff / 2));
    }
    this.onRetry?.({
      method: call.method, url, attempt: attempt + 1, status: error.status, retryAfter: error.retryAfter, delayMs,
    });
    await sleep(delayMs, call.signal);
  }

  private async read(response: Response, as: "json" | "text" = "json"): Promise<unknown> {
    if (response.status === 204) return undefined;
    const text = await response.text();
    if (as === "text") return text;
    if (text === "") return undefined;
    const type = response.headers.get("Content-Type") ?? "";
    return type.includes("json") ? JSON.parse(text) : text;
  }
}
