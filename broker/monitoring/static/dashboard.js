// The mc0 dashboard: polls /api/overview (and /api/topics/NAME on a topic's page) once a second, keeps the
// last two minutes in memory, turns counters into rates and draws them as small SVG charts. Plain JS, no
// libraries, nothing loaded from elsewhere.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120; // samples kept: two minutes at one per second
const CHART_TOPICS = 6; // lines on the per-topic chart: the busiest right now
const BAR_ROWS = 8;
const PALETTE = ["#2f6fdf", "#e0702b", "#1f9d55", "#c2449b", "#8a63d2", "#c9a100", "#16a2b8", "#d64545"];
const SVG = "http://www.w3.org/2000/svg";

const state = { history: [], topicHistory: [], paused: false, route: "", timer: null, fsyncHistory: [] };

// -------------------------------------------------------------------------------------------- formatting

const $ = (id) => document.getElementById(id);

// An element; ``style`` is an object of CSS properties, set through the CSSOM (the page's content security
// policy refuses inline style attributes).
function el(tag, attributes = {}, text, style = {}) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  for (const [key, value] of Object.entries(style)) node.style.setProperty(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function number(value, digits = 0) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  if (abs >= 1e9) return (value / 1e9).toFixed(1) + "G";
  if (abs >= 1e6) return (value / 1e6).toFixed(1) + "M";
  if (abs >= 1e4) return (value / 1e3).toFixed(1) + "k";
  return value.toFixed(abs < 10 && digits ? digits : 0);
}

function rate(value) {
  return number(value, 1);
}

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let index = 0;
  while (value >= 1024 && index < units.length - 1) { value /= 1024; index++; }
  return (index ? value.toFixed(1) : value.toFixed(0)) + " " + units[index];
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value === 0) return "0";
  if (value === Infinity) return "> 2.5 s";
  if (value < 0.001) return (value * 1e6).toFixed(0) + " µs";
  if (value < 1) return (value * 1000).toFixed(value < 0.01 ? 2 : 1) + " ms";
  return value.toFixed(2) + " s";
}

function duration(total) {
  const d = Math.floor(total / 86400), h = Math.floor(total / 3600) % 24, m = Math.floor(total / 60) % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  return `${m}m ${Math.floor(total % 60)}s`;
}

function color(index) {
  return PALETTE[index % PALETTE.length];
}

function topicHref(name) {
  return "#/topic/" + encodeURIComponent(name);
}

// Per-second rate of a counter between the last two samples (null until there are two).
function lastRate(history, pick) {
  if (history.length < 2) return null;
  const a = history[history.length - 2], b = history[history.length - 1];
  const before = pick(a), after = pick(b);
  if (before === undefined || after === undefined) return null;
  const dt = b.time - a.time;
  return dt > 0 ? Math.max(0, (after - before) / dt) : null;
}

// The rate series of a counter over the whole history: [[time, per second], ...].
function rateSeries(history, pick) {
  const points = [];
  for (let i = 1; i < history.length; i++) {
    const before = pick(history[i - 1]), after = pick(history[i]);
    const dt = history[i].time - history[i - 1].time;
    if (before === undefined || after === undefined || dt <= 0) continue;
    points.push([history[i].time, Math.max(0, (after - before) / dt)]);
  }
  return points;
}

// ------------------------------------------------------------------------------------------------ charts

