"""Turns the runs into bench/results: latest.json (every run's raw numbers), latest.md (medians,
ratios to maitred, targets, commands, versions, per-run tables) and charts/<scenario>.png.

A run of some scenarios replaces those scenarios in latest.json and keeps the others, each with
its own date, commit and environment, so `make bench S=S1` refreshes S1 without losing the rest.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors
import matplotlib.pyplot as plt
import matplotlib.ticker
from front import NginxFront
from measure import KERNEL_COUNTERS
from servers import SERVERS

REFERENCE = "maitred"
# Servers that are a ceiling, not a peer (nginx's fixed body): in the tables, never in "best peer"
# nor in a target that compares maitred with its peers.
CEILINGS = {server.name for server in SERVERS.values() if server.ceiling}
TABLE_PERCENTILES = ("50", "90", "99")
# The database scenarios' figures per load (bench/db_levels.py), as their table shows them.
LEVEL_FIGURES = (
    "rps",
    "p50_ms",
    "p99_ms",
    "non2xx",
    "socket_errors",
    "server_cpu_us",
    "database_cpu_us",
    "server_sleeps",
    "connections",
    "unanswered",
)


def write(out: Path, environment: dict, records: list[dict], scenarios: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "charts").mkdir(exist_ok=True)
    data_path = out / "latest.json"
    kept = json.loads(data_path.read_text())["scenarios"] if data_path.exists() else {}
    for record in records:
        kept[record["id"]] = dict(record, environment=environment)
    # In the registry's order; scenarios no longer in the registry are dropped.
    merged = {name: kept[name] for name in scenarios if name in kept}
    data_path.write_text(json.dumps({"environment": environment, "scenarios": merged}, indent=1) + "\n")

    written = [data_path]
    for record in records:
        written.append(_chart(out / "charts" / f"{record['id']}.png", record, scenarios[record["id"]]))
    markdown_path = out / "latest.md"
    markdown_path.write_text(_markdown(environment, merged, scenarios))
    written.append(markdown_path)
    return written


def summarize(runs: list[dict]) -> dict | None:
    """Medians over one server's successful runs; None when no run succeeded."""
    good = [run for run in runs if run["measurement"] is not None]
    if not good:
        return None
    measurements = [run["measurement"] for run in good]

    def median(values: list) -> float | None:
        present = [value for value in values if value is not None]
        return statistics.median(present) if present else None

    percentiles = sorted({p for m in measurements for p in m["latency_ms"]}, key=float)
    summary = {
        # The server's label in the results, for a target that names a peer (A1: uvicorn's).
        "label": runs[0]["server"],
        "runs": len(good),
        "errors": [run["error"] for run in runs if run["error"]],
        "incomplete": sum(_incomplete(run) for run in good),
        "latency_ms": {p: median([m["latency_ms"].get(p) for m in measurements]) for p in percentiles},
    }
    for key in ("rps", "requests", "failed", "non2xx", "keepalive", "max_ms", "connect_max_ms"):
        summary[key] = median([m[key] for m in measurements])
    # A target that must hold in every run (the database scenarios' 0 non-2xx) reads the worst.
    summary["non2xx_worst"] = max((m["non2xx"] for m in measurements if m["non2xx"] is not None), default=None)
    # The database scenarios: each load's figures, {level: {figure: median over the runs}}.
    levels = [run["levels"] for run in good if run.get("levels")]
    summary["levels"] = {
        key: {figure: median([each[key].get(figure) for each in levels if key in each]) for figure in LEVEL_FIGURES}
        for key in dict.fromkeys(key for each in levels for key in each)
    }
    # The most connections a load of any run left unanswered 80% into it (None where not counted).
    summary["unanswered_worst"] = max(
        (level["unanswered"] for each in levels for level in each.values() if level.get("unanswered") is not None),
        default=None,
    )
    for name in KERNEL_COUNTERS:
        summary[name] = median([run["kernel"][name] for run in good])
    for key in dict.fromkeys(key for run in good for key in run.get("extra", {})):
        summary[key] = median([run["extra"].get(key) for run in good])
    return summary


def _incomplete(run: dict) -> bool:
    """The load did not run to its end: the harness stopped it at the time limit, or the tool
    itself gave up on a stalled server."""
    return run["cut_short"] or bool(run["measurement"] and run["measurement"].get("gave_up"))


