// The live page of maitred's stats listener (docs/METRICS.md, "The live page"). It polls
// status.json every second, charts the last five minutes, and shows the workers' scoreboard and
// the current diagnoses. Rates and quantiles come from the difference between two polls of the
// lobby's cumulative counters and histograms, so that each point tells of the second before it.
// Everything comes from the lobby that served this page: nothing is fetched from elsewhere.
"use strict";

const POLL_INTERVAL_MS = 1000;
const KEPT_MS = 5 * 60 * 1000;
// A lobby too busy to answer within this is shown as not answering, and the next poll is not
// held up behind the last one.
const POLL_TIMEOUT_MS = 2000;
const QUANTILES = [0.5, 0.99];
const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#bf8700", "#8250df", "#57606a", "#0a7e8c", "#e16f24"];

// What the page holds, on `window` for whoever looks in the browser's console, and for
// tests/test_status_page.py: each chart's series by line label, as {x: time in ms, y} points
// (the same arrays the charts draw), the last answer of status.json, and how many polls were
// answered and how many failed.
const status = { answers: 0, failures: 0, last: null, series: {} };
window.maitredStatus = status;

// Each chart's lines, read from one answer of status.json (`now`), the one before it (`before`,
// null when there is none to compare with) and the seconds between them. A null value leaves a
// gap in its line. `group` gives lines that belong together one color; `dashed` marks a limit.
// `unit`: "seconds" for durations, "count" for whole numbers, none for rates.
const CHARTS = [
  {
    canvas: "chart-requests",
    lines: (now, before, seconds) => [
      { label: "all", value: perSecond(now, before, seconds, (s) => sum(Object.values(s.requests))) },
      { label: "4xx", value: perSecond(now, before, seconds, (s) => s.requests["4xx"]) },
      { label: "5xx", value: perSecond(now, before, seconds, (s) => s.requests["5xx"]) },
      { label: "refused by the lobby", value: perSecond(now, before, seconds, (s) => sum(Object.values(s.refusals))) },
      { label: "shed (not served)", value: perSecond(now, before, seconds, (s) => sum(Object.values(s.overload.shed))) },
    ],
  },
  {
    canvas: "chart-queue",
    unit: "count",
    lines: (now) => [{ label: "waiting", value: now.queue.waiting }],
  },
  {
    canvas: "chart-queue-wait",
    unit: "seconds",
    lines: (now, before) => quantileLines(now.queue_wait_seconds, before && before.queue_wait_seconds),
  },
  {
    canvas: "chart-duration",
    unit: "seconds",
    lines: (now, before) => quantileLines(now.request_duration_seconds, before && before.request_duration_seconds),
  },
  {
    canvas: "chart-workers",
    unit: "count",
    lines: (now) => [
      ...inOrder(now.workers, WORKER_STATES).map(([state, count]) => ({ label: state, value: count })),
      { label: "wanted (-w)", value: now.server.workers_target, dashed: true },
    ],
  },
  {
    canvas: "chart-connections",
    unit: "count",
    lines: (now) => inOrder(now.connections, CONNECTION_STATES).map(([state, count]) => ({ label: state, value: count })),
  },
  {
    canvas: "chart-listen",
    unit: "count",
    lines: (now) =>
      now.listeners.flatMap((listener) => [
        { label: `${listener.name} queue`, group: listener.name, value: listener.queue },
        { label: `${listener.name} backlog`, group: listener.name, value: listener.backlog, dashed: true },
      ]),
  },
  {
    canvas: "chart-overflows",
    lines: (now, before, seconds) =>
      Object.keys(now.listen_overflows).map((counter) => ({
        label: counter,
        value: perSecond(now, before, seconds, (s) => s.listen_overflows[counter]),
      })),
  },
];

// The order the charts list the states in (status.json's objects come with their keys sorted):
// workers' the most telling first, connections' as a connection goes through them.
const WORKER_STATES = ["busy", "idle", "starting", "held", "retiring"];
const CONNECTION_STATES = ["reading", "queued", "in_service", "writing", "websocket", "idle", "hibernating"];

// An object's entries, those named in `order` first and in that order, then any others.
function inOrder(object, order) {
  const rank = (key) => (order.includes(key) ? order.indexOf(key) : order.length);
  return Object.entries(object).sort(([a], [b]) => rank(a) - rank(b));
}

function sum(numbers) {
  return numbers.reduce((total, number) => total + number, 0);
}

// The rate of a cumulative counter between two answers; null when there is nothing to compare,
// or when the counter went back (a lobby that started again).
function perSecond(now, before, seconds, read) {
  if (!before) {
    return null;
  }
  const moved = read(now) - read(before);
  return moved >= 0 ? moved / seconds : null;
}

