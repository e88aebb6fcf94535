"""The settings the test Django applications share (tests/apps/django_app.py and
django_asgi_app.py), configured in code: no settings module, no database."""

from __future__ import annotations

import django
from django.conf import settings


def configure(urlconf: str) -> None:
    """Configures Django with the URLs of module `urlconf` and sets it up."""
    settings.configure(
        DEBUG=False,
        SECRET_KEY="maitred-tests-only",
        ALLOWED_HOSTS=["127.0.0.1"],
        ROOT_URLCONF=urlconf,
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        DATABASES={},
        USE_TZ=True,
    )
    django.setup()
