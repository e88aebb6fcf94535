# maitred.conf.py: a production configuration for a Django or Flask application
# (docs/DEPLOY.md). maitred reads ./maitred.conf.py by itself when it is started in this
# directory; gunicorn's setting names work too (docs/GUNICORN.md).
import os

# The application: Django's WSGI module, or a Flask module's `app`.
wsgi_app = os.environ.get("APP", "mysite.wsgi:application")

# Behind nginx on the same machine: a Unix socket, or 127.0.0.1. WEB_CONCURRENCY, when set,
# gives the worker count (as on Heroku and most platforms), else "auto": one per CPU maitred may
# use, its cgroup's CPU quota or affinity mask, not os.cpu_count()'s cores of the whole host.
# For an application that mostly waits on its database, give a larger number.
bind = [os.environ.get("BIND", "unix:/run/maitred/maitred.sock")]
workers = os.environ.get("WEB_CONCURRENCY", "auto")

# nginx on this machine is the only proxy whose X-Forwarded-For and X-Forwarded-Proto count
# (a Unix socket peer is trusted as it is): REMOTE_ADDR and wsgi.url_scheme are the client's.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

# A request gets 30 s of application time; one waiting longer than 10 s for a worker is
# answered 503 rather than left to the client's own timeout.
timeout = 30
queue_timeout = 10
keepalive = 75

# Logs: standard error, which systemd's journal or the container runtime takes.
accesslog = "-"
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(queue_ms)s %(app_ms)s'
errorlog = "-"

# The stats listener: /metrics for Prometheus, / for a live page, `maitred top --stats`.
stats = os.environ.get("STATS", "127.0.0.1:9101")

# Recycle a worker that grew past 512 MB; its spare takes over first.
max_worker_memory = 512


def post_fork(server, worker):
    # Each worker opens its own connections (a database pool, an exporter) after the fork.
    worker.log.info("worker %s ready to open its connections", worker.pid)
