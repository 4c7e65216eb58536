"""An agent on a device: the real kernle CLI signed in with an API key to one stack, as the
dashboard's key page tells a school to connect one (used by the browser tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.conftest import KernleCLI


def cli_output(result: Any) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@dataclass
class Agent:
    kernle: KernleCLI
    device: Path
    stack: str
    raw_id: str = ""

    def run(self, *args: str, input: str | None = None) -> Any:
        return self.kernle.run(*args, data_dir=self.device, stack=self.stack, input=input)

    def note(self, fact: str) -> None:
        """A note derived from the session's raw capture (kernle wants provenance); local until a push."""
        noted = self.run("note", fact, "--derived-from", f"raw:{self.raw_id}")
        assert noted.returncode == 0, cli_output(noted)


def agent_signed_in(kernle: KernleCLI, *, secret: str, backend_url: str, stack: str, transcript: str) -> Agent:
    """A fresh device logged in with `secret`, holding one raw capture of a tutoring session."""
    agent = Agent(kernle=kernle, device=kernle.new_data_dir(), stack=stack)
    logged_in = agent.run("auth", "login", "--api-key", secret, "--backend-url", backend_url, "--json")
    assert logged_in.returncode == 0, cli_output(logged_in)
    captured = agent.run("raw", "capture", "--stdin", "--quiet", input=f"{transcript}\n")
    assert captured.returncode == 0, cli_output(captured)
    agent.raw_id = kernle.json(agent.run("raw", "list", "--json"))[0]["id"]
    return agent
