"""all-MiniLM-L6-v2 on ONNX Runtime (the default `minilm` runtime) against the torch model it replaces.

The export is made by `make install` (build/models/all-MiniLM-L6-v2); these tests use it as
installed. What a school relies on: the vectors mean what torch's meant (cosine to torch's), a
query is embedded exactly as the memory it should find, the model id says which vectors are
comparable, and a missing export degrades to torch instead of failing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings as django_settings

from memories.search.embedding_jobs import memories_embed
from memories.search.embedding_model import deployment_model_switch
from memories.search.embeddings import MiniLMEmbedder, _embedder_for, get_embedder, query_cache
from memories.search.hybrid import search_memories
from memories.search.onnx_embedder import FP32_FILE, INT8_FILE
from memories.search.query import SearchQuery
from memories.services import memory_create
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.slow  # exports and runs the real model

TEXTS = [
    "how does this student learn fractions?",
    "Alice understands fractions much better when the teacher cuts a pizza into equal slices.",
    "Émilie a peint un lever de soleil après l'école.",
    "Parent meeting moved to Thursday 4pm; bring the reading log and the maths portfolio.",
    "Which books did Maya enjoy last term, and what did she say about the ending of Holes?",
    "Photosynthesis converts light energy into chemical energy stored in glucose. " * 20,
]


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return np.asarray(MiniLMEmbedder(runtime="torch").embed(TEXTS))


@pytest.fixture(autouse=True)
def _export_installed() -> None:
    for name in (FP32_FILE, INT8_FILE):
        path = django_settings.MINILM_ONNX_DIR / name
        assert path.is_file(), f"{path} is missing: `make install` exports it (memories/search/export_onnx.py)"


@pytest.fixture
def fresh_embedders() -> Iterator[None]:
    _embedder_for.cache_clear()
    query_cache.clear()
    yield
    _embedder_for.cache_clear()
    query_cache.clear()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_fp32_export_computes_torchs_vectors_and_shares_its_model_id(torch_vectors: np.ndarray) -> None:
    onnx = MiniLMEmbedder(runtime="onnx")
    assert onnx.runtime == "onnx"
    assert onnx.model_id == MiniLMEmbedder(runtime="torch").model_id == "all-MiniLM-L6-v2/384"
    got = np.asarray(onnx.embed(TEXTS))
    assert got.shape == (len(TEXTS), 384)
    assert cosines(got, torch_vectors).min() > 0.9999


def test_int8_export_stays_close_to_torch_under_a_model_id_of_its_own(torch_vectors: np.ndarray) -> None:
    int8 = MiniLMEmbedder(runtime="onnx-int8")
    assert int8.runtime == "onnx-int8"
    assert int8.model_id == "all-MiniLM-L6-v2-int8/384"
    got = np.asarray(int8.embed(TEXTS))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert cosines(got, torch_vectors).min() >= 0.98


def test_int8_keeps_the_meaning_a_paraphrase_is_still_nearest() -> None:
    int8 = MiniLMEmbedder(runtime="onnx-int8")
    facts = np.asarray(int8.embed(TEXTS[1:5]))
    (query,) = np.asarray(int8.embed(["What helps this student grasp parts of a whole?"]))
    assert int((facts @ query).argmax()) == 0  # the pizza-slices fact, as with torch


@pytest.mark.parametrize("runtime", ["onnx-int8", "onnx"])
def test_a_query_is_embedded_exactly_as_the_same_text_in_a_batch(runtime: str) -> None:
    """A memory embedded by the worker in a batch and the same words as a search query get the
    same vector, whatever else shares the batch (int8 quantises activations per run)."""
    embedder = MiniLMEmbedder(runtime=runtime)
    batched = embedder.embed(TEXTS)
    reordered = embedder.embed(list(reversed(TEXTS)))[::-1]
    for text, in_batch, other_batch in zip(TEXTS, batched, reordered, strict=True):
        (alone,) = embedder.embed([text])
        assert alone == in_batch == other_batch


def test_empty_and_overlong_inputs() -> None:
    embedder = MiniLMEmbedder(runtime="onnx-int8")
    assert embedder.embed([]) == []
    empty, long_text = embedder.embed(["", "word " * 5000])
    assert len(empty) == len(long_text) == 384
    assert abs(float(np.linalg.norm(long_text)) - 1.0) < 1e-5


def test_missing_export_falls_back_to_torch_and_says_so(
        settings: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, torch_vectors: np.ndarray) -> None:
    settings.MINILM_ONNX_DIR = tmp_path / "nothing-here"
    with caplog.at_level(logging.WARNING, logger="memories.search.embeddings"):
        embedder = MiniLMEmbedder(runtime="onnx-int8")
    assert embedder.runtime == "torch"
    # Torch's vectors, so torch's model id: never the int8 id on vectors int8 did not make.
    assert embedder.model_id == "all-MiniLM-L6-v2/384"
    (message,) = [r.getMessage() for r in caplog.records if "MiniLM" in r.getMessage()]
    assert "model-int8.onnx is missing" in message and "make install" in message and "torch" in message
    assert cosines(np.asarray(embedder.embed(TEXTS[:2])), torch_vectors[:2]).min() > 0.9999


@pytest.mark.usefixtures("fresh_embedders")
def test_minilm_provider_defaults_to_int8_and_follows_the_runtime_setting(settings: Any) -> None:
    settings.EMBEDDING_PROVIDER = "minilm"
    assert get_embedder().model_id == "all-MiniLM-L6-v2-int8/384"
    settings.MINILM_RUNTIME = "onnx"
    assert get_embedder().model_id == "all-MiniLM-L6-v2/384"
    assert get_embedder().runtime == "onnx"  # type: ignore[attr-defined]
    settings.MINILM_RUNTIME = "torch"
    assert get_embedder().runtime == "torch"  # type: ignore[attr-defined]


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_embedders")
def test_int8_deployment_finds_its_own_schools_memory_and_never_another_schools(settings: Any) -> None:
    settings.EMBEDDING_PROVIDER = "minilm"
    deployment_model_switch(get_embedder().model_id)
    ours, theirs = make_org(), make_org()
    alice, other = make_stack(ours, "alice"), make_stack(theirs, "alice")
    mine = [memory_create(stack=alice, kind="note", payload={"content": text}, source="api") for text in TEXTS[1:5]]
    secret = memory_create(stack=other, kind="note", source="api",
                           payload={"content": "Bob understands fractions when the teacher cuts a pizza into slices."})
    assert memories_embed(ids=[m.pk for m in [*mine, secret]]).embedded == 5

    hits = search_memories(stack_ids=[alice.pk], query=SearchQuery(
        text="What helps this student grasp parts of a whole?", limit=3)).hits
    assert hits and hits[0].memory.pk == mine[0].pk
    assert hits[0].semantic_score is not None and hits[0].semantic_score > 0.3

    _, key = make_key(ours, stack=alice)
    results = bearer_client(key).post("/api/v1/stacks/alice/search", {
        "query": "pizza fractions", "limit": 100, "min_similarity": 0}, format="json").json()["results"]
    assert results
    assert str(secret.pk) not in {r["id"] for r in results}
    assert secret.record_id not in {r["id"] for r in results}
