// Overview: the live cards (from /api/v1/stats each second) and the charts of the
// sidecar's history (loaded at once when the view opens, so they start before the page
// did, then extended each point): hit ratio, occupancy per medium, stores, loads and
// evictions by reason, dead writes, transfer bandwidth and latency per direction.
import { TimeChart } from "../charts.js";
import { h, fillSelect, say } from "../dom.js";
import { count, counted, parts, unitGap, withUnit } from "../format.js";
import { RANGES, byLabel, counterRates, gaugeTotals, increases, max, sum } from "../history.js";
import { mediaOf } from "../stats.js";

const DIRECTIONS = { gpu_to_cpu: "GPU→CPU", cpu_to_gpu: "CPU→GPU" };
// A worker names the direction: "constructor" is not one of ours, though every object has it.
const direction = (name) => (Object.hasOwn(DIRECTIONS, name) ? DIRECTIONS[name] : name);
const MEDIA_ORDER = (a, b) => (["GPU", "CPU"].indexOf(a) >>> 0) - (["GPU", "CPU"].indexOf(b) >>> 0);

/** What each chart draws from the history: [{name, values}] per point of `store.times`. */
const CHARTS = [
  {
    id: "hit-ratio", title: "Hit ratio (lookups)", unit: "ratio",
    empty: "No lookups yet.",
    lines(store) {
      const n = store.times.length;
      const hits = sum(store.select("lookup_hit_blocks").map((s) => increases(s.values)), n);
      const asked = sum(store.select("lookup_blocks").map((s) => increases(s.values)), n);
      const ratio = asked.map((a, i) => (a ? hits[i] / a : null));
      return [{ name: "hit ratio", values: ratio }];
    },
  },
  {
    id: "occupancy", title: "Occupancy per medium", unit: "blocks",
    empty: "No blocks reported yet.",
    lines: (store) => [...gaugeTotals(store, "blocks", "medium")]
      .sort(([a], [b]) => MEDIA_ORDER(a, b)).map(([name, values]) => ({ name, values })),
  },
  {
    id: "throughput", title: "Stores, loads and evictions by reason", unit: "blocks/s",
    empty: "No stores, loads or evictions reported yet.",
    lines: (store) => [
      ...[...counterRates(store, "stores_completed")].map(([, values]) => ({ name: "stores", values })),
      ...[...counterRates(store, "loads")].map(([, values]) => ({ name: "loads", values })),
      ...[...counterRates(store, "evictions", "reason")]
        .map(([reason, values]) => ({ name: `evicted: ${reason}`, values })),
    ],
  },
  {
    id: "dead-writes", title: "Dead writes (stored, evicted unread)", unit: "blocks/s",
    empty: "No dead-write series yet: no publisher has reported dead writes.",
    lines: (store) => [...counterRates(store, "dead_write_blocks")]
      .map(([, values]) => ({ name: "dead writes", values })),
  },
  {
    id: "bandwidth", title: "Transfer bandwidth per direction", unit: "bytes/s",
    empty: "No transfers reported yet.",
    lines: (store) => [...gaugeTotals(store, "transfer_bytes_per_s", "direction")]
      .map(([name, values]) => ({ name: direction(name), values })),
  },
  {
    id: "latency", title: "Transfer latency per direction (worst publisher)", unit: "seconds",
    empty: "No transfer-latency series yet: no publisher has reported transfer latency.",
    lines(store) {
      const lines = [];
      for (const [name, series] of byLabel(store.select("transfer_latency_s"), "direction")) {
        for (const [quantile, some] of byLabel(series, "quantile")) {
          const values = max(some.map((s) => s.values), store.times.length);
          lines.push({ name: `${direction(name)} p${Math.round(100 * Number(quantile))}`, values });
        }
      }
      return lines.sort((a, b) => a.name.localeCompare(b.name));
    },
  },
];

// A medium's card counts copies, as vLLM announces them; the index tracks distinct hashes,
// so a hybrid model's GPU card can read more blocks than the index tracks. Said in a line
// under the cards, not a tooltip that a keyboard or a touch never opens.
const COPIES = "Blocks per medium count copies held: a block held by two workers, or by two KV "
  + "cache groups of one worker, counts twice.";

/** A card headed `title` (text, or nodes); `describedBy` names the id of a visible note on
what it counts. */
function card(id, title, describedBy) {
  const value = h("span", { class: "value", text: "–" });
  const gap = document.createTextNode(" ");
  const unit = h("span", { class: "unit" });
  const detail = h("p", { class: "detail" });
  const element = h("div", { class: "card", "data-card": id },
    h("h2", { "aria-describedby": describedBy }, title),
    h("p", { class: "big" }, value, gap, unit), detail);
  return { element, show(number, unitText, detailText = "") {
    value.textContent = number;
    gap.textContent = unitGap(unitText);
    unit.textContent = unitText;
    detail.textContent = detailText;
  } };
}