// p50 and p99 of what a cumulative histogram observed between two answers.
function quantileLines(now, before) {
  const comparable = before && before.bounds.length === now.bounds.length;
  const recent = comparable ? now.counts.map((count, index) => count - before.counts[index]) : null;
  return QUANTILES.map((q) => ({
    label: `p${Math.round(q * 100)}`,
    value: recent ? quantile(q, now.bounds, recent) : null,
  }));
}

// The q-quantile of a histogram whose counts are cumulative (counts[i]: observations at most
// bounds[i]; the last, one past the bounds, is every observation), interpolated linearly inside
// its bucket, as Prometheus's histogram_quantile does. Null when nothing was observed; the
// highest bound when the quantile lies beyond it, which is all the histogram can tell.
function quantile(q, bounds, counts) {
  const observed = counts[counts.length - 1];
  if (!(observed > 0)) {
    return null;
  }
  const rank = q * observed;
  const bucket = counts.findIndex((count) => count >= rank);
  if (bucket >= bounds.length) {
    return bounds[bounds.length - 1];
  }
  const lower = bucket === 0 ? 0 : bounds[bucket - 1];
  const below = bucket === 0 ? 0 : counts[bucket - 1];
  const inside = counts[bucket] - below;
  return inside > 0 ? lower + ((bounds[bucket] - lower) * (rank - below)) / inside : lower;
}

function clock(milliseconds) {
  return new Date(milliseconds).toLocaleTimeString([], { hour12: false });
}

function minuteTicks(scale) {
  const first = Math.ceil(scale.min / 60000) * 60000;
  scale.ticks = [];
  for (let value = first; value <= scale.max; value += 60000) {
    scale.ticks.push({ value });
  }
}