// The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least ``value``.
function niceStep(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

// A line chart in an <svg>: series are {name, color, dashed, points: [[t, v], ...]}; the x axis is the last
// HISTORY seconds, the y axis starts at 0.
function lineChart(svg, series, format = number) {
  const width = svg.clientWidth || 600, height = svg.clientHeight || 190;
  const left = 58, right = 8, top = 8, bottom = 18;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const now = Date.now() / 1000;
  const start = now - HISTORY;
  const highest = Math.max(0, ...series.flatMap((line) => line.points.map((point) => point[1])));
  const step = niceStep(highest / 4);
  const lines = Math.max(1, Math.ceil(highest / step));
  const max = step * lines;
  const x = (t) => left + ((t - start) / HISTORY) * (width - left - right);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  for (let i = 0; i <= lines; i++) {
    const value = step * i;
    const line = document.createElementNS(SVG, "line");
    line.setAttribute("class", "grid-line");
    line.setAttribute("x1", left); line.setAttribute("x2", width - right);
    line.setAttribute("y1", y(value)); line.setAttribute("y2", y(value));
    svg.appendChild(line);
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", left - 6); label.setAttribute("y", y(value) + 3); label.setAttribute("text-anchor", "end");
    label.textContent = format(value);
    svg.appendChild(label);
  }
  for (const [offset, text] of [[HISTORY, "-2m"], [60, "-1m"], [0, "now"]]) {
    const label = document.createElementNS(SVG, "text");
    label.setAttribute("x", x(now - offset)); label.setAttribute("y", height - 4);
    label.setAttribute("text-anchor", offset === HISTORY ? "start" : offset === 0 ? "end" : "middle");
    label.textContent = text;
    svg.appendChild(label);
  }
  for (const line of series) {
    const visible = line.points.filter((point) => point[0] >= start);
    if (!visible.length) continue;
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", "series" + (line.dashed ? " dashed" : ""));
    path.setAttribute("stroke", line.color);
    path.setAttribute("points", visible.map((point) => `${x(point[0]).toFixed(1)},${y(point[1]).toFixed(1)}`).join(" "));
    path.dataset.name = line.name;
    svg.appendChild(path);
  }
}

function legend(container, items) {
  container.replaceChildren(...items.map((item) => {
    return el("span", {}, item.label, { "--swatch": item.color });
  }));
}

// Horizontal bars: rows are {name, value, href}; the longest bar is the largest value.
function bars(container, rows, format, emptyText, warn = false) {
  if (!rows.length) {
    container.replaceChildren(el("p", { class: "muted empty" }, emptyText));
    return;
  }
  const max = Math.max(...rows.map((row) => row.value), 1);
  container.replaceChildren(...rows.map((row) => {
    const line = el("div", { class: "row" });
    const name = row.href ? el("a", { class: "name", href: row.href, title: row.name }, row.name)
      : el("span", { class: "name", title: row.name }, row.name);
    const track = el("div", { class: "track" });
    track.appendChild(el("div", { class: "fill" + (warn && row.value ? " warn" : "") }, undefined,
      { width: `${((row.value / max) * 100).toFixed(1)}%` }));
    line.append(name, track, el("span", { class: "num" }, format(row.value)));
    return line;
  }));
}

// --------------------------------------------------------------------------------------------- overview

function remember(overview) {
  const sample = { time: overview.broker.time, totals: overview.totals, doors: {}, topics: {} };
  for (const [name, door] of Object.entries(overview.doors)) {
    sample.doors[name] = { in: door.messages_in, out: door.messages_out };
  }
  for (const topic of overview.topics) sample.topics[topic.name] = { in: topic.messages_in, out: topic.messages_out };
  state.history.push(sample);
  if (state.history.length > HISTORY + 1) state.history.shift();
  const fsync = overview.histograms.fsync_seconds;
  if (fsync) {
    state.fsyncHistory.push({ time: overview.broker.time, counts: fsync.counts, bounds: fsync.bounds });
    if (state.fsyncHistory.length > HISTORY + 1) state.fsyncHistory.shift();
  }
}

function renderHeader(overview) {
  const broker = overview.broker;
  $("endpoint").textContent = `${broker.endpoint} · v${broker.version}`;
  $("uptime").textContent = "up " + duration(broker.uptime_seconds);
  const health = $("health");
  health.textContent = broker.failure ? "failing" : "healthy";
  health.className = "pill " + (broker.failure ? "bad" : "ok");
  health.title = broker.failure || "the broker's loop answers and its store works";
  renderCluster(overview.cluster);
  $("footer").textContent = `snapshot took ${overview.snapshot.loop_ms} ms of the broker's loop in ` +
    `${overview.snapshot.slices} slice(s) · updated ${new Date(broker.time * 1000).toLocaleTimeString()}`;
}

// A cluster member's role; on the leader, the title lists how far behind each other member is.
function renderCluster(cluster) {
  const pill = $("cluster");
  pill.hidden = !cluster;
  if (!cluster) return;
  const where = cluster.role === "follower" ? ` of ${cluster.leader}` : "";
  pill.textContent = `${cluster.role}${where} · epoch ${cluster.epoch} · ` +
    `${cluster.reachable}/${cluster.size} connected`;
  const whole = cluster.role !== "no leader" && cluster.reachable === cluster.size;
  pill.className = "pill " + (whole ? "ok" : "bad");
  const replicas = Object.entries(cluster.replicas).map(([node, replica]) =>
    `${node}: ${number(replica.lag)} behind, last fetch ` +
    (replica.heard_seconds_ago === null ? "never" : seconds(replica.heard_seconds_ago) + " ago"));
  pill.title = [cluster.unready || `this broker is ${cluster.node}`, ...replicas].join("\n");
}

function renderCards(overview) {
  const history = state.history;
  const fsync = overview.histograms.fsync_seconds;
  const cards = [
    ["Published", rate(lastRate(history, (s) => s.totals.messages_in)) + "/s", "published-rate"],
    ["Delivered", rate(lastRate(history, (s) => s.totals.messages_out)) + "/s", "delivered-rate"],
    ["Dropped", rate(lastRate(history, (s) => s.totals.dropped)) + "/s", "dropped-rate"],
    ["Connections", number(overview.totals.connections), "connections-total"],
    ["Topics", number(overview.totals.topics), "topics-total"],
    ["On disk", bytes(overview.totals.bytes), "disk-total"],
    ["fsync p99", fsync ? seconds(fsync.p99) : "–", "fsync-p99"],
  ];
  $("cards").replaceChildren(...cards.map(([label, value, key]) => {
    const card = el("div", { class: "card", "data-card": key });
    card.append(el("div", { class: "label" }, label), el("div", { class: "value" }, value));
    return card;
  }));
}

function renderCharts(overview) {
  const history = state.history;
  // The busiest topics by their rate in the last sample, then by traffic.
  const names = overview.topics.map((topic) => topic.name);
  const ranked = names.map((name) => [name, lastRate(history, (s) => s.topics[name] && s.topics[name].in) || 0])
    .sort((a, b) => b[1] - a[1]).slice(0, CHART_TOPICS).map((pair) => pair[0]);
  const topicSeries = ranked.map((name, index) => ({
    name, color: color(index), points: rateSeries(history, (s) => s.topics[name] && s.topics[name].in),
  }));
  lineChart($("chart-topics"), topicSeries);
  legend($("legend-topics"), topicSeries.map((line) => ({ label: line.name, color: line.color })));

  const doors = Object.keys(overview.doors).sort();
  const doorSeries = [];
  doors.forEach((name, index) => {
    doorSeries.push({ name: name + " in", color: color(index), points: rateSeries(history, (s) => s.doors[name] && s.doors[name].in) });
    doorSeries.push({ name: name + " out", color: color(index), dashed: true,
      points: rateSeries(history, (s) => s.doors[name] && s.doors[name].out) });
  });
  lineChart($("chart-doors"), doorSeries);
  legend($("legend-doors"), doors.map((name, index) => ({ label: name, color: color(index) })));
}

function renderBars(overview) {
  bars($("connections"), Object.entries(overview.doors).sort().map(([name, door]) => ({ name, value: door.connections })),
    number, "No doors.");
  const lagging = overview.topics.filter((topic) => topic.lag > 0).sort((a, b) => b.lag - a.lag).slice(0, BAR_ROWS);
  bars($("lag"), lagging.map((topic) => ({ name: topic.name, value: topic.lag, href: topicHref(topic.name) })),
    number, "No subscriber is behind.", true);
  const stored = overview.topics.filter((topic) => topic.bytes).sort((a, b) => b.bytes - a.bytes).slice(0, BAR_ROWS);
  bars($("disk"), stored.map((topic) => ({ name: topic.name, value: topic.bytes, href: topicHref(topic.name) })),
    bytes, "No persistent topic has data yet.");
}

// p50 and p99 of the fsyncs between two samples, from the histogram's bucket counts.
function quantileBetween(before, after, q) {
  const counts = after.counts.map((count, index) => count - before.counts[index]);
  const total = counts.reduce((sum, count) => sum + count, 0);
  if (!total) return undefined;
  let running = 0;
  for (let i = 0; i < counts.length; i++) {
    running += counts[i];
    if (running >= q * total) return i < after.bounds.length ? after.bounds[i] : after.bounds[after.bounds.length - 1] * 2;
  }
  return undefined;
}

function renderFsync(overview) {
  const samples = state.fsyncHistory;
  const p50 = [], p99 = [];
  for (let i = 1; i < samples.length; i++) {
    const a = quantileBetween(samples[i - 1], samples[i], 0.5), b = quantileBetween(samples[i - 1], samples[i], 0.99);
    if (a !== undefined) p50.push([samples[i].time, a]);
    if (b !== undefined) p99.push([samples[i].time, b]);
  }
  lineChart($("chart-fsync"), [
    { name: "p50", color: color(0), points: p50 },
    { name: "p99", color: color(1), points: p99 },
  ], seconds);
  const fsync = overview.histograms.fsync_seconds;
  const container = $("fsync-buckets");
  if (!fsync || !fsync.count) {
    container.replaceChildren(el("p", { class: "muted empty" }, "No fsync yet (strong topics fsync at every commit)."));
    return;
  }
  const max = Math.max(...fsync.counts, 1);
  const label = (index) => (index < fsync.bounds.length ? seconds(fsync.bounds[index]) : "∞");
  const columns = el("div", { class: "buckets" });
  const labels = el("div", { class: "bucket-labels" });
  fsync.counts.forEach((count, index) => {
    columns.appendChild(el("div", { title: `${count} fsyncs ≤ ${label(index)}` }, undefined,
      { height: `${((count / max) * 100).toFixed(1)}%` }));
    labels.appendChild(el("span", {}, index % 3 === 0 ? label(index) : ""));
  });
  container.replaceChildren(columns, labels);
}

function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    const td = el("td", cell.numeric ? { class: "num" } : {});
    if (cell.node) td.appendChild(cell.node); else td.textContent = cell.text;
    if (cell.key) td.dataset.key = cell.key;
    tr.appendChild(td);
  }
  return tr;
}

