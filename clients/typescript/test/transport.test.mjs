// The transport's retry and timeout rules, on a local HTTP server that answers what each case needs
// (the live scenario meets a real 429; these are the cases a healthy service rarely shows).

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import {
  MemoryHub, MemoryHubConnectionError, MemoryHubTimeoutError, RateLimitError, ServiceUnavailableError,
  parseRetryAfter,
} from "../dist/index.js";

let server;
let baseUrl;
const seen = [];
let script = [];

before(async () => {
  server = createServer((request, response) => {
    seen.push(`${request.method} ${request.url}`);
    const step = script.shift() ?? { status: 200, body: { ok: true } };
    if (step.hang) return; // never answers: the client's timeout must end the call
    response.writeHead(step.status, { "Content-Type": "application/json", ...step.headers });
    response.end(JSON.stringify(step.body ?? {}));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${server.address().port}`;
});

after(() => {
  server.closeAllConnections();
  server.close();
});

const refusal = (code) => ({ error: { code, message: code, fields: {} }, detail: code });

test("a 503 without Retry-After is retried with back-off, then succeeds", async () => {
  seen.length = 0;
  script = [{ status: 503, body: refusal("service_unavailable") }, { status: 200, body: { memories: [] } }];
  const retries = [];
  const hub = new MemoryHub({ baseUrl, apiKey: "k", onRetry: (r) => retries.push(r) });
  await hub.load("ada");
  assert.equal(seen.length, 2);
  assert.equal(retries.length, 1);
  assert.equal(retries[0].retryAfter, null);
  assert.ok(retries[0].delayMs >= 250 && retries[0].delayMs <= 500, String(retries[0].delayMs));
});

test("retries are capped: the last refusal is thrown with its code", async () => {
  script = [1, 2, 3].map(() => ({ status: 503, body: refusal("service_unavailable"), headers: { "Retry-After": "0" } }));
  const hub = new MemoryHub({ baseUrl, apiKey: "k", maxRetries: 2 });
  const error = await hub.load("ada").catch((e) => e);
  assert.ok(error instanceof ServiceUnavailableError, String(error));
  assert.equal(error.code, "service_unavailable");
  assert.equal(script.length, 0);
});

test("a Retry-After longer than the longest wait is thrown at once", async () => {
  seen.length = 0;
  script = [{ status: 429, body: refusal("throttled"), headers: { "Retry-After": "3600" } }];
  const hub = new MemoryHub({ baseUrl, apiKey: "k", maxRetryDelayMs: 5_000 });
  const error = await hub.search("ada", "x").catch((e) => e);
  assert.ok(error instanceof RateLimitError, String(error));
  assert.equal(error.retryAfter, 3600);
  assert.equal(seen.length, 1);
});

test("a call that gets no answer times out; only idempotent calls are retried", async () => {
  seen.length = 0;
  script = [{ hang: true }, { hang: true }];
  const hub = new MemoryHub({ baseUrl, apiKey: "k", timeoutMs: 100, maxRetries: 1 });
  const get = await hub.load("ada").catch((e) => e);
  assert.ok(get instanceof MemoryHubTimeoutError, String(get));
  assert.equal(get.code, "timeout");
  assert.equal(seen.length, 2); // GET: tried twice
  seen.length = 0;
  script = [{ hang: true }];
  const post = await hub.remember("ada", { kind: "note", content: "x" }).catch((e) => e);
  assert.ok(post instanceof MemoryHubTimeoutError);
  assert.equal(seen.length, 1); // POST: may have been applied, not retried
});

test("a refused connection is a MemoryHubConnectionError", async () => {
  const hub = new MemoryHub({ baseUrl: "http://127.0.0.1:9", apiKey: "k", maxRetries: 0 });
  const error = await hub.load("ada").catch((e) => e);
  assert.ok(error instanceof MemoryHubConnectionError, String(error));
  assert.equal(error.status, 0);
});

test("the caller's signal cancels a call, waits between retries included", async () => {
  script = [{ status: 429, body: refusal("throttled"), headers: { "Retry-After": "20" } }];
  const hub = new MemoryHub({ baseUrl, apiKey: "k" });
  const started = performance.now();
  const error = await hub.load("ada", {}, { signal: AbortSignal.timeout(100) }).catch((e) => e);
  assert.equal(error.name, "TimeoutError");
  assert.ok(performance.now() - started < 5_000);
});

test("Retry-After in seconds or as an HTTP date", () => {
  assert.equal(parseRetryAfter("7"), 7);
  assert.equal(parseRetryAfter(null), null);
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("Thu, 01 Jan 2026 00:00:30 GMT", now), 30);
  assert.equal(parseRetryAfter("soon"), null);
});

test("headers and paths: the key, the agent id, encoded segments", async () => {
  let headers;
  const local = createServer((request, response) => {
    headers = { url: request.url, ...request.headers };
    response.writeHead(204).end();
  });
  await new Promise((resolve) => local.listen(0, "127.0.0.1", resolve));
  const hub = new MemoryHub({ baseUrl: `http://127.0.0.1:${local.address().port}/`, apiKey: "knl_sk_x", agentId: "tutor" });
  await hub.bootConfig.delete("ada", "a b/c");
  local.close();
  assert.equal(headers.authorization, "Bearer knl_sk_x");
  assert.equal(headers["x-agent-id"], "tutor");
  assert.equal(headers.url, "/api/v1/stacks/ada/boot-config/a%20b%2Fc");
});
