/**
 * MemoryHub's error contract as exceptions.
 *
 * Every refusal of the service is `{"error": {"code", "message", "fields"}, "detail"}` with a 4xx
 * or 5xx status (the service's docs/api.md §1, docs/architecture.md §8). `errorFor` turns one into
 * the subclass of `MemoryHubError` for its status (and, for `unknown_field`, its code), carrying
 * the code, the message and the per-field messages exactly as sent.
 */

/** Per-field messages: `{"priorty": ["Unknown field. Did you mean 'priority'?"]}`. */
export type ErrorFields = Record<string, unknown>;

export interface ErrorDetails {
  status: number;
  code: string;
  message: string;
  fields?: ErrorFields;
  retryAfter?: number | null;
  method?: string;
  url?: string;
  body?: unknown;
  cause?: unknown;
}

/** Base of every error the client throws. `status` is 0 when no HTTP answer arrived. */
export class MemoryHubError extends Error {
  readonly status: number;
  /** The contract's machine-readable code (`unknown_field`, `not_found`, `throttled`, …). */
  readonly code: string;
  /** Field name → messages, as the service sent them (empty when the refusal names no field). */
  readonly fields: ErrorFields;
  /** Seconds the service asked us to wait (Retry-After), when it sent one. */
  readonly retryAfter: number | null;
  readonly method: string | undefined;
  readonly url: string | undefined;
  /** The parsed response body (or its text when it was not JSON). */
  readonly body: unknown;

  constructor(details: ErrorDetails) {
    super(details.message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status;
    this.code = details.code;
    this.fields = details.fields ?? {};
    this.retryAfter = details.retryAfter ?? null;
    this.method = details.method;
    this.url = details.url;
    this.body = details.body;
  }
}

/** 400: the request was refused as it stands (`invalid`, `invalid_cursor`, …); see `fields`. */
export class BadRequestError extends MemoryHubError {}
/** 400 `unknown_field`: a field the memory's kind does not have; `fields` names it. */
export class UnknownFieldError extends BadRequestError {}
/** 401: no credential, or one the service does not accept. */
export class AuthenticationError extends MemoryHubError {}
/** 402: the school's plan has no room for this (storage, stacks). */
export class QuotaExceededError extends MemoryHubError {}
/** 403: the key may see the stack but not do this (a read-only key writing, a teacher's key …). */
export class PermissionDeniedError extends MemoryHubError {}
/** 404: not there, or not visible to this key (another school's stack is a 404, never a 403). */
export class NotFoundError extends MemoryHubError {}
/** 409: the stack is archived, a version conflict, a duplicate. */
export class ConflictError extends MemoryHubError {}
/** 413: the body is over the service's size limits. */
export class PayloadTooLargeError extends MemoryHubError {}
/** 422: well-formed input the service refuses to store (e.g. a secret redaction cannot make safe). */
export class UnprocessableError extends MemoryHubError {}
/** 429: rate limited, after the client's own retries (see `retryAfter`). */
export class RateLimitError extends MemoryHubError {}
/** 503: the database or Redis cannot be read (the service fails closed), after retries. */
export class ServiceUnavailableError extends MemoryHubError {}
/** Any other 5xx. */
export class ServerError extends MemoryHubError {}
/** No answer: the connection failed (status 0, code `connection_error`). */
export class MemoryHubConnectionError extends MemoryHubError {}
/** No answer within the request's timeout (status 0, code `timeout`). */
export class MemoryHubTimeoutError extends MemoryHubError {}

const BY_STATUS: Record<number, new (details: ErrorDetails) => MemoryHubError> = {
  400: BadRequestError,
  401: AuthenticationError,
  402: QuotaExceededError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: UnprocessableError,
  429: RateLimitError,
  503: ServiceUnavailableError,
};

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The exception for an HTTP refusal: the contract's code, message and fields when the body has them. */
export function errorFor(status: number, body: unknown, extra: Omit<ErrorDetails, "status" | "code" | "message">)
  : MemoryHubError {
  const error = isObject(body) && isObject(body.error) ? body.error : {};
  const code = typeof error.code === "string" ? error.code : `http_${status}`;
  const detail = isObject(body) && typeof body.detail === "string" ? body.detail : undefined;
  const message = typeof error.message === "string" ? error.message
    : detail ?? (typeof body === "string" && body ? body.slice(0, 200) : `HTTP ${status}`);
  const fields = isObject(error.fields) ? error.fields : {};
  const details: ErrorDetails = { ...extra, status, code, message, fields, body };
  if (status === 400 && code === "unknown_field") return new UnknownFieldError(details);
  const Class = BY_STATUS[status] ?? (status >= 500 ? ServerError : MemoryHubError);
  return new Class(details);
}
