// weir's dashboard: reads /v1/stats every second, /v1/policies every ten,
// and — with the admin token, kept for this tab only — /v1/top every two.
// Everything that comes from the server is written as text, never as HTML.
"use strict";

const HISTORY = 180; // seconds of rates kept per policy
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
};

let token = sessionStorage.getItem("weir-token") || "";
let adminEnabled = null; // unknown until the first /v1/stats
let previous = null; // the last /v1/stats
const latencyReadings = []; // [time_ms, latency_us] of the last ~10 s
const history = new Map(); // policy -> [{allowed, limited, degraded, shadow}]

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  const text = await response.text();
  let body;
  try { body = JSON.parse(text); } catch (_) { body = text; }
  if (!response.ok) {
    const detail = body && body.detail ? body.detail : (body && body.error) || text;
    throw new Error(response.status + ": " + detail);
  }
  return body;
}

// --- store and latency -----------------------------------------------------

function percentile(buckets, q) {
  const total = buckets.reduce((n, [, c]) => n + c, 0);
  if (total === 0) return null;
  let seen = 0;
  for (const [upper, count] of buckets) {
    seen += count;
    if (seen >= q * total) return upper;
  }
  return buckets[buckets.length - 1][0];
}

function human(us) {
  if (us === null) return "–";
  if (us < 1000) return "≤ " + us + " µs";
  return "≤ " + (us / 1000).toFixed(us < 10000 ? 2 : 1) + " ms";
}

function showStore(stats) {
  const s = stats.store;
  $("store-kind").textContent = s.kind === "redis"
    ? "Redis (shared)" + (s.master ? ", master " + s.master + " (Sentinel)" : "")
    : "in process";
  $("store-state").textContent = s.up ? "up" : "degraded: policies decide by on_store_error";
  $("store-breaker").textContent = s.nodes.length === 0 ? s.breaker
    : s.nodes.map((n) => n.node + " " + (n.up ? "closed" : "open") + " (" + n.slots + " slots)").join(" · ");
  $("store-keys").textContent = s.local_keys.toLocaleString();
  const badge = $("store-badge");
  badge.textContent = s.kind + (s.up ? " · up" : " · degraded");
  badge.className = "badge " + (s.up ? "up" : "down");

  // Percentiles of the checks made since the reading ~10 s ago.
  latencyReadings.push([stats.time_ms, stats.latency_us]);
  while (latencyReadings.length > 1 && stats.time_ms - latencyReadings[0][0] > 10000) latencyReadings.shift();
  const before = new Map(latencyReadings[0][1].map(([u, c]) => [u, c]));
  const window = latencyReadings.length > 1
    ? stats.latency_us.map(([u, c]) => [u, c - (before.get(u) || 0)]).filter(([, c]) => c > 0)
    : stats.latency_us;
  const checks = window.reduce((n, [, c]) => n + c, 0);
  $("latency").textContent = checks === 0 ? "no checks"
    : "p50 " + human(percentile(window, 0.5)) + " · p90 " + human(percentile(window, 0.9)) +
      " · p99 " + human(percentile(window, 0.99)) + " (" + checks.toLocaleString() + " checks)";
}

// --- decisions per second --------------------------------------------------

function chartFor(name) {
  let chart = document.querySelector('.chart[data-policy="' + CSS.escape(name) + '"]');
  if (!chart) {
    chart = el("div", undefined, "chart");
    chart.dataset.policy = name;
    const label = el("div");
    label.append(el("strong", name), el("div", "", "rates"));
    const canvas = el("canvas");
    chart.append(label, canvas);
    $("charts").append(chart);
  }
  return chart;
}

function draw(canvas, points) {
  // Drawn at the size it is shown, so that lines and labels stay sharp.
  const scale = window.devicePixelRatio || 1;
  canvas.width = Math.max(1, Math.round(canvas.clientWidth * scale));
  canvas.height = Math.max(1, Math.round(canvas.clientHeight * scale));
  const g = canvas.getContext("2d");
  g.scale(scale, scale);
  const width = canvas.clientWidth, height = canvas.clientHeight;
  g.clearRect(0, 0, width, height);
  const max = Math.max(1, ...points.flatMap((p) => [p.allowed, p.limited, p.degraded, p.shadow]));
  const series = [["allowed", "#2e7d32"], ["limited", "#c62828"], ["degraded", "#ef6c00"], ["shadow", "#6a1b9a"]];
  const x = (i) => width - (points.length - 1 - i) * (width / (HISTORY - 1));
  for (const [key, color] of series) {
    g.strokeStyle = color;
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((p, i) => {
      const y = height - 4 - (p[key] / max) * (height - 16);
      if (i === 0) g.moveTo(x(i), y); else g.lineTo(x(i), y);
    });
    g.stroke();
  }
  g.fillStyle = "#777";
  g.font = "10px sans-serif";
  g.fillText("max " + Math.round(max) + "/s", 4, 11);
}

