// kvscope's live page: polls /api/v1/stats every second, follows the SSE event stream.
// With a token set, the page was opened as /?token=TOKEN, which the sidecar answered with a
// session cookie and a redirect to /: every request below carries that cookie, and no URL
// carries the token.
"use strict";
const HISTORY = 300;  // seconds of chart history
const series = { gpu: [], cpu: [], g2c: [], c2g: [] };
const fmt = (v, digits = 0) => (v === null || v === undefined ? "–"
  : Number(v).toLocaleString(undefined, { maximumFractionDigits: digits }));

function push(name, value) {
  series[name].push(value ?? 0);
  if (series[name].length > HISTORY) series[name].shift();
}

function draw(canvasId, lines) {
  const canvas = document.getElementById(canvasId);
  const width = (canvas.width = canvas.clientWidth);
  const height = canvas.height;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1, ...lines.flatMap((l) => l.values));
  ctx.fillStyle = "#8a94a3";
  ctx.font = "11px system-ui";
  ctx.fillText(fmt(max), 4, 12);
  lines.forEach((line, i) => {
    ctx.strokeStyle = line.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    line.values.forEach((v, x) => {
      const px = (x / Math.max(1, HISTORY - 1)) * width;
      const py = height - 4 - (v / max) * (height - 20);
      x === 0 ? ctx.moveTo(px, py) : ctx.lineTo(px, py);
    });
    ctx.stroke();
    ctx.fillStyle = line.color;
    ctx.fillText(line.label, width - 120, 14 + 14 * i);
  });
}

function publisherRow(p) {
  const cells = [p.name, p.engine_id, p.policy, fmt(p.capacity_blocks), p.last_seq ?? "–",
    p.gaps, p.missed, p.restarts, p.malformed, p.dropped ?? "–"];
  const row = document.createElement("tr");
  const dot = document.createElement("td");
  dot.innerHTML = `<span class="dot ${p.connected ? "on" : ""}"></span>`;
  row.append(dot, ...cells.map((c) => Object.assign(document.createElement("td"),
    { textContent: c ?? "–" })));
  return row;
}

async function refresh() {
  try {
    const response = await fetch("/api/v1/stats");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const s = await response.json();
    const media = s.blocks_by_medium || {};
    document.getElementById("blocks-gpu").textContent = fmt(media.GPU ?? 0);
    document.getElementById("blocks-cpu").textContent = fmt(media.CPU ?? 0);
    document.getElementById("hit-ratio").textContent =
      s.hit_ratio === null || s.hit_ratio === undefined ? "–" : `${(100 * s.hit_ratio).toFixed(2)}%`;
    document.getElementById("hit-detail").textContent =
      `${fmt(s.lookup_hit_blocks)} of ${fmt(s.lookup_blocks)} blocks`;
    document.getElementById("stores-rate").textContent = fmt(s.stores_per_s, 1);
    document.getElementById("loads-rate").textContent = fmt(s.loads_per_s, 1);
    document.getElementById("evictions-rate").textContent = fmt(s.evictions_per_s, 1);
    push("gpu", media.GPU);
    push("cpu", media.CPU);
    const bw = s.transfer_bytes_per_s || {};
    push("g2c", (bw.gpu_to_cpu ?? 0) / 1e6);
    push("c2g", (bw.cpu_to_gpu ?? 0) / 1e6);
    draw("occupancy", [{ label: "GPU", color: "#88c0d0", values: series.gpu },
      { label: "CPU", color: "#a3be8c", values: series.cpu }]);
    draw("bandwidth", [{ label: "GPU→CPU", color: "#ebcb8b", values: series.g2c },
      { label: "CPU→GPU", color: "#b48ead", values: series.c2g }]);
    document.querySelector("#publishers tbody").replaceChildren(
      ...(s.publishers || []).map(publisherRow));
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("updated").textContent = `stats unavailable: ${error.message}`;
  }
}

function follow() {
  const feed = document.getElementById("event-feed");
  new EventSource("/api/v1/events/stream").onmessage = (message) => {
    const e = JSON.parse(message.data);
    const item = document.createElement("li");
    item.className = e.kind;
    const hashes = (e.block_hashes || []).slice(0, 4).join(", ");
    const count = e.block_count ?? (e.block_hashes || []).length;  // the list may be cut short
    const more = count > 4 ? ` +${count - 4}` : "";
    item.textContent = `#${e.id} ${e.kind} ${e.medium ?? ""} [${hashes}${more}]`;
    feed.prepend(item);
    while (feed.children.length > 100) feed.lastChild.remove();
  };
}

refresh();
setInterval(refresh, 1000);
// The stream starts a moment after the first numbers: the page is useful before it.
setTimeout(follow, 2000);
