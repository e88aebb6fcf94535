"""DB-DJANGO's application: Django, WSGI, its ORM on psycopg 3 with persistent connections, and
its own template engine for the fortunes (TechEmpower's test types, db_rules.py).

One module is the whole project: the settings, the two models (over the tables bench/postgres.py
makes), the views and the URLs. The database is the one libpq's variables name (PGHOST, PGPORT,
PGUSER, PGDATABASE, set by the harness). CONN_MAX_AGE None keeps each thread's connection open
for the life of the worker, as Django's docs advise where the connection cost matters ("Persistent
connections"); the threads of a worker each hold one.
"""

import os

import db_rules
import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["PGDATABASE"],
            "USER": os.environ["PGUSER"],
            "HOST": os.environ["PGHOST"],
            "PORT": os.environ["PGPORT"],
            "CONN_MAX_AGE": None,
        }
    },
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [db_rules.TEMPLATES]}],
)
django.setup()

# Django's models and views can be imported only once it is set up.
from django.core.handlers.wsgi import WSGIHandler
from django.db import models, transaction
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path


class World(models.Model):
    randomnumber = models.IntegerField()

    class Meta:
        app_label = "bench"
        db_table = "world"
        managed = False


class Fortune(models.Model):
    message = models.CharField(max_length=2048)

    class Meta:
        app_label = "bench"
        db_table = "fortune"
        managed = False


def _json(world: World) -> dict:
    return {"id": world.id, "randomNumber": world.randomnumber}


def _random_worlds(request) -> list[World]:
    """As many random rows of world as the queries parameter asks for (db_rules), a query each."""
    count = db_rules.query_count(request.GET.get("queries"))
    return [World.objects.get(id=world_id) for world_id in db_rules.random_ids(count)]


def ready(request):
    return HttpResponse(db_rules.READY_BODY, content_type="text/plain")


def db(request):
    return JsonResponse(_json(World.objects.get(id=db_rules.random_id())))


def queries(request):
    return JsonResponse([_json(world) for world in _random_worlds(request)], safe=False)


def fortunes(request):
    rows = [*Fortune.objects.all(), Fortune(id=0, message=db_rules.ADDITIONAL_FORTUNE)]
    rows.sort(key=lambda fortune: fortune.message)
    return render(request, db_rules.FORTUNES_TEMPLATE, {"fortunes": rows})


def updates(request):
    worlds = _random_worlds(request)
    for world in worlds:
        world.randomnumber = db_rules.random_number()
    with transaction.atomic():
        for world in sorted(worlds, key=lambda world: world.id):
            world.save(update_fields=["randomnumber"])
    return JsonResponse([_json(world) for world in worlds], safe=False)


urlpatterns = [
    path("", ready),
    path("db", db),
    path("queries", queries),
    path("fortunes", fortunes),
    path("updates", updates),
]

application = WSGIHandler()