// Adds each policy's rates since `previous` to its history, and returns them.
function addRates(stats) {
  const seconds = previous ? Math.max(0.001, (stats.time_ms - previous.time_ms) / 1000) : 1;
  const before = new Map((previous ? previous.policies : []).map((p) => [p.name, p]));
  const points = new Map();
  for (const p of stats.policies) {
    const b = before.get(p.name);
    // A reload starts the counts again: a smaller count is a new start.
    const rate = (key) => !b ? 0 : (p[key] >= b[key] ? p[key] - b[key] : p[key]) / seconds;
    const point = { allowed: rate("allowed"), limited: rate("limited"), degraded: rate("degraded"), shadow: rate("shadow_limited") };
    const kept = history.get(p.name) || [];
    kept.push(point);
    if (kept.length > HISTORY) kept.shift();
    history.set(p.name, kept);
    points.set(p.name, point);
  }
  previous = stats;
  return points;
}

function showRates(stats) {
  const latest = addRates(stats);
  for (const p of stats.policies) {
    const points = history.get(p.name);
    const point = latest.get(p.name);
    const chart = chartFor(p.name);
    chart.querySelector(".rates").textContent =
      point.allowed.toFixed(1) + " allowed/s · " + point.limited.toFixed(1) + " limited/s" +
      (point.degraded ? " · " + point.degraded.toFixed(1) + " degraded/s" : "") +
      " · total " + p.allowed.toLocaleString() + " / " + p.limited.toLocaleString();
    chart.dataset.allowed = p.allowed;
    chart.dataset.points = points.length;
    chart.dataset.limited = p.limited;
    draw(chart.querySelector("canvas"), points);
  }
}

async function pollStats() {
  try {
    // The first reading brings the server's last minutes: the charts and
    // the latency window start full, not empty.
    const stats = await api(previous ? "/v1/stats" : "/v1/stats?history=1");
    for (const sample of stats.history || []) {
      addRates(sample);
      latencyReadings.push([sample.time_ms, sample.latency_us]);
    }
    adminEnabled = stats.admin;
    showStore(stats);
    showRates(stats);
  } catch (e) {
    $("store-badge").textContent = "weir unreachable";
    $("store-badge").className = "badge down";
  }
}

// --- policies ----------------------------------------------------------------

let policyNames = [];

async function pollPolicies() {
  let body;
  try { body = await api("/v1/policies"); } catch (_) { return; }
  const rows = $("policy-rows");
  rows.replaceChildren();
  for (const p of body.policies) {
    const tr = el("tr");
    tr.dataset.policy = p.name;
    const users = p.routes.map((r) => "route " + r).concat(p.descriptors.map((d) => "descriptor " + d));
    tr.append(
      el("td", p.name),
      el("td", p.algorithm),
      el("td", p.spec),
      el("td", p.shadow ? "shadow (never refuses)" : "enforced"),
      el("td", users.length ? users.join("; ") : "the decision API"),
    );
    rows.append(tr);
  }
  const names = body.policies.map((p) => p.name);
  if (names.join("\n") !== policyNames.join("\n")) {
    policyNames = names;
    const select = $("inspect-policy");
    select.replaceChildren(...names.map((n) => { const o = el("option", n); o.value = n; return o; }));
  }
}

// --- top keys, inspector, reset ---------------------------------------------

function adminNote() {
  if (!adminEnabled) return "The admin API is off: set [server] admin_token (or WEIR_ADMIN_TOKEN) and restart weir to see who is limited, inspect and reset keys.";
  if (!token) return "Enter the admin token above to see who is limited (identities are shown to admins only).";
  return "";
}

async function pollTop() {
  if (adminEnabled === null) return;
  const note = adminNote();
  $("admin-note").textContent = note;
  const top = $("top");
  if (note) { top.replaceChildren(); return; }
  const blocks = [];
  for (const name of policyNames) {
    let body;
    try {
      body = await api("/v1/top?policy=" + encodeURIComponent(name) + "&n=5");
    } catch (e) {
      $("admin-note").textContent = e.message;
      top.replaceChildren();
      return;
    }
    const block = el("div");
    block.dataset.policy = name;
    block.append(el("h3", name + " — " + body.refused.toLocaleString() + " refusals (counts within ±" + body.error_bound + ")"));
    if (body.top.length === 0) {
      block.append(el("p", "no one limited", "note"));
    } else {
      const table = el("table");
      for (const h of body.top) {
        const tr = el("tr", undefined, "hitter");
        tr.dataset.key = h.key;
        const inspect = el("button", "inspect");
        inspect.type = "button";
        inspect.addEventListener("click", () => { $("inspect-policy").value = name; $("inspect-key").value = h.key; inspectKey(); });
        const actions = el("td");
        actions.append(inspect);
        const who = el("td", h.key);
        if (h.banned_until_ms) {
          tr.classList.add("banned");
          const until = new Date(h.banned_until_ms);
          who.append(" ", el("span", "banned until " + until.toLocaleTimeString(), "ban"));
        }
        tr.append(who, el("td", h.refused.toLocaleString() + (h.error ? " ±" + h.error : ""), "num"), actions);
        table.append(tr);
      }
      block.append(table);
    }
    blocks.push(block);
  }
  top.replaceChildren(...blocks);
}

