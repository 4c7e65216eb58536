"""docs/architecture.md names every module of every app, so a newcomer finds where a feature lives
and a module added without a word on its room fails here (docs/architecture.md §2 and §3).

A module counts as named when the document has its path (`memories/search/hybrid.py`, or without
`.py`), or a line that names its folder (`search/`, `memories/search/`) and the module in backticks
(`hybrid`), as the room tables do. Packages' `__init__.py` and migrations are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
APPS = ("memoryhub", "accounts", "stacks", "billing", "teleport", "memories", "webhooks", "dashboard", "agents")


def app_modules() -> list[Path]:
    modules = []
    for app in APPS:
        for path in sorted((BASE_DIR / app).rglob("*.py")):
            relative = path.relative_to(BASE_DIR)
            if path.name == "__init__.py" or "migrations" in relative.parts:
                continue
            modules.append(relative)
    return modules


def is_named(module: Path, text: str, lines: list[str]) -> bool:
    full = module.as_posix()
    if full in text or full.removesuffix(".py") in text or ".".join(module.with_suffix("").parts) in text:
        return True
    folder = module.parent.as_posix() + "/"
    inner = "/".join(module.parent.parts[1:]) + "/" if len(module.parts) > 2 else None
    name = re.compile(rf"`{re.escape(module.stem)}(\.py)?`")
    for line in lines:
        in_folder = f"`{folder}" in line or (inner is not None and f"`{inner}" in line)
        if in_folder and name.search(line):
            return True
        if len(module.parts) > 2 and f"`{inner}{module.name}`" in line:
            return True
    return False


def test_architecture_names_every_module() -> None:
    text = (BASE_DIR / "docs" / "architecture.md").read_text()
    lines = text.splitlines()
    unnamed = [module.as_posix() for module in app_modules() if not is_named(module, text, lines)]
    assert unnamed == [], "docs/architecture.md does not name: " + ", ".join(unnamed)


def test_a_new_module_is_caught() -> None:
    text = (BASE_DIR / "docs" / "architecture.md").read_text()
    assert not is_named(Path("memories/search/brand_new_leg.py"), text, text.splitlines())
