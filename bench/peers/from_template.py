"""Writes a server's configuration file from a template in this directory, then becomes the server.

    python3 from_template.py TEMPLATE OUTPUT NAME=VALUE... -- SERVER-ARGV...

TEMPLATE (a file name in bench/peers/) has $NAME placeholders, filled from the NAME=VALUE
arguments plus $workdir, the absolute current directory; the result is written to OUTPUT in the
current directory (the run's work directory), and the process then execs SERVER-ARGV. Exec keeps
the process id, so the server stays the leader of the process group the harness started and
stops. Servers configured only by a file (nginx, Apache httpd) get per-run settings this way
without the harness writing files anywhere but in a run's own directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from string import Template

PEERS = Path(__file__).resolve().parent
USAGE = "usage: from_template.py TEMPLATE OUTPUT NAME=VALUE... -- SERVER-ARGV..."


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 2 or argv.index("--") == len(argv) - 1:
        print(USAGE, file=sys.stderr)
        return 2
    split = argv.index("--")
    template_name, output, *assignments = argv[:split]
    server_argv = argv[split + 1 :]
    values = {"workdir": os.getcwd()}
    for assignment in assignments:
        name, equals, value = assignment.partition("=")
        if not equals or not name.isidentifier():
            print(f"from_template: {assignment!r} is not NAME=VALUE", file=sys.stderr)
            return 2
        values[name] = value
    template = Template((PEERS / template_name).read_text())
    try:
        text = template.substitute(values)
    except KeyError as missing:
        print(f"from_template: {template_name} needs a value for {missing}", file=sys.stderr)
        return 2
    except ValueError as error:  # a stray $ in the template
        print(f"from_template: {template_name}: {error}", file=sys.stderr)
        return 2
    Path(output).write_text(text)
    os.execv(server_argv[0], server_argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