function renderSlowest(overview) {
  const body = $("slowest").tBodies[0];
  body.replaceChildren(...overview.slowest.map((item) => row([
    { node: el("a", { href: topicHref(item.topic) }, item.topic) },
    { text: item.door }, { text: item.client },
    { text: number(item.lag), numeric: true }, { text: number(item.pending), numeric: true },
    { text: number(item.unacked), numeric: true },
  ])));
  $("slowest-empty").hidden = overview.slowest.length > 0;
}

function kind(topic) {
  return topic.delivery + " · " + topic.persistence + (topic.sync ? "/" + topic.sync : "");
}

function renderTopics(overview) {
  const history = state.history;
  const body = $("topics").tBodies[0];
  body.replaceChildren(...overview.topics.map((topic) => {
    const tr = row([
      { node: el("a", { href: topicHref(topic.name) }, topic.name) },
      { text: kind(topic) },
      { text: rate(lastRate(history, (s) => s.topics[topic.name] && s.topics[topic.name].in)), numeric: true, key: "in" },
      { text: rate(lastRate(history, (s) => s.topics[topic.name] && s.topics[topic.name].out)), numeric: true, key: "out" },
      { text: number(topic.subscribers), numeric: true }, { text: number(topic.lag), numeric: true },
      { text: number(topic.dropped), numeric: true }, { text: bytes(topic.bytes), numeric: true },
      { text: topic.last_id ? String(topic.last_id) : "–", numeric: true },
    ]);
    tr.dataset.topic = topic.name;
    return tr;
  }));
  const shown = overview.topics.length, total = overview.totals.topics;
  $("topics-note").textContent = shown < total ? `the ${shown} busiest of ${total}` : `${total}`;
}