def _summaries(record: dict) -> dict[str, dict | None]:
    labels = list(dict.fromkeys(run["server"] for run in record["runs"]))
    return {label: summarize([run for run in record["runs"] if run["server"] == label]) for label in labels}


def _rounds(record: dict) -> list[tuple[dict, list[dict]]]:
    """maitred's figures and its peers' for each round both completed, each from that round's
    runs alone. A round's servers ran minutes apart, the rounds many minutes, so a target counted
    over these says how often the medians' verdict held under the most similar conditions."""
    rounds = []
    for number in sorted({run["run"] for run in record["runs"]}):
        summaries = _summaries({"runs": [run for run in record["runs"] if run["run"] == number]})
        ours, peers = summaries.get(REFERENCE), _peers(summaries)
        if ours is not None and peers:
            rounds.append((ours, peers))
    return rounds


def _is_peer(label: str) -> bool:
    # maitred with other settings of its own (O1's "maitred --queue-timeout 0.5") is not a peer.
    return label != REFERENCE and label not in CEILINGS and not label.startswith(REFERENCE + " ")


def _has_timeline(record: dict) -> bool:
    """Whether the runs counted good answers second by second (O1)."""
    return any(run["measurement"] and "good_per_second" in run["measurement"] for run in record["runs"])


def _peers(summaries: dict[str, dict | None]) -> list[dict]:
    return [s for label, s in summaries.items() if _is_peer(label) and s is not None]


def _answering_peers(summaries: dict[str, dict | None]) -> list[dict] | None:
    """The peers that left no connection unanswered in any load of theirs, where some peer left
    one (the database scenarios count them, bench/db_levels.py); else None. A target met against
    these and not against all was missed only to a server that served some clients by leaving
    others waiting."""
    peers = _peers(summaries)
    if not peers or any(peer.get("unanswered_worst") is None for peer in peers):
        return None
    answering = [peer for peer in peers if peer["unanswered_worst"] == 0]
    return answering if len(answering) < len(peers) else None


def _headline(scenario) -> tuple[str, str, int, bool]:
    """The figure a scenario's summary line and bars compare: (summary key, name, decimals,
    whether lower is better). req/s unless the scenario names another."""
    if scenario.headline is None:
        return "rps", "req/s", 0, False
    return (
        scenario.headline.key,
        scenario.headline.header,
        scenario.headline.digits,
        scenario.headline_lower_is_better,
    )


def _best_peer(summaries: dict[str, dict | None], scenario) -> tuple[str, dict | None]:
    key, _name, _digits, lower = _headline(scenario)
    peers = [
        (label, s) for label, s in summaries.items() if _is_peer(label) and s is not None and s.get(key) is not None
    ]
    if not peers:
        return "-", None
    pick = min if lower else max
    return pick(peers, key=lambda pair: pair[1][key])


# ---------------------------------------------------------------------------------------------
# Markdown


