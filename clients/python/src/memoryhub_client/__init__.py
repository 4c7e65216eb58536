"""MemoryHub's Python client: `MemoryHub` (sync) and `AsyncMemoryHub` (asyncio) over httpx.

    from memoryhub_client import MemoryHub

    with MemoryHub("http://127.0.0.1:8000", api_key, agent_id="tutor") as hub:
        hub.remember("ada", kind="note", content="Fractions click with pizza diagrams")
        hits = hub.search("ada", "how does Ada learn fractions?", limit=10)["results"]

The LangGraph store is `memoryhub_client.langgraph.MemoryHubStore` (extra `[langgraph]`).
Usage, errors and retries: clients/python/README.md.
"""

from memoryhub_client.async_client import AsyncMemoryHub
from memoryhub_client.client import MemoryHub
from memoryhub_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    MemoryHubError,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    TransportError,
    Unauthorized,
    UnknownField,
    Unprocessable,
)

__all__ = [
    "ApiError", "AsyncMemoryHub", "BadRequest", "Conflict", "Forbidden", "MemoryHub", "MemoryHubError", "NotFound",
    "PayloadTooLarge", "QuotaExceeded", "RateLimited", "ServerError", "ServiceUnavailable", "TransportError",
    "Unauthorized", "UnknownField", "Unprocessable",
]
