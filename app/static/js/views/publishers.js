// Publishers: every stream's health at a glance (connected, how old its last frame is,
// how far behind its worker's stats are, gaps, missed batches, replays, malformed
// frames, drops, address family changes, sources of the other family than their host)
// and its configuration, from /api/v1/stats each
// second, and in listen mode the listen socket's counts in a sentence. A count that says
// something went wrong is marked in bold as well as colour, and described by a key under the
// table that a keyboard, a touch and a screen reader reach (a tooltip reached none of them);
// one of what the sidecar did to keep up with its publisher (batches replayed, sockets made
// again for another address family) is not.
import { h, say, table } from "../dom.js";
import { age, count, counted } from "../format.js";

const HEALTH = ["gaps", "missed", "malformed", "held_dropped", "source_family_mismatches", "dropped"];
const HEALTH_COLUMNS = ["status", "publisher", "last frame", "stats lag", "frames", "gaps", "missed",
  "replayed", "replays (complete / failed)", "malformed", "held dropped", "family changes",
  "source family mismatches", "dropped"];
const CONFIG_COLUMNS = ["publisher", "mode", "engine", "rank", "policy", "capacity", "block size"];

const PROBLEM_KEY = "problem-key";

function cell(text, problem = false) {
  return h("td", { text: text ?? "–", class: problem ? "problem" : null,
    "aria-describedby": problem ? PROBLEM_KEY : null });
}

// A worker clock ahead of the sidecar's stamps its stats after the sidecar's now: said so,
// where the age of a negative lag read "0 s" and hid the skew.
function lagText(lag) {
  if (lag === null) return "–";
  return lag < 0 ? `clock ${age(-lag)} ahead` : age(lag);
}

function healthRow(p, now) {
  const failed = Object.entries(p.replays).filter(([k]) => k !== "complete").reduce((a, [, v]) => a + v, 0);
  const lag = p.stats_ts === null || p.stats_ts === undefined ? null : now - p.stats_ts;
  const status = h("td", {}, h("span", { class: `dot ${p.connected ? "on" : ""}`, "aria-hidden": "true" }),
    p.connected ? " connected" : " disconnected");
  const counted = (name) => cell(p[name] === null ? "–" : count(p[name]), p[name] > 0);
  return h("tr", { "data-publisher": p.name, "data-connected": String(p.connected) },
    status, cell(p.name), cell(p.last_frame_at === null ? "never" : `${age(now - p.last_frame_at)} ago`),
    cell(lagText(lag)), cell(count(p.frames)),
    counted("gaps"), counted("missed"), cell(count(p.replayed)),
    cell(`${count(p.replays.complete)} / ${count(failed)}`, failed > 0),
    counted("malformed"), counted("held_dropped"), cell(count(p.family_changes)),
    counted("source_family_mismatches"), counted("dropped"));
}

function configRow(p) {
  return h("tr", { "data-publisher": p.name }, cell(p.name), cell(p.mode), cell(p.engine_id),
    cell(p.rank === null ? null : String(p.rank)), cell(p.policy),
    cell(p.capacity_blocks === null ? null : counted(p.capacity_blocks, "block")),
    cell(p.block_size === null ? null : counted(p.block_size, "token")));
}

function mount(panel, { stats }) {
  const [publishers, body] = table(HEALTH_COLUMNS, { id: "publishers" });
  const [configs, configBody] = table(CONFIG_COLUMNS, { id: "publisher-config" });
  const summary = h("p", { class: "summary", role: "status" });
  const listener = h("p", { class: "detail" });
  panel.append(
    h("section", { class: "card" }, h("h2", { text: "Publishers: health" }), summary,
      h("div", { class: "scroll" }, publishers),
      h("p", { id: PROBLEM_KEY, class: "detail" },
        h("span", { class: "problem", text: "Bold red" }), ": a count that should be zero and is not."),
      listener),
    h("section", { class: "card" }, h("h2", { text: "Publishers: configuration" }),
      h("div", { class: "scroll" }, configs)));

  function show(s) {
    const now = s.ts;
    body.replaceChildren(...s.publishers.map((p) => healthRow(p, now)));
    configBody.replaceChildren(...s.publishers.map(configRow));
    const up = s.publishers.filter((p) => p.connected).length;
    const troubled = s.publishers.filter((p) => HEALTH.some((k) => p[k] > 0)).length;
    say(summary, `${up} of ${s.publishers.length} connected; ${troubled} with gaps, `
      + "missed batches, malformed frames, drops or a source address its host cannot be reached from.");
    const l = s.listener;
    listener.textContent = l ? `Listening on ${l.endpoints.join(", ")}: ${counted(l.frames, "frame")}, `
      + `${count(l.malformed)} malformed, ${count(l.refused)} refused; ${count(l.publishers)} of at most `
      + `${counted(l.max_publishers, "listen-mode publisher")}; ${count(l.connections)} of at most `
      + `${counted(l.max_connections, "peer")} admitted, ${counted(l.refused_connections, "handshake")} refused; `
      + `at most ${l.max_connections_per_host} from one host, `
      + `${count(l.refused_host_connections)} refused past it; `
      + `${counted(l.stream_moves, "stream move")} to another host (a count that climbs: two peers `
      + `send under one name), ${count(l.stream_move_resets)} forgetting the stream's blocks`
      + (l.allow.length ? `; peers from ${l.allow.join(", ")} only, `
        + `${count(l.refused_addresses)} from elsewhere refused.` : ".") : "";
  }

  let unsubscribe = null;
  return {
    show() { unsubscribe ??= stats.subscribe(show); },
    hide() { unsubscribe?.(); unsubscribe = null; },
  };
}

export default { id: "publishers", title: "Publishers", mount };