def _markdown(environment: dict, records: dict[str, dict], scenarios: dict) -> str:
    machine = environment["machine"]
    lines = [
        "# maitred benchmark results",
        "",
        (
            f"Written {environment['date']} at commit {environment['commit']} by `bench/run.py` "
            "(see bench/README.md for the method and how to read this)."
        ),
        "",
        "Machine: " + ", ".join(f"{key} {value}" for key, value in machine.items()) + ".",
        "",
        "Versions: " + "; ".join(f"{name}: {version}" for name, version in environment["versions"].items()) + ".",
        "",
    ]
    if environment["peers not installed"]:
        lines += [
            "Peers that could not be installed: "
            + "; ".join(f"{name}: {why}" for name, why in environment["peers not installed"].items())
            + ".",
            "",
        ]
    lines += [
        (
            "Every run starts a fresh server on a free port of 127.0.0.1 and stops its whole process "
            "group afterwards; servers take turns (A B C A B C ...). Tables show medians over the "
            "runs; `x maitred` is a server's req/s divided by maitred's. Latencies are in ms. The "
            "kernel counters are the change during the run, for the whole machine."
        ),
        "",
        "## Summary",
        "",
        "| scenario | figure | maitred | best peer | its figure | maitred / best peer | maitred's targets |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for name, record in records.items():
        scenario = scenarios[name]
        summaries = _summaries(record)
        ours = summaries.get(REFERENCE)
        key, figure, digits, lower = _headline(scenario)
        best_label, best = _best_peer(summaries, scenario)
        targets = scenario.targets
        met = (
            f"{sum(t.holds(ours, _peers(summaries)) for t in targets)} of {len(targets)} met"
            if ours and targets
            else "-"
        )
        rounds = _rounds(record)
        if ours and len(rounds) > 1:
            counts = (str(sum(t.holds(mine, theirs) for t in targets)) for mine, theirs in rounds)
            met += f" (round by round: {', '.join(counts)})"
        answering = _answering_peers(summaries)
        if ours and targets and answering is not None:
            met += (
                f"; {sum(t.holds(ours, answering) for t in targets)} against the peers that answered every connection"
            )
        lines.append(
            f"| [{name}](#{name.lower()}) | {figure}{' (lower is better)' if lower else ''} | "
            f"{_reference_figure(summaries, key, digits)} | {best_label} | "
            f"{_figure(best and best.get(key), digits)} | {_ratio(ours, best, key)} | {met} |"
        )
    lines.append("")
    lines += _body_table(records)
    for name, record in records.items():
        lines += _section(record, scenarios[name], environment)
    return "\n".join(lines) + "\n"


def _body_table(records: dict[str, dict]) -> list[str]:
    """The BODY scenarios (issue 49) as the issue's table has them: maitred's MB/s and server CPU per
    GiB against the peer with the most MB/s, the ratios, and each one's system calls per GiB."""
    rows = []
    for name, record in records.items():
        if not name.startswith("BODY-"):
            continue
        summaries = _summaries(record)
        ours = summaries.get(REFERENCE)
        peers = [(label, s) for label, s in summaries.items() if _is_peer(label) and s and s.get("mb_s") is not None]
        label, best = max(peers, key=lambda pair: pair[1]["mb_s"]) if peers else ("-", None)

        def pair(summary: dict | None) -> str:
            if not summary:
                return "-"
            return f"{_figure(summary.get('mb_s'), 0)}, {_figure(summary.get('cpu_s_per_gib'), 2)}"

        rows.append(
            f"| [{name}](#{name.lower()}) | {pair(ours)} | {label} | {pair(best)} | "
            f"{_ratio(ours, best, 'mb_s')}, {_ratio(ours, best, 'cpu_s_per_gib')} | "
            f"{_figure(ours and ours.get('calls_per_gib'), 0)}, {_figure(best and best.get('calls_per_gib'), 0)} |"
        )
    if not rows:
        return []
    return [
        (
            "Big bodies (BODY-*, issue 49): MB/s and server CPU seconds per GiB (medians), the best peer "
            "by MB/s, maitred / that peer for each, and system calls per GiB (the strace pass)."
        ),
        "",
        "| scenario | maitred MB/s, s/GiB | best peer | its MB/s, s/GiB | ratio MB/s, s/GiB | system calls / GiB, maitred, best peer |",
        "|---|---:|---|---:|---:|---:|",
        *rows,
        "",
    ]


def _reference_figure(summaries: dict[str, dict | None], key: str, digits: int) -> str:
    """maitred's figure for the summary; where maitred ran at several concurrencies instead
    (H1-hop: "maitred c=4"), each one's."""
    if REFERENCE in summaries:
        ours = summaries[REFERENCE]
        return _figure(ours and ours.get(key), digits)
    levels = {
        label.removeprefix(REFERENCE + " "): summary
        for label, summary in summaries.items()
        if label.startswith(REFERENCE + " c=")
    }
    return ", ".join(f"{level}: {_figure(s and s.get(key), digits)}" for level, s in levels.items()) or "-"


def _section(record: dict, scenario, environment: dict) -> list[str]:
    summaries = _summaries(record)
    ours = summaries.get(REFERENCE)
    load = record["load"] or ""
    ab = load.startswith("ab")
    keepalive = "-k" in load.split()
    # M1 has no request rate and no latencies: only the crowd's own figures.
    rate = any(s is not None and s["rps"] is not None for s in summaries.values())
    lines = [
        f"## {scenario.id}",
        "",
        f"**{scenario.title}.** {scenario.workers} workers, app `{scenario.app}` "
        f"(bench/{scenario.app.partition(':')[0]}.py), "
        f"backlog {scenario.backlog if scenario.backlog is not None else 'each server’s default'}. "
        f"Measured {record['started']} at commit {record['commit']}, "
        f"{max((s['runs'] for s in summaries.values() if s), default=0)} run(s) per server, "
        f"each bounded to {record['time_limit_s']:.0f} s"
        + (f"; the whole scenario took {record['wall_s']} s." if record.get("wall_s") else "."),
        "",
    ]
    if record["environment"]["versions"] != environment["versions"]:
        lines += [
            "Versions then: " + "; ".join(f"{k}: {v}" for k, v in record["environment"]["versions"].items()) + ".",
            "",
        ]
    if scenario.note:
        lines += [scenario.note, ""]
    lines += [f"**Warning:** {warning}" for warning in record.get("warnings", [])]
    lines += [""] if record.get("warnings") else []
    if record.get("crowd"):
        lines += [f"Connections held: `{record['crowd']}`", ""]
    if load:
        twice = ""
        if record.get("alone_from"):
            twice = (
                f" (with the connections held; the figure without them is {record['alone_from']}'s run "
                "of the same number on the same server in this invocation: same load, app and workers)"
            )
        elif scenario.alone_first:
            twice = " (on each server twice: alone, then with the connections held)"
        lines += [f"Load: `{load}`{twice}", ""]
    if record.get("capacity"):
        lines += [f"Capacity, measured first in each round: `{record['capacity']}`", ""]
    if record.get("front"):
        lines += [
            # Records written before HAProxy joined nginx as a front name no command: nginx's.
            f"Front proxy, the load's target (`{record.get('front_command') or NginxFront.command}`):",
            "",
            "```",
            record["front"].rstrip(),
            "```",
            "",
        ]
    lines += ["Servers:", ""]
    lines += [f"- {label}: `{command}`" for label, command in record["commands"].items()]
    if record["left_out"]:
        lines.append(f"- left out of this run: {', '.join(record['left_out'])}")
    lines.append("")

    header = ["server"] + (["req/s", "x maitred"] if rate else []) + ["failed", "non-2xx"]
    header += [f"p{p}" for p in TABLE_PERCENTILES] + ["max"] if rate else []
    header += ["connect max"] if ab else []
    header += ["keep-alive"] if keepalive else []
    header += [column.header for column in scenario.columns]
    header += list(KERNEL_COUNTERS)
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, s in summaries.items():
        if s is None:
            errors = [run["error"] for run in record["runs"] if run["server"] == label]
            why = errors[0] if errors[0].startswith("not supported") else f"no run succeeded: {errors[0]}"
            lines.append(f"| {label} | {_cell(why)} |" + " |" * (len(header) - 2))
            continue
        row = [label + (f" ({s['incomplete']} of {s['runs']} runs incomplete)" if s["incomplete"] else "")]
        row += [_number(s["rps"]), _ratio(s, ours)] if rate else []
        row += [_number(s["failed"]), _number(s["non2xx"])]
        row += [_ms(s["latency_ms"].get(p)) for p in TABLE_PERCENTILES] + [_ms(s["max_ms"])] if rate else []
        row += [_ms(s["connect_max_ms"])] if ab else []
        row += [_number(s["keepalive"])] if keepalive else []
        row += [column.format(s.get(column.key)) for column in scenario.columns]
        row += [_number(s[name]) for name in KERNEL_COUNTERS]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if any(run.get("hop") for run in record["runs"]):
        lines += _calls_by_name(record)
    if any(run.get("levels") for run in record["runs"]):
        lines += _levels_table(summaries)

    if scenario.targets:
        lines += ["Targets for maitred (bench/README.md):", ""]
        answering = _answering_peers(summaries)
        rounds = _rounds(record)
        for target in scenario.targets:
            verdict = (
                "no maitred figures"
                if ours is None
                else "met"
                if target.holds(ours, _peers(summaries))
                else "**not met**"
            )
            if ours is not None and answering is not None and verdict != "met" and target.holds(ours, answering):
                verdict += "; met against the peers that answered every connection"
            if ours is not None and len(rounds) > 1:
                verdict += f"; in {sum(target.holds(mine, theirs) for mine, theirs in rounds)} of {len(rounds)} rounds"
            lines.append(f"- {target.text}: {verdict}")
        lines.append("")
    beside = " and good answers per second" if _has_timeline(record) else " and latency percentiles" if rate else ""
    lines += [f"![{scenario.id}: {_headline(scenario)[1]}{beside}](charts/{scenario.id}.png)", ""]

    columns = scenario.columns
    lines += [
        "<details><summary>Per-run numbers</summary>",
        "",
        "| server | run | req/s | requests | failed | non-2xx | p50 | p99 | max | "
        + "".join(f"{column.header} | " for column in columns)
        + " | ".join(KERNEL_COUNTERS)
        + " | note |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|" + "---:|" * (len(columns) + len(KERNEL_COUNTERS)) + "---|",
    ]
    for run in record["runs"]:
        m = run["measurement"]
        notes = [
            run["error"] or "",
            run.get("detail") or "",
            "stopped at the time limit" if run["cut_short"] else "",
            (m or {}).get("gave_up") or "",
        ]
        note = "; ".join(_cell(text) for text in notes if text)
        if m is None:
            lines.append(
                f"| {run['server']} | {run['run']} |" + " |" * (7 + len(columns) + len(KERNEL_COUNTERS)) + f" {note} |"
            )
            continue
        detail = ", ".join(f"{k} {v}" for k, v in m["failed_detail"].items() if v)
        extra = run.get("extra", {})
        lines.append(
            f"| {run['server']} | {run['run']} | {_number(m['rps'])} | {m['requests']} | "
            f"{m['failed']}{f' ({detail})' if detail else ''} | {_number(m['non2xx'])} | "
            f"{_ms(m['latency_ms'].get('50'))} | {_ms(m['latency_ms'].get('99'))} | {_ms(m['max_ms'])} | "
            + "".join(f"{column.format(extra.get(column.key))} | " for column in columns)
            + " | ".join(str(run["kernel"][name]) for name in KERNEL_COUNTERS)
            + f" | {note} |"
        )
    lines += ["", "</details>", ""]
    return lines


# H1-hop's table of system calls by name: a call made less often than this per request at every
# concurrency is counted in "other" (one-offs, and the lobby's timers: a few per second).
CALLS_SHOWN_FROM = 0.01


def _calls_by_name(record: dict) -> list[str]:
    """H1-hop: each side's system calls per request by name, from the strace runs: per
    concurrency, the median over its runs."""
    labels = list(dict.fromkeys(run["server"] for run in record["runs"]))
    traced = [run for run in record["runs"] if run.get("hop") and run["hop"]["traced"]["requests"]]
    lines = [
        (
            "System calls per request by name, each side's strace apart (medians over the runs; "
            f'calls under {CALLS_SHOWN_FROM:g} per request at every concurrency are summed in "other"):'
        ),
        "",
        "| side | call | " + " | ".join(labels) + " |",
        "|---|---|" + "---:|" * len(labels),
    ]

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    for side in ("lobby", "workers"):
        # {label: [{call: calls per request} for each run]}
        per_run = {
            label: [
                {name: count / run["hop"]["traced"]["requests"] for name, count in run["hop"]["calls"][side].items()}
                for run in traced
                if run["server"] == label
            ]
            for label in labels
        }
        medians = {
            label: {name: median([calls.get(name, 0) for calls in runs]) for name in set().union(*runs)}
            for label, runs in per_run.items()
        }
        shown = sorted(
            {name for calls in medians.values() for name, value in calls.items() if value >= CALLS_SHOWN_FROM},
            key=lambda name: -max(calls.get(name, 0) for calls in medians.values()),
        )
        rows = [(name, [medians[label].get(name, 0) for label in labels]) for name in shown]
        rows.append(("other", [sum(v for n, v in medians[label].items() if n not in shown) for label in labels]))
        rows.append(("total", [median([sum(calls.values()) for calls in per_run[label]]) for label in labels]))
        lines += [
            f"| {side} | {name} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in values) + " |"
            for name, values in rows
        ]
    return lines + [""]


def _levels_table(summaries: dict[str, dict | None]) -> list[str]:
    """The database scenarios: each load's figures per test type, concurrency and server (medians
    over the runs), the warm-ups shown for their non-2xx and socket errors."""
    lines = [
        (
            "Each load (medians over the runs; CPU per request: the server's process tree, and the "
            "postmaster and its backends; sleeps: the server's threads going to sleep of their own "
            "accord, each ended by a wake-up, per request; unanswered: of the load's connections, "
            "those the server had sent nothing on 80% into the load, whose waits wrk's latencies "
            "leave out; - where a run did not count them):"
        ),
        "",
        (
            "| load | server | req/s | x maitred | p50 | p99 | non-2xx | socket errors | server CPU µs / request "
            "| database CPU µs / request | server sleeps / request | connections unanswered |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    measured = {label: s["levels"] for label, s in summaries.items() if s is not None}
    ours = measured.get(REFERENCE, {})
    for key in dict.fromkeys(key for levels in measured.values() for key in levels):
        for label, levels in measured.items():
            if key not in levels:
                continue
            level = levels[key]
            reference = ours.get(key)
            lines.append(
                f"| {key} | {label} | {_number(level['rps'])} | {_ratio(level, reference)} | "
                f"{_ms(level['p50_ms'])} | {_ms(level['p99_ms'])} | {_number(level['non2xx'])} | "
                f"{_number(level['socket_errors'])} | {_number(level['server_cpu_us'])} | "
                f"{_number(level['database_cpu_us'])} | {_sleeps(level.get('server_sleeps'))} | "
                f"{_unanswered(level)} |"
            )
    return lines + [""]


def _unanswered(level: dict) -> str:
    if level.get("unanswered") is None or level.get("connections") is None:
        return "-"
    return f"{_number(level['unanswered'])} of {_number(level['connections'])}"


def _sleeps(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.1f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(summary: dict | None, reference: dict | None, key: str = "rps") -> str:
    if not summary or not reference or summary.get(key) is None or not reference.get(key):
        return "-"
    return f"{summary[key] / reference[key]:.2f}"


def _cell(text: str) -> str:
    return text.splitlines()[0].replace("|", "\\|") if text else ""


# ---------------------------------------------------------------------------------------------
# Charts


def _chart(path: Path, record: dict, scenario) -> Path:
    """Left: the median of the scenario's headline figure (req/s unless it names another) per
    server, whiskers from the lowest to the highest run. Right, where the runs counted good answers
    second by second (O1): those, per server; else where there are latencies: median latency per
    percentile on a scale that spreads the tail (50, 90, 99, 99.9 ...), max at the end."""
    key, name, digits, lower = _headline(scenario)
    summaries = {label: s for label, s in _summaries(record).items() if s is not None}
    with_timeline = _has_timeline(record)
    with_latencies = any(s["latency_ms"] for s in summaries.values())
    two_panels = with_timeline or with_latencies
    figure, panels = plt.subplots(1, 2 if two_panels else 1, figsize=(12 if two_panels else 7, 4.5), squeeze=False)
    bars = panels[0][0]
    figure.suptitle(
        f"{scenario.id}: {scenario.title}\n"
        # A load run at several concurrencies (H1-hop) is one command per line.
        + " + ".join(part for part in (record.get("crowd"), record["load"]) if part).replace("; ", "\n"),
        fontsize=10,
    )

    def per_run(run: dict) -> float | None:
        return run["measurement"]["rps"] if key == "rps" else run.get("extra", {}).get(key)

    labels = [label for label, s in summaries.items() if s.get(key) is not None]
    medians = [summaries[label][key] for label in labels]
    spans = [
        [
            value
            for run in record["runs"]
            if run["server"] == label and run["measurement"] and (value := per_run(run)) is not None
        ]
        for label in labels
    ]
    below = [median - min(span) for median, span in zip(medians, spans)]
    above = [max(span) - median for median, span in zip(medians, spans)]
    colors = ["tab:red" if label == REFERENCE else "tab:gray" for label in labels]
    bars.bar(range(len(labels)), medians, yerr=[below, above], color=colors, capsize=4)
    bars.set_xticks(range(len(labels)), [_bar_label(label) for label in labels], fontsize=8 if len(labels) <= 5 else 7)
    bars.set_ylabel(
        ("requests per second" if key == "rps" else name) + " (median of runs)" + (", lower is better" if lower else "")
    )
    for x, (label, value, span) in enumerate(zip(labels, medians, spans)):
        cut = "\n(incomplete runs)" if summaries[label]["incomplete"] else ""
        bars.annotate(
            f"{value:,.{digits}f}{cut}",
            (x, max(span)),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    if with_timeline:
        _goodput_over_time(panels[0][1], record, summaries, getattr(scenario.load, "own_capacity", False))
    if with_timeline or not with_latencies:
        return _save(figure, path)
    curves = panels[0][1]

    def nines(percentile: float) -> float:
        return -math.log10(1 - percentile / 100)

    curve_points = {}
    for label, summary in summaries.items():
        points = sorted((float(p), ms) for p, ms in summary["latency_ms"].items() if ms is not None)
        curve_points[label] = [(nines(p), ms) for p, ms in points if p >= 50]
    last = max((points[-1][0] for points in curve_points.values() if points), default=0.0)
    styles = _line_styles(curve_points)
    for label, points in curve_points.items():
        if not points:
            continue
        (line,) = curves.plot(
            [x for x, _ in points], [ms for _, ms in points], marker=".", label=label, **styles[label]
        )
        if summaries[label]["max_ms"] is not None:
            curves.plot(
                [points[-1][0], last + 0.5],
                [points[-1][1], summaries[label]["max_ms"]],
                linestyle=":",
                marker="x",
                markevery=[1],
                color=line.get_color(),
            )
    ticks = [p for p in (50, 90, 99, 99.9, 99.99) if nines(p) <= last]
    curves.set_xticks([nines(p) for p in ticks] + [last + 0.5], [f"{p:g}" for p in ticks] + ["max"])
    curves.set_yscale("log")
    curves.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    curves.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    curves.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    curves.set_xlabel("percentile")
    curves.set_ylabel("latency, ms (median of runs)")
    curves.grid(True, which="both", alpha=0.3)
    curves.legend(fontsize=8)
    return _save(figure, path)


def _bar_label(label: str) -> str:
    """A server's label on lines short enough to stand under its bar: its threads, and each option
    (the option's value below its name where the label would be long)."""
    lines = label.replace(" (", "\n(").replace(" --", "\n--").splitlines()
    if len(label) > 24:
        lines = [line.replace(" ", "\n", 1) if line.startswith("--") else line for line in lines]
    return "\n".join(lines)


def _goodput_over_time(axes, record: dict, summaries: dict[str, dict], own_capacity: bool) -> None:
    """Good answers in each second of the load, the median over each server's runs, and the
    arrivals asked (the median over the rounds). Where each server got 1.5 x its own capacity
    (O1-ASGI), the rates asked differ: each second's good answers are then shown as a share of
    the server's capacity in that round, beside the arrivals asked in the same terms."""

    def series(run: dict) -> list[float]:
        counts = run["measurement"]["good_per_second"]
        if not own_capacity:
            return counts
        capacity = run["extra"]["capacity_rps"]
        return [100 * count / capacity for count in counts]

    styles = _line_styles(summaries)
    for label in summaries:
        runs = [
            series(run)
            for run in record["runs"]
            if run["server"] == label and run["measurement"] and (not own_capacity or run["extra"].get("capacity_rps"))
        ]
        per_second = [statistics.median(values) for values in zip(*runs)]
        axes.plot(range(len(per_second)), per_second, marker=".", label=label, **styles[label])
    axes.set_xlabel("second of the load (good answers by the second they arrived in)")
    if own_capacity:
        times = [
            100 * run["extra"]["rate_asked"] / run["extra"]["capacity_rps"]
            for run in record["runs"]
            if run["measurement"] and run["extra"].get("capacity_rps")
        ]
        axes.axhline(statistics.median(times), color="black", linestyle="--", linewidth=1, label="arrivals asked")
        axes.axhline(90, color="black", linestyle=":", linewidth=1, label="90% (maitred's target)")
        axes.set_ylabel("good answers per second, % of the server's capacity")
    else:
        rates = [run["extra"]["rate_asked"] for run in record["runs"] if run["measurement"]]
        axes.axhline(statistics.median(rates), color="black", linestyle="--", linewidth=1, label="arrivals asked")
        axes.set_ylabel("good answers per second (200 within the deadline)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)


def _line_styles(labels) -> dict[str, dict]:
    """Each server's line: maitred's thick and red, maitred with other settings of its own (O1's
    "maitred --queue-timeout 0.5") red and dashed, each peer a color of its own other than red."""
    red = matplotlib.colors.to_hex("tab:red")
    peer_colors = iter(
        color
        for color in itertools.cycle(map(matplotlib.colors.to_hex, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
        if color != red
    )
    styles = {}
    for label in labels:
        if label == REFERENCE:
            styles[label] = {"color": red, "linewidth": 2.5}
        elif label.startswith(REFERENCE + " "):
            styles[label] = {"color": red, "linestyle": "--"}
        else:
            styles[label] = {"color": next(peer_colors)}
    return styles


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
