"""TechEmpower's rules for its database test types, shared by the three applications
(db_django.py, db_flask.py, db_fastapi.py), so that they ask the database for the same work.

- /db: one row of `world`, chosen at random, as JSON: {"id": 3217, "randomNumber": 2149}.
- /queries?queries=N: N rows, each by its own query, as a JSON list; N clamped to 1..500, and 1
  when it is missing or not a number.
- /fortunes: every row of `fortune` plus one made at request time, sorted by message, rendered
  as an HTML table through the framework's templates (escaped, UTF-8).
- /updates?queries=N: N rows read as in /queries, each given a new random number and written
  back, then returned as JSON.

The rows of one /updates request are distinct and written in the order of their ids, in one
transaction: two requests then lock the rows they share in the same order and never deadlock
(an error a server could not help, which would count against it as a non-2xx).
"""

import random
from pathlib import Path

WORLD_ROWS = 10_000
MAX_QUERIES = 500
ADDITIONAL_FORTUNE = "Additional fortune added at request time."
TEMPLATES = Path(__file__).resolve().parent / "db_templates"
FORTUNES_TEMPLATE = "fortunes.html"
# The readiness check the harness makes of every server (GET /) needs an answer of 200; it asks
# nothing of the database.
READY_BODY = "ready"


def query_count(text: str | None) -> int:
    """N from the queries parameter: clamped to 1..500, 1 when missing or not a number."""
    try:
        count = int(text or "")
    except ValueError:
        return 1
    return min(max(count, 1), MAX_QUERIES)


def random_id() -> int:
    return random.randint(1, WORLD_ROWS)


def random_ids(count: int) -> list[int]:
    """count distinct ids, in random order."""
    return random.sample(range(1, WORLD_ROWS + 1), count)


def random_number() -> int:
    return random.randint(1, WORLD_ROWS)