function renderOverview(overview) {
  remember(overview);
  renderHeader(overview);
  renderCards(overview);
  renderCharts(overview);
  renderBars(overview);
  renderFsync(overview);
  renderSlowest(overview);
  renderTopics(overview);
}

// ------------------------------------------------------------------------------------------ topic page

function facts(container, pairs) {
  container.replaceChildren(...pairs.flatMap(([term, value]) => [el("dt", {}, term), el("dd", {}, value)]));
}

function renderTopic(page) {
  $("topic-name").textContent = page.name;
  const retention = page.retention;
  const settings = [
    ["delivery", page.delivery], ["persistence", page.persistence + (page.sync ? " / " + page.sync : "")],
  ];
  if (page.segment_bytes) settings.push(["segment size", bytes(page.segment_bytes)]);
  if (retention) {
    settings.push(["retention", [retention.seconds ? duration(retention.seconds) : null,
      retention.bytes ? bytes(retention.bytes) : null].filter(Boolean).join(", ") || "keep everything"]);
  }
  if (page.max_backlog !== undefined) settings.push(["max backlog", number(page.max_backlog)]);
  if (page.element_size) settings.push(["element size", bytes(page.element_size)]);
  settings.push(["topic id", String(page.id)]);
  facts($("topic-settings"), settings);
  const ids = [
    ["first id", page.first_id === null ? "– (transient)" : String(page.first_id)],
    ["last id", page.last_id ? String(page.last_id) : "–"],
    ["published", number(page.messages_in)], ["delivered", number(page.messages_out)],
    ["dropped", number(page.dropped)],
  ];
  if (page.stored !== undefined) {
    ids.push(["stored", number(page.stored)], ["on disk", bytes(page.bytes)], ["segments", number(page.segments)],
      ["fsyncs", number(page.fsyncs)], ["write failures", number(page.write_failures || 0)]);
  }
  if (page.delivery === "round-robin") ids.push(["waiting", number(page.backlog)]);
  facts($("topic-ids"), ids);

  state.topicHistory.push({ time: state.history.length ? state.history[state.history.length - 1].time : Date.now() / 1000,
    in: page.messages_in, out: page.messages_out });
  if (state.topicHistory.length > HISTORY + 1) state.topicHistory.shift();
  lineChart($("chart-topic"), [
    { name: "in", color: color(0), points: rateSeries(state.topicHistory, (s) => s.in) },
    { name: "out", color: color(0), dashed: true, points: rateSeries(state.topicHistory, (s) => s.out) },
  ]);

  const body = $("topic-subscribers").tBodies[0];
  body.replaceChildren(...page.subscriptions.map((item) => row([
    { text: item.door }, { text: item.client }, { text: number(item.lag), numeric: true },
    { text: number(item.pending), numeric: true }, { text: item.credit === null ? "∞" : number(item.credit), numeric: true },
    { text: number(item.unacked), numeric: true }, { text: item.catching_up ? "from the log" : "live" },
    { text: number(item.delivered), numeric: true }, { text: number(item.dropped), numeric: true },
  ])));
  $("topic-subscribers-empty").hidden = page.subscriptions.length > 0;
}

