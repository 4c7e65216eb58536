"""One embedding model per deployment (docs/algorithms.md §10.3).

Every process embeds with the model its `EMBEDDING_PROVIDER` names (memoryhub/settings.py: MiniLM
unless set, the same default for the web server, the workers and every management command). A
query vector is only comparable with stored vectors of the same model, so the deployment records
ONE model, in the one-row table `DeploymentEmbeddingModel`:

* the first process that embeds records its own model (`deployment_model_mismatch` claims it);
* a process configured for another model writes no vector: workers log why and leave the rows
  where they are, commands refuse with `EmbeddingModelMismatch` (one line saying why and how to
  switch), and search reports its semantic leg as skipped instead of comparing two models' vectors;
* only `manage.py reembed --switch-model` changes it (`deployment_model_switch`), and leaves it
  unverified so the sweep re-embeds whatever vector of the old model remains.
"""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from memories.models import DeploymentEmbeddingModel
from memories.search.embeddings import HashEmbedder, MiniLMEmbedder


def _provider_setting(model_id: str) -> str:
    """The setting that makes a process embed with `model_id` (for the refusal's advice)."""
    name = model_id.rsplit("/", 1)[0]
    if name == HashEmbedder.name:
        return "EMBEDDING_PROVIDER=hash"
    if name == MiniLMEmbedder.name:
        return "EMBEDDING_PROVIDER=minilm with MINILM_RUNTIME=onnx or torch"
    if name == MiniLMEmbedder.int8_name:
        return "EMBEDDING_PROVIDER=minilm (MINILM_RUNTIME=onnx-int8, the default)"
    return f"EMBEDDING_PROVIDER=openai with EMBEDDING_MODEL={name}"


class EmbeddingModelMismatch(Exception):
    """This process would embed with another model than the deployment's."""

    def __init__(self, *, configured: str, deployment: str) -> None:
        self.configured = configured
        self.deployment = deployment
        super().__init__(
            f"refusing to embed: this process embeds with {configured} (EMBEDDING_PROVIDER="
            f"{settings.EMBEDDING_PROVIDER}), but the deployment's vectors are {deployment}, the model search "
            f"compares queries with. Set {_provider_setting(deployment)} (the deployment's model) here, or switch "
            f"the deployment deliberately: `manage.py reembed --switch-model` re-embeds every memory with "
            f"{configured} and records it as the deployment's model."
        )


# The same read as a scalar subquery (NULL before anything was embedded), for a statement that
# carries it with other reads: search's first statement.
DEPLOYMENT_MODEL_SQL = f"SELECT model_id FROM {DeploymentEmbeddingModel._meta.db_table} WHERE id = 1"  # noqa: S608


def deployment_model_id() -> str | None:
    """The deployment's model id, or None before anything was ever embedded (one primary-key read)."""
    return DeploymentEmbeddingModel.objects.filter(pk=1).values_list("model_id", flat=True).first()


def deployment_model_claim(model_id: str) -> DeploymentEmbeddingModel:
    """The deployment's model row; if there is none yet, `model_id` becomes it (first writer wins,
    race-free: INSERT … ON CONFLICT DO NOTHING, then read what is there). Recorded unverified, so
    the sweep looks once for vectors an earlier release stored with another model."""
    row = DeploymentEmbeddingModel.objects.filter(pk=1).first()
    if row is None:
        DeploymentEmbeddingModel.objects.bulk_create(
            [DeploymentEmbeddingModel(pk=1, model_id=model_id, recorded_at=timezone.now())], ignore_conflicts=True)
        row = DeploymentEmbeddingModel.objects.get(pk=1)
    return row


def deployment_model_mismatch(model_id: str) -> EmbeddingModelMismatch | None:
    """Why a process embedding with `model_id` must not store vectors here, or None if it may
    (claiming the deployment's model for it when none is recorded yet)."""
    deployment = deployment_model_claim(model_id).model_id
    return None if deployment == model_id else EmbeddingModelMismatch(configured=model_id, deployment=deployment)


def deployment_model_switch(model_id: str) -> str | None:
    """Make `model_id` the deployment's model, unverified (the caller re-embeds); returns the previous one."""
    previous = deployment_model_id()
    if previous == model_id:  # already it: only look again for other models' vectors
        DeploymentEmbeddingModel.objects.filter(pk=1).update(verified_at=None)
    else:
        DeploymentEmbeddingModel.objects.update_or_create(
            pk=1, defaults={"model_id": model_id, "recorded_at": timezone.now(), "verified_at": None})
    return previous


def deployment_model_verified(model_id: str) -> None:
    """Record that no stored vector of another model than `model_id` remains (only if it is still
    the deployment's model: a switch meanwhile must be verified on its own)."""
    DeploymentEmbeddingModel.objects.filter(pk=1, model_id=model_id).update(verified_at=timezone.now())
