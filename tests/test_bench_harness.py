"""The benchmarks' service runs another checkout of the code as `make run` would run it
(bench/service.py): an A/B measures the code, not two embedding runtimes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import service
from bench.service import BASE_DIR, ONNX_EXPORT, checkout_env


def test_a_checkout_without_an_export_embeds_with_this_checkouts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    assert checkout_env(tmp_path) == {"MINILM_ONNX_DIR": str(BASE_DIR / ONNX_EXPORT)}


def test_this_checkout_a_checkout_with_its_own_export_or_a_chosen_one_are_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    assert checkout_env(BASE_DIR) == {}
    (tmp_path / ONNX_EXPORT).mkdir(parents=True)
    assert checkout_env(tmp_path) == {}
    monkeypatch.setenv("MINILM_ONNX_DIR", "/elsewhere")
    assert checkout_env(tmp_path.parent) == {}


def test_a_bench_run_from_a_worktree_borrows_the_export_of_the_checkout_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINILM_ONNX_DIR", raising=False)
    main, tree = tmp_path / "main", tmp_path / "tree"
    main.mkdir()
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "-C", str(main)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    subprocess.run([*git, "worktree", "add", "-q", str(tree)], check=True)
    (main / ONNX_EXPORT).mkdir(parents=True)
    monkeypatch.setattr(service, "BASE_DIR", tree)  # the bench itself runs from the worktree
    assert checkout_env(tree) == {"MINILM_ONNX_DIR": str(main.resolve() / ONNX_EXPORT)}
