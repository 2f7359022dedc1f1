// Events: the live block-event feed over Server-Sent Events, opened when the view is
// first shown. The browser's EventSource reconnects by itself after a broken connection
// and sends the last id it saw (Last-Event-ID), so the sidecar resumes after it; the feed
// also drops any id it already holds, so nothing shows twice. Pause freezes the list
// (events keep arriving, and show on resume); kind and medium filters are in the URL.
import { Backoff } from "../backoff.js";
import { fillSelect, h, say } from "../dom.js";
import { count, counted } from "../format.js";
import { mediaOf } from "../stats.js";

const HELD = 2000; // events kept for filtering and for showing after a pause
const SHOWN = 200; // list items at most
const HASHES_SHOWN = 4;
const KINDS = ["stored", "removed", "cleared"];
const REOPEN_MS = 1500; // the first wait after a refused stream: 3 s, then 6 s, … 30 s

function item(e) {
  const hashes = e.block_hashes.slice(0, HASHES_SHOWN).join(", ");
  const more = e.block_count > HASHES_SHOWN ? ` +${count(e.block_count - HASHES_SHOWN)}` : "";
  return h("li", { class: e.kind, "data-id": String(e.id), "data-medium": e.medium ?? "", title: e.publisher,
    text: `#${e.id} ${e.kind} ${e.medium ?? "every medium"}${group(e)} [${hashes}${more}]` });
}

// A hybrid model holds a block once per KV cache group: which copy an event is of.
function group(e) {
  return e.group === null || e.group === undefined ? "" : ` group ${e.group}`;
}

/** An event as the feed shows it, or null: anything else in a message (a proxy's page, a
 * cut-off line) is counted, not shown, and never stops the feed. */
function parsed(data) {
  let e;
  try {
    e = JSON.parse(data);
  } catch {
    return null;
  }
  const known = e && Number.isSafeInteger(e.id) && KINDS.includes(e.kind) && Array.isArray(e.block_hashes)
    && Number.isSafeInteger(e.block_count) && (e.medium === null || typeof e.medium === "string");
  return known ? e : null;
}

class Follower {
  /** Reads the stream into `held`; calls `changed()` when something arrived or its state moved. */
  constructor(changed) {
    this.changed = changed;
    this.held = [];
    this.lastId = null;
    this.fresh = false;
    this.opened = 0;
    this.duplicates = 0;
    this.unheld = 0;
    this.restarts = 0;
    this.malformed = 0;
    this.state = "connecting";
    this.backoff = new Backoff(REOPEN_MS);
  }

  start() {
    const source = new EventSource("api/v1/events/stream");
    source.onopen = () => {
      this.backoff.succeeded();
      this.opened += 1;
      this.fresh = true;
      this.state = "live";
      this.changed([]);
    };
    source.onerror = () => {
      // Open or connecting: EventSource retries, with Last-Event-ID. Closed (a refusal such
      // as 503, whose Retry-After EventSource does not show): a new one after a wait that
      // grows with each refusal in a row, which starts from the newest events.
      this.state = "reconnecting";
      if (source.readyState === EventSource.CLOSED) setTimeout(() => this.start(), this.backoff.failed());
      this.changed([]);
    };
    source.onmessage = (message) => {
      const event = this.accept(parsed(message.data));
      if (event) this.changed([event]);
    };
  }

  accept(e) {
    if (!e) {
      this.malformed += 1;
      return null;
    }
    const fresh = this.fresh;
    this.fresh = false;
    if (this.lastId !== null && e.id <= this.lastId) {
      if (!fresh) {
        this.duplicates += 1;
        return null;
      }
      this.restarts += 1; // resumed by a new sidecar process: its ids start again from 1
    } else if (this.lastId !== null && e.id > this.lastId + 1) {
      this.unheld += e.id - this.lastId - 1; // no longer held by the sidecar when we resumed
    }
    this.lastId = e.id;
    this.held.push(e);
    if (this.held.length > HELD) this.held.splice(0, this.held.length - HELD);
    return e;
  }
}