function keyPath() {
  return "/v1/keys/" + encodeURIComponent($("inspect-policy").value) + "/" + encodeURIComponent($("inspect-key").value);
}

async function inspectKey() {
  const out = $("inspect-result");
  try {
    // Why the key is limited (GET /v1/explain): nothing is charged.
    const body = await api("/v1/explain?policy=" + encodeURIComponent($("inspect-policy").value) +
      "&key=" + encodeURIComponent($("inspect-key").value));
    const d = body.next_check;
    const why = [];
    if (body.banned) why.push("BANNED until " + new Date(body.banned_until).toLocaleString());
    if (body.in_debt) why.push("in debt: usage reported past the limit");
    if (body.override) why.push("decided by its override " + body.override + (body.unlimited ? " (unlimited)" : ""));
    out.textContent = (body.exists ? "stored" : "not stored (a new key)") + " · " + body.parameters +
      (body.penalty ? " · penalty " + body.penalty : "") + "\n" +
      (why.length ? why.join("\n") + "\n" : "") +
      "a check of cost 1 now: " + (d.allowed ? "allowed" : "refused, retry after " + d.retry_after_ms + " ms") +
      "\nremaining " + d.remaining + " of " + d.limit + ", full again in " + d.reset_ms + " ms\n\n" + JSON.stringify(body, null, 2);
  } catch (e) {
    out.textContent = e.message;
  }
}

async function resetKey() {
  const out = $("inspect-result");
  try {
    const body = await api(keyPath(), { method: "DELETE" });
    out.textContent = (body.existed ? "reset: " : "nothing to reset: ") + body.effect;
    pollTop();
  } catch (e) {
    out.textContent = e.message;
  }
}

// --- playground ---------------------------------------------------------------

function trace(rows) {
  return "time,key\n" + rows.map(([t, k]) => t.toFixed(3) + "," + k).join("\n") + "\n";
}

const generators = {
  // 30 requests at once, then a trickle.
  "gen-burst": () => trace([...Array(30).keys()].map(() => [1, "a"]).concat([...Array(10).keys()].map((i) => [2 + i, "a"]))),
  // 5 a second for 20 s against limits of about 2 a second.
  "gen-steady": () => trace([...Array(100).keys()].map((i) => [i * 0.2, "a"])),
  // 10 in the last 100 ms before a 5 s boundary, 10 in the first 100 ms after.
  "gen-boundary": () => trace([...Array(20).keys()].map((i) => [i < 10 ? 4.9 + i * 0.01 : 5 + (i - 10) * 0.01, "a"])),
};

let plotUrl = null;

async function plot() {
  $("pg-error").textContent = "";
  const policies = $("pg-policies").value.split("\n").map((s) => s.trim()).filter(Boolean);
  try {
    const body = await api("/v1/simulate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ policies, trace: $("pg-trace").value }),
    });
    const summary = $("pg-summary");
    const head = el("tr");
    ["policy", "admitted", "rejected", "delayed", "largest burst"].forEach((h) => head.append(el("th", h)));
    summary.replaceChildren(head, ...body.lanes.map((l) => {
      const tr = el("tr");
      tr.append(el("td", l.label), el("td", l.admitted, "num"), el("td", l.rejected, "num"), el("td", l.delayed, "num"), el("td", l.max_burst, "num"));
      return tr;
    }));
    // Shown as an image: nothing in it can run.
    if (plotUrl) URL.revokeObjectURL(plotUrl);
    plotUrl = URL.createObjectURL(new Blob([body.svg], { type: "image/svg+xml" }));
    $("pg-img").src = plotUrl;
    $("pg-img").alt = "decisions of " + policies.join(", ");
  } catch (e) {
    $("pg-error").textContent = e.message;
  }
}

// --- wiring -------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = token;
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    token = $("token").value.trim();
    sessionStorage.setItem("weir-token", token);
    pollTop();
  });
  $("inspect-form").addEventListener("submit", (e) => { e.preventDefault(); inspectKey(); });
  $("reset").addEventListener("click", resetKey);
  for (const [id, make] of Object.entries(generators)) {
    $(id).addEventListener("click", () => { $("pg-trace").value = make(); });
  }
  $("pg-plot").addEventListener("click", plot);
  pollPolicies().then(pollStats).then(pollTop);
  setInterval(pollStats, 1000);
  setInterval(pollPolicies, 10000);
  setInterval(pollTop, 2000);
});