function mount(panel, context) {
  const { stats, history } = context;
  const cards = h("div", { class: "cards" });
  const fixed = {
    hitRatio: card("hit-ratio", "Hit ratio"),
    stores: card("stores-rate", "Stores"),
    loads: card("loads-rate", "Loads"),
    evictions: card("evictions-rate", "Evictions"),
    events: card("events-rate", "Block events"),
  };
  const mediumCards = new Map();
  // Named by its label (the words a voice command says), not an aria-label over it.
  const range = h("select", { id: "range",
    onchange: () => context.navigate({ range: range.value }) });
  fillSelect(range, Object.entries(RANGES).map(([key, r]) => [key, r.label]), "15m");
  const grid = h("div", { class: "charts" });
  const copiesNote = h("p", { id: "copies-note", class: "detail", text: COPIES, hidden: true });
  const historyState = h("span", { id: "history-state", class: "problem", role: "status" });
  panel.append(
    h("h2", { class: "visually-hidden", text: "Overview" }), cards, copiesNote,
    h("div", { class: "toolbar" }, h("label", { for: "range", text: "Charts: " }), range,
      h("span", { class: "hint",
        text: "drag across a chart to zoom, double-click to zoom out, press a line's name to hide or show it, "
          + "arrow keys on a focused chart read earlier values, + and - zoom it, 0 shows all" }),
      historyState),
    grid,
  );
  const charts = CHARTS.map((spec) => ({ spec, chart: new TimeChart(grid, spec) }));
  let drawnCards = false;
  let drawnCharts = false;

  function firstRender() {
    if (drawnCards && drawnCharts && !panel.dataset.rendered) {
      panel.dataset.rendered = "true";
      performance.mark("kvscope:first-render");
    }
  }

  function showStats(s) {
    const media = mediaOf(s);
    // A medium the sidecar no longer reports (it restarted) loses its card, which kept the
    // last count the sidecar before it gave.
    for (const [medium, gone] of mediumCards) {
      if (!media.includes(medium)) {
        gone.element.remove();
        mediumCards.delete(medium);
      }
    }
    copiesNote.hidden = !media.length;
    for (const medium of media) {
      if (!mediumCards.has(medium)) {
        // The medium's name as its peer wrote it: headings are set in capitals, which made
        // "cpu" and "CPU", two media, two cards that read alike.
        const name = h("span", { class: "name", text: medium });
        const made = card(`blocks:${medium}`, [name, " blocks"], copiesNote.id);
        mediumCards.set(medium, made);
        cards.insertBefore(made.element, cards.children[mediumCards.size - 1] ?? null);
      }
      const bytes = s.bytes_by_medium[medium];
      mediumCards.get(medium).show(...parts(s.blocks_by_medium[medium], "blocks"),
        bytes === undefined ? "copies held" : `copies held, ${withUnit(bytes, "bytes")}`);
    }
    fixed.hitRatio.show(...parts(s.hit_ratio, "ratio"),
      `${count(s.lookup_hit_blocks)} of ${counted(s.lookup_blocks, "block")} looked up`);
    fixed.stores.show(...parts(s.stores_per_s, "blocks/s"), `${count(s.stores_completed)} stored in all`);
    fixed.loads.show(...parts(s.loads_per_s, "blocks/s"), `${count(s.loads)} loaded in all`);
    const evicted = Object.values(s.evictions).reduce((a, b) => a + b, 0);
    fixed.evictions.show(...parts(s.evictions_per_s, "blocks/s"), `${count(evicted)} evicted in all`);
    fixed.events.show(...parts(s.events_per_s, "events/s"),
      `${counted(s.tracked_blocks, "distinct block")} tracked, at most ${count(s.max_blocks)}`);
    drawnCards = true;
    firstRender();
  }

  function showHistory(store) {
    const { problem } = store;
    say(historyState, problem
      ? `history unavailable: ${problem.message}; trying again in ${problem.retryS} s` : "");
    for (const { spec, chart } of charts) chart.update(store.times, spec.lines(store));
    drawnCharts = true;
    firstRender();
  }

  cards.append(...Object.values(fixed).map((c) => c.element));
  let unsubscribe = [];
  return {
    show(params) {
      const chosen = Object.hasOwn(RANGES, params.range) ? params.range : "15m"; // not "constructor"
      range.value = chosen;
      history.setResolution(RANGES[chosen].resolution);
      if (!unsubscribe.length) unsubscribe = [stats.subscribe(showStats), history.subscribe(showHistory)];
    },
    hide() {
      unsubscribe.forEach((stop) => stop());
      unsubscribe = [];
    },
  };
}

export default { id: "overview", title: "Overview", mount };
