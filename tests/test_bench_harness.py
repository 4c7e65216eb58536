"""The benchmarks' service runs another checkout of the code as `make run` would run it
(bench/service.py): an A/B measures the code, not two embedding runtimes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
