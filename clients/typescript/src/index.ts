/**
 * @memoryhub/client — MemoryHub's native REST API for TypeScript and JavaScript (ESM, Node ≥ 20.3
 * or any runtime with `fetch` and `AbortSignal.timeout`/`AbortSignal.any`).
 *
 *   import { MemoryHub } from "@memoryhub/client";
 *   const hub = new MemoryHub({ baseUrl: "http://127.0.0.1:8000", apiKey: process.env.MEMORYHUB_KEY!, agentId: "tutor" });
 *   await hub.remember("ada", { kind: "note", content: "Fractions click with pizza diagrams" });
 *   const found = await hub.search("ada", "what helps with fractions?", { limit: 5 });
 */

export { CursorList, MemoryHub } from "./client.js";
export type { ClientOptions, RequestOptions, RetryInfo } from "./http.js";
export { parseRetryAfter } from "./http.js";
export {
  AuthenticationError,
  BadRequestError,
  ConflictError,
  MemoryHubConnectionError,
  MemoryHubError,
  MemoryHubTimeoutError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  QuotaExceededError,
  RateLimitError,
  ServerError,
  ServiceUnavailableError,
  UnknownFieldError,
  UnprocessableError,
} from "./errors.js";
export type { ErrorDetails, ErrorFields } from "./errors.js";
export type * from "./types.js";
export type { components, operations, paths } from "./schema.js";
