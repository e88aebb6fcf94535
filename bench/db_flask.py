"""DB-FLASK's application: Flask, WSGI, psycopg 3 through a psycopg_pool connection pool, and
Jinja2 templates (Flask's own) for the fortunes (TechEmpower's test types, db_rules.py).

The pool is psycopg_pool's ConnectionPool at its default size (4 connections, as many as the 4
threads each worker runs here), on the database libpq's variables name (PGHOST, PGPORT, PGUSER,
PGDATABASE, set by the harness), its connections in autocommit mode as Django's and asyncpg's are
(a read is one round trip, with no BEGIN and COMMIT around it; the updates have a transaction of
their own). It is opened by the first request a process serves, not at
import: a server that imports the application and then forks its workers (maitred's zygote, a
preloading gunicorn) would otherwise hand every worker the same connections, which psycopg's docs
warn against.
"""

import threading

import db_rules
import psycopg
import psycopg_pool
from flask import Flask, jsonify, render_template, request

app = Flask(__name__, template_folder=db_rules.TEMPLATES)

_pool: psycopg_pool.ConnectionPool | None = None
_pool_opening = threading.Lock()

SELECT_WORLD = "SELECT id, randomnumber FROM world WHERE id = %s"
UPDATE_WORLD = "UPDATE world SET randomnumber = %s WHERE id = %s"


def _connection():
    global _pool
    if _pool is None:
        with _pool_opening:
            if _pool is None:
                _pool = psycopg_pool.ConnectionPool(kwargs={"autocommit": True}, open=True)
    return _pool.connection()


def _json(row: tuple[int, int]) -> dict:
    return {"id": row[0], "randomNumber": row[1]}


def _random_rows(connection: psycopg.Connection) -> list[tuple[int, int]]:
    """As many random rows of world as the request's queries parameter asks for (db_rules), a
    query each."""
    count = db_rules.query_count(request.args.get("queries"))
    return [connection.execute(SELECT_WORLD, (world_id,)).fetchone() for world_id in db_rules.random_ids(count)]


@app.get("/")
def ready():
    return db_rules.READY_BODY


@app.get("/db")
def db():
    with _connection() as connection:
        row = connection.execute(SELECT_WORLD, (db_rules.random_id(),)).fetchone()
    return jsonify(_json(row))


@app.get("/queries")
def queries():
    with _connection() as connection:
        rows = _random_rows(connection)
    return jsonify([_json(row) for row in rows])


@app.get("/fortunes")
def fortunes():
    with _connection() as connection:
        rows = connection.execute("SELECT id, message FROM fortune").fetchall()
    rows.append((0, db_rules.ADDITIONAL_FORTUNE))
    rows.sort(key=lambda row: row[1])
    return render_template(
        db_rules.FORTUNES_TEMPLATE, fortunes=[{"id": number, "message": message} for number, message in rows]
    )


@app.get("/updates")
def updates():
    with _connection() as connection:
        rows = _random_rows(connection)
        worlds = [(world_id, db_rules.random_number()) for world_id, _old in rows]
        with connection.transaction(), connection.cursor() as cursor:
            cursor.executemany(UPDATE_WORLD, [(number, world_id) for world_id, number in sorted(worlds)])
    return jsonify([_json(world) for world in worlds])
