"""DB-FASTAPI's application: FastAPI, ASGI, asyncpg through a connection pool made in the
lifespan, and Jinja2 templates (Starlette's Jinja2Templates) for the fortunes (TechEmpower's test
types, db_rules.py).

The pool is asyncpg's create_pool at its defaults (10 connections per worker), on the database
libpq's variables name (PGHOST, PGPORT, PGUSER, PGDATABASE, set by the harness), made when the
server runs the lifespan's startup in each worker, on that worker's event loop, as FastAPI's docs
advise for resources an application shares between requests ("Lifespan Events").
"""

from contextlib import asynccontextmanager

import asyncpg
import db_rules
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from fastapi.templating import Jinja2Templates

SELECT_WORLD = "SELECT id, randomnumber FROM world WHERE id = $1"
UPDATE_WORLD = "UPDATE world SET randomnumber = $1 WHERE id = $2"


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with asyncpg.create_pool() as pool:
        app.state.pool = pool
        yield


app = FastAPI(lifespan=lifespan)
templates = Jinja2Templates(directory=db_rules.TEMPLATES)


def _json(row) -> dict:
    return {"id": row[0], "randomNumber": row[1]}


async def _random_rows(connection: asyncpg.Connection, queries: str | None) -> list:
    """As many random rows of world as the queries parameter asks for (db_rules), a query each."""
    return [
        await connection.fetchrow(SELECT_WORLD, world_id)
        for world_id in db_rules.random_ids(db_rules.query_count(queries))
    ]


@app.get("/", response_class=PlainTextResponse)
async def ready():
    return db_rules.READY_BODY


@app.get("/db")
async def db(request: Request):
    async with request.app.state.pool.acquire() as connection:
        row = await connection.fetchrow(SELECT_WORLD, db_rules.random_id())
    return _json(row)


# The parameter is read as text and clamped by db_rules, as TechEmpower asks ("foo" is 1), where
# an int parameter would answer it with FastAPI's 422.
@app.get("/queries")
async def queries(request: Request, queries: str | None = None):
    async with request.app.state.pool.acquire() as connection:
        rows = await _random_rows(connection, queries)
    return [_json(row) for row in rows]


@app.get("/fortunes")
async def fortunes(request: Request):
    async with request.app.state.pool.acquire() as connection:
        rows = [(row["id"], row["message"]) for row in await connection.fetch("SELECT id, message FROM fortune")]
    rows.append((0, db_rules.ADDITIONAL_FORTUNE))
    rows.sort(key=lambda row: row[1])
    return templates.TemplateResponse(
        request,
        db_rules.FORTUNES_TEMPLATE,
        {"fortunes": [{"id": number, "message": message} for number, message in rows]},
    )


@app.get("/updates")
async def updates(request: Request, queries: str | None = None):
    async with request.app.state.pool.acquire() as connection:
        rows = await _random_rows(connection, queries)
        worlds = [(world_id, db_rules.random_number()) for world_id, _old in rows]
        async with connection.transaction():
            await connection.executemany(UPDATE_WORLD, [(number, world_id) for world_id, number in sorted(worlds)])
    return [_json(world) for world in worlds]
