"""MemoryHub: a memory cloud for AI agents and the schools that run them."""

from memoryhub.celery import app as celery_app

__all__ = ("celery_app",)