function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined) {
    return "";
  }
  if (seconds < 1) {
    return `${Number((seconds * 1000).toPrecision(3))} ms`;
  }
  if (seconds < 120) {
    return `${Number(seconds.toPrecision(3))} s`;
  }
  const minutes = Math.floor(seconds / 60);
  return minutes < 120 ? `${minutes} min` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function formatBytes(bytes) {
  return bytes === null || bytes === undefined ? "" : `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

function makeChart(spec) {
  const canvas = document.getElementById(spec.canvas);
  const valueFormat = spec.unit === "seconds" ? formatSeconds : (value) => Number(value.toPrecision(4));
  const chart = new Chart(canvas, {
    type: "line",
    data: { datasets: [] },
    options: {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      // The points are {x, y} numbers already, in order: Chart.js need not parse them.
      parsing: false,
      normalized: true,
      spanGaps: false,
      elements: { point: { radius: 0, hitRadius: 4 }, line: { borderWidth: 1.5, tension: 0 } },
      interaction: { mode: "nearest", axis: "x", intersect: false },
      scales: {
        // A tick on each minute of the clock; Chart.js's nice numbers are of milliseconds.
        x: { type: "linear", afterBuildTicks: minuteTicks, ticks: { callback: clock, maxRotation: 0 } },
        y: { beginAtZero: true, ticks: { callback: valueFormat, precision: spec.unit === "count" ? 0 : undefined } },
      },
      plugins: {
        legend: { labels: { boxWidth: 12 } },
        tooltip: {
          callbacks: {
            title: (items) => clock(items[0].parsed.x),
            label: (item) => `${item.dataset.label}: ${valueFormat(item.parsed.y)}`,
          },
        },
      },
    },
  });
  status.series[spec.canvas] = {};
  return { spec, chart, groups: [] };
}

// Adds one point to each of a chart's lines, a line being made the first time it is seen, and
// drops what is older than five minutes.
function addPoints(drawn, lines, time) {
  const series = status.series[drawn.spec.canvas];
  const reported = new Set();
  for (const line of lines) {
    reported.add(line.label);
    if (!series[line.label]) {
      series[line.label] = [];
      const group = line.group || line.label;
      if (!drawn.groups.includes(group)) {
        drawn.groups.push(group);
      }
      const color = COLORS[drawn.groups.indexOf(group) % COLORS.length];
      drawn.chart.data.datasets.push({
        label: line.label,
        data: series[line.label],
        borderColor: color,
        backgroundColor: color,
        borderDash: line.dashed ? [6, 4] : [],
      });
    }
    series[line.label].push({ x: time, y: line.value === undefined ? null : line.value });
  }
  for (const [label, points] of Object.entries(series)) {
    if (!reported.has(label)) {
      points.push({ x: time, y: null });
    }
    while (points.length && points[0].x < time - KEPT_MS) {
      points.shift();
    }
  }
}

function redraw(drawn, time) {
  drawn.chart.options.scales.x.min = time - KEPT_MS;
  drawn.chart.options.scales.x.max = time;
  drawn.chart.update("none");
}

// Two answers can be compared when the same lobby gave them, in order: a lobby that started
// again (a new pid, or the same pid after an exec) counts from zero.
function comparable(now, before) {
  return (
    before !== null && now.server.pid === before.server.pid && now.server.uptime_seconds > before.server.uptime_seconds
  );
}

function showServer(now) {
  const server = now.server;
  document.getElementById("server").textContent =
    `${server.version}, pid ${server.pid}, generation ${server.generation}, up ${formatSeconds(server.uptime_seconds)}, ` +
    `${server.workers_target} workers wanted, at most ${server.max_connections} connections`;
}

function showDiagnoses(diagnoses) {
  const items = diagnoses.map((diagnosis) => {
    const item = document.createElement("li");
    const name = document.createElement("strong");
    name.textContent = diagnosis.name;
    const fix = document.createElement("div");
    fix.className = "fix";
    fix.textContent = `Fix: ${diagnosis.fix}`;
    item.append(
      name,
      ` (${diagnosis.scenario}, for ${formatSeconds(diagnosis.since_seconds)}): ${diagnosis.message}`,
      fix,
    );
    return item;
  });
  if (!items.length) {
    const none = document.createElement("li");
    none.className = "none";
    none.textContent = "None: nothing looks wrong now.";
    items.push(none);
  }
  document.getElementById("diagnoses").replaceChildren(...items);
}

function scoreboardRow(className, cells) {
  // Cells are set as text, never as HTML: a request's path is whatever a client sent.
  const row = document.createElement("tr");
  row.className = className;
  for (const [text, cellClass] of cells) {
    const cell = document.createElement("td");
    cell.className = cellClass;
    cell.textContent = text;
    row.append(cell);
  }
  return row;
}

function requestCells(request) {
  return [
    [request ? `${request.method} ${request.path}` : "", "request"],
    [request ? formatSeconds(request.elapsed_seconds) : "", "number"],
  ];
}

function showScoreboard(scoreboard) {
  const rows = scoreboard.flatMap((worker) => {
    const rows = [
      scoreboardRow(worker.state, [
        [worker.pid, "number pid"],
        [worker.generation, "number"],
        [worker.state, "state"],
        ...requestCells(worker.request),
        [worker.served, "number"],
        // An ASGI worker's requests admitted whose answers have not started, its open streams,
        // and its event loop's lag (docs/ASGI.md, "Streams and admission"); blank for WSGI.
        [worker.asgi ? worker.admitted : "", "number"],
        [worker.asgi ? worker.streams : "", "number"],
        [worker.asgi && worker.loop_lag_seconds != null ? formatSeconds(worker.loop_lag_seconds) : "", "number"],
        [formatBytes(worker.rss_bytes), "number"],
        [formatSeconds(worker.age_seconds), "number"],
      ]),
    ];
    const threads = worker.threads || [];
    if (threads.length > 1) {
      // A row per thread (--threads): each is a seat of its own.
      threads.forEach((request, number) => {
        rows.push(
          scoreboardRow(`thread ${request ? "busy" : "idle"}`, [
            ["", "number pid"],
            ["", "number"],
            [`thread ${number}`, "state"],
            ...requestCells(request),
            ["", "number"],
            ["", "number"],
            ["", "number"],
            ["", "number"],
            ["", "number"],
            ["", "number"],
          ]),
        );
      });
    }
    return rows;
  });
  document.getElementById("scoreboard").replaceChildren(...rows);
}

function showPoll(text, failing) {
  const line = document.getElementById("poll");
  line.textContent = text;
  line.classList.toggle("failing", failing);
}

async function fetchStatus() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), POLL_TIMEOUT_MS);
  try {
    const answer = await fetch("status.json", { cache: "no-store", signal: abort.signal });
    if (!answer.ok) {
      throw new Error(`status.json answered ${answer.status}`);
    }
    return await answer.json();
  } finally {
    clearTimeout(timer);
  }
}

async function poll(charts) {
  const time = Date.now();
  let now;
  try {
    now = await fetchStatus();
  } catch (error) {
    status.failures += 1;
    for (const drawn of charts) {
      addPoints(drawn, [], time);
      redraw(drawn, time);
    }
    showPoll(`no answer from status.json at ${clock(time)}: ${error.message || error}`, true);
    return;
  }
  const before = status.last && comparable(now, status.last) ? status.last : null;
  const seconds = before ? now.server.uptime_seconds - before.server.uptime_seconds : 0;
  for (const drawn of charts) {
    addPoints(drawn, drawn.spec.lines(now, before, seconds), time);
    redraw(drawn, time);
  }
  showServer(now);
  showDiagnoses(now.diagnoses);
  showScoreboard(now.scoreboard);
  showPoll(`updated ${clock(time)}`, false);
  status.last = now;
  status.answers += 1;
}

function start() {
  const charts = CHARTS.map(makeChart);
  const loop = async () => {
    const started = performance.now();
    await poll(charts);
    setTimeout(loop, Math.max(0, started + POLL_INTERVAL_MS - performance.now()));
  };
  loop();
}

start();
