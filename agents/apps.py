from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """Agent-facing protocols on the same services, keys and privacy rules as the REST API: MCP over
    streamable HTTP at /mcp (docs/architecture.md §12)."""

    name = "agents"