function mount(panel, { stats, navigate }) {
  let params = {};
  let paused = false;
  let waiting = 0;
  let pending = [];
  let scheduled = false;
  const feed = h("ol", { id: "event-feed", "aria-live": "off" });
  const kind = h("select", { id: "filter-kind", onchange: () => navigate({ ...params, kind: kind.value }) });
  const medium = h("select", { id: "filter-event-medium", onchange: () => navigate({ ...params, medium: medium.value }) });
  const pause = h("button", { id: "pause", type: "button", "aria-pressed": "false", text: "Pause",
    onclick: () => setPaused(!paused) });
  // The feed's state aloud (live, reconnecting, paused), its counts, which move with every
  // event, only on the page.
  const mode = h("span", { role: "status" });
  const counts = h("span");
  const state = h("span", { id: "feed-state", class: "detail" }, mode, counts);
  panel.append(h("section", { class: "card" }, h("h2", { text: "Live events" }),
    h("div", { class: "toolbar" }, pause,
      h("label", { class: "field" }, h("span", { text: "Kind" }), kind),
      h("label", { class: "field" }, h("span", { text: "Medium" }), medium), state),
    feed));
  fillSelect(kind, [["", "every kind"], ...KINDS.map((k) => [k, k])], "");

  const matches = (e) => (!params.kind || e.kind === params.kind)
    && (!params.medium || e.medium === params.medium || e.medium === null);
  const follower = new Follower((arrived) => {
    if (paused) waiting += arrived.length; // shown from `held` on resume
    else pending.push(...arrived.filter(matches));
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(render);
    }
  });

  function render() {
    scheduled = false;
    const f = follower;
    Object.assign(feed.dataset, { lastId: f.lastId ?? "", reconnects: String(Math.max(0, f.opened - 1)),
      duplicates: String(f.duplicates), unheld: String(f.unheld), malformed: String(f.malformed) });
    const notes = [paused ? `: ${counted(waiting, "new event")} since` : "", `${count(f.held.length)} held`];
    if (f.opened > 1) notes.push(counted(f.opened - 1, "reconnection"));
    if (f.unheld) notes.push(`${counted(f.unheld, "event")} no longer held on reconnection`);
    if (f.restarts) notes.push("the sidecar restarted");
    if (f.malformed) notes.push(`${counted(f.malformed, "message")} left out: not events`);
    say(mode, paused ? "paused" : f.state);
    counts.textContent = notes.join(" · ");
    if (paused) return;
    const fresh = pending.slice(-SHOWN).reverse().map(item);
    pending = [];
    feed.prepend(...fresh);
    while (feed.childElementCount > SHOWN) feed.lastElementChild.remove();
  }

  function rebuild() {
    pending = [];
    feed.replaceChildren(...follower.held.filter(matches).slice(-SHOWN).reverse().map(item));
    render();
  }

  function setPaused(value) {
    paused = value;
    waiting = 0;
    // A toggle keeps its name ("Pause", pressed while paused): one renamed "Resume" as it
    // was pressed read "Resume, pressed", as though the feed ran.
    pause.setAttribute("aria-pressed", String(paused));
    feed.dataset.paused = String(paused);
    if (!paused) rebuild();
    else render();
  }

  function offerMedia(s) {
    const seen = new Set([...mediaOf(s), params.medium].filter(Boolean));
    fillSelect(medium, [["", "every medium"], ...[...seen].map((m) => [m, m])], params.medium ?? "");
  }

  let unsubscribe = null;
  follower.start();
  return {
    show(next) {
      params = { kind: KINDS.includes(next.kind) ? next.kind : "", medium: next.medium ?? "" };
      kind.value = params.kind;
      offerMedia({ blocks_by_medium: stats.latest?.blocks_by_medium ?? {} });
      unsubscribe ??= stats.subscribe(offerMedia);
      rebuild();
    },
    hide() { unsubscribe?.(); unsubscribe = null; },
  };
}

export default { id: "events", title: "Events", mount };
