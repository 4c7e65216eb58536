"""People and organizations."""

from __future__ import annotations

import secrets

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models.functions import Lower


def new_user_public_id() -> str:
    return f"usr_{secrets.token_hex(6)}"


class User(AbstractUser):
    """A person (school staff) or an agent builder. `public_id` is what the API and JWTs show."""

    public_id = models.CharField(max_length=32, unique=True, default=new_user_public_id, editable=False)
    email = models.EmailField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                Lower("email"),
                name="accounts_user_email_ci_unique",
                condition=~models.Q(email=""),
            )
        ]