// ----------------------------------------------------------------------------------------------- polling

function currentTopic() {
  const match = location.hash.match(/^#\/topic\/(.+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

async function fetchJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  const document = await response.json();
  if (!response.ok) throw new Error(document.error || response.statusText);
  return document;
}

async function poll() {
  if (state.paused) return;
  const topic = currentTopic();
  try {
    const overview = await fetchJSON("/api/overview");
    renderOverview(overview);
    if (topic !== null) renderTopic(await fetchJSON("/api/topics/" + encodeURIComponent(topic)));
  } catch (error) {
    const health = $("health");
    health.textContent = "unreachable";
    health.className = "pill bad";
    health.title = String(error);
  }
}

function route() {
  const topic = currentTopic();
  if (topic !== state.route) {
    // Start the topic's chart with what the overview already saw of it.
    state.topicHistory = state.history.filter((sample) => sample.topics[topic])
      .map((sample) => ({ time: sample.time, in: sample.topics[topic].in, out: sample.topics[topic].out }));
  }
  state.route = topic;
  $("overview").hidden = topic !== null;
  $("topic-page").hidden = topic === null;
  document.title = topic === null ? "mc0 broker" : `${topic} · mc0`;
  poll();
}

$("pause").addEventListener("click", () => {
  state.paused = !state.paused;
  $("pause").textContent = state.paused ? "resume" : "pause";
  if (!state.paused) poll();
});
window.addEventListener("hashchange", route);
route();
state.timer = setInterval(poll, POLL_MS);
