// Insight: why the tier hits what it hits, from /api/v1/insight every two seconds while
// open. Per publisher: the tier's efficiency against a clairvoyant cache of its size, with
// the optimum's window as a figure of its own (the optimum beside the tier's policy over
// the same references, never on the curve), the hit-ratio curve (what the tier would hit at
// 1/8x to 8x its capacity over the whole sample, one line per simulated policy, the current
// capacity marked), the sidecar's verdicts in words, lost blocks by reason over time (from
// the history), stranded blocks per medium, the dead-write ratio and the sampled stream's health. The
// page draws what the API computed; it computes no finding itself.
import { get } from "../api.js";
import { Backoff } from "../backoff.js";
import { TimeChart } from "../charts.js";
import { h, fillSelect, say } from "../dom.js";
import { clock, count, counted, decimal, parts, unitGap, withUnit } from "../format.js";
import { counterRates } from "../history.js";
import { legendToggles } from "../legend_toggles.js";

const PERIOD_MS = 2000;
/** Miss reasons in the order the chart lists them (any other after, by its own name): the
 * name the legend and the key give each, and what it means for the blocks counted under it
 * (offload/cpu/miss_attribution.py decides which). */
const REASONS = {
  cold: { label: "cold", meaning: "never stored, or stored so long ago that the tier no longer remembers it" },
  evicted: { label: "evicted", meaning: "stored, then evicted to make room" },
  not_admitted: { label: "not admitted", meaning: "offered, but the tier's admission rule chose not to store it" },
  no_room: { label: "no room", meaning: "offered, but the tier could not make room to store it: a request "
    + "longer than the tier, or every other slot in use by loads and stores" },
  in_flight: { label: "in flight", meaning: "still being written, not readable yet" },
  prefix_lost: { label: "prefix lost", meaning: "held by the tier, but after the block the lookup stopped at, "
    + "so out of its reach" },
};
const ORDER = Object.keys(REASONS);
const reasonOrder = ([a], [b]) => (ORDER.indexOf(a) >>> 0) - (ORDER.indexOf(b) >>> 0) || a.localeCompare(b);
// A worker names the reason: "constructor" is not one of ours, though every object has it.
const reasonLabel = (reason) => (Object.hasOwn(REASONS, reason) ? REASONS[reason].label : reason);

/** What the lost-blocks chart's reasons mean, under its plot. */
function reasonKey() {
  return h("div", { class: "key", id: "miss-reasons-key" },
    h("p", { text: "A lookup stops at the first block of its chain the tier cannot give; the "
      + "blocks it loses there count under that block's reason, except those the tier still holds "
      + "further on (prefix lost):" }),
    h("dl", {}, Object.values(REASONS).flatMap(({ label, meaning }) => [
      h("dt", { text: label }), h("dd", { text: meaning }),
    ])));
}

function colour(index) {
  return getComputedStyle(document.documentElement).getPropertyValue(`--series-${(index % 8) + 1}`).trim();
}

/** A vertical rule at the current capacity, drawn over the plot. */
function markCurrent(current) {
  return (u) => {
    const x = Math.round(u.valToPos(current, "x", true));
    const { top, height } = u.bbox;
    u.ctx.save();
    u.ctx.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue("--muted").trim();
    u.ctx.setLineDash([4, 4]);
    u.ctx.beginPath();
    u.ctx.moveTo(x, top);
    u.ctx.lineTo(x, top + height);
    u.ctx.stroke();
    u.ctx.restore();
  };
}

/** With no cursor on the chart, its legend reads the tier's own capacity (it read "–" for
every line until hovered). */
function showCurrent(index) {
  return (u) => {
    if (u.cursor.left < 0 && u.legend.idx !== index) u.setLegend({ idx: index });
  };
}

class CurveChart {
  constructor(container) {
    this.plotArea = h("div", { class: "plot" });
    this.empty = h("p", { class: "empty", text: "No sampled stream yet: the worker sends none, "
      + "or its first sample frame has not arrived." });
    this.element = h("figure", { class: "chart", "data-chart": "hit-ratio-curve", "data-empty": "true" },
      h("figcaption", { text: "Hit ratio at other capacities, over the whole sample (dashed: "
        + "the tier's own; a line without a point: a rough guess, too few sampled blocks there)" }),
      this.empty, this.plotArea);
    container.append(this.element);
    this.plot = null;
    this.shape = "";
    /** Per policy, the capacities' indices the sample resolves: only those get a point. */
    this.pointsAt = {};
    /** Per policy, each capacity's standard error in points, from the sample (0 at rate 1). */
    this.errors = {};
    new ResizeObserver(() => this.plot?.setSize({ width: this.width(), height: 240 })).observe(this.plotArea);
  }

  width() {
    return Math.max(240, this.plotArea.clientWidth);
  }

  /** Draw `curve`: the whole sample's lines only (the optimum's window: WindowFigure). */
  update(curve) {
    const dataset = this.element.dataset;
    dataset.empty = String(!curve);
    this.empty.hidden = Boolean(curve);
    this.plotArea.hidden = !curve;
    if (!curve) return;
    const policies = Object.keys(curve.hit_ratios);
    dataset.series = policies.join("|");
    dataset.current = String(curve.current_blocks);
    dataset.curve = JSON.stringify({ capacities: curve.capacities, hit_ratios: curve.hit_ratios });
    this.pointsAt = Object.fromEntries(policies.map((p) => [p, resolvedIndices(curve, p)]));
    dataset.points = JSON.stringify(this.pointsAt);
    this.errors = curve.errors ?? {};
    const data = [curve.capacities, ...policies.map((p) => curve.hit_ratios[p])];
    const shape = `${policies.join("|")}@${curve.capacities.join(",")}`;
    if (shape === this.shape && this.plot) {
      this.plot.setData(data);
      return;
    }
    this.shape = shape;
    this.plot?.destroy();
    const muted = getComputedStyle(document.documentElement).getPropertyValue("--muted").trim();
    const axis = { stroke: muted };
    const percent = (v) => (v === null ? "–" : withUnit(v, "ratio"));
    this.plot = new uPlot({
      width: this.width(),
      height: 240,
      scales: { x: { time: false, distr: 3, log: 2 }, y: { range: (u, min, max) => [0, max > 0 ? Math.min(1, max * 1.15) : 1] } },
      cursor: { drag: { x: false, y: false } },
      axes: [
        // Marked at the curve's own capacities (1/8x to 8x the tier's): uPlot's powers of two
        // put "2,048" under a tier of 2,000 blocks and every point beside a tick of another size.
        // uPlot's own thinning of a log axis blanks ticks counted from the last one, and a
        // blank tick read "0"; the labels below thin themselves around the tier's own.
        { ...axis, label: "capacity (blocks)", splits: () => curve.capacities, filter: (u, splits) => splits,
          values: (u, ticks) => {
            dataset.ticks = JSON.stringify(ticks);
            const labels = spacedLabels(u, ticks, curve.current_index);
            dataset.tickLabels = JSON.stringify(labels);
            return labels;
          } },
        { ...axis, size: 60, values: (u, ticks) => ticks.map(percent) },
      ],
      hooks: {
        draw: [markCurrent(curve.current_blocks), showCurrent(curve.current_index)],
        setCursor: [showCurrent(curve.current_index)],
      },
      plugins: [legendToggles()],
      series: [
        { label: "capacity", value: (u, v) => (v === null ? "–" : withUnit(v, "blocks")) },
        ...policies.map((policy, i) => ({
          label: policy, stroke: colour(i), width: 2,
          value: (u, v, _, at) => {
            if (v === null) return percent(v);
            // The point's standard error from the sample (0 at rate 1: said only where sampled).
            const error = this.errors[policy]?.[at];
            const said = error > 0 ? `${percent(v)} ±${decimal(error)} points` : percent(v);
            return this.pointsAt[policy].includes(at) ? said : `${said} (rough)`;
          },
          points: { show: true, size: 5, filter: () => this.pointsAt[policy] },
        })),
      ],
    }, data, this.plotArea);
  }
}

/** The optimum's window as a figure of its own: the clairvoyant cache beside the tier's
 * policy, both replayed over the window's references from an empty tier of the same size, so
 * each figure stands next to the one it compares with. The curve's figure for the policy
 * (every reference since the stream began) is of another stretch, which a window this short
 * wanders around: the note names it with its own figure, and the curve never shows the
 * window (its point there sat below the tier's own line, an "optimum" under the tier). */
class WindowFigure {
  constructor() {
    this.caption = h("figcaption");
    this.pair = h("dl", { class: "window-pair" });
    this.note = h("p", { class: "detail" });
    this.element = h("figure", { class: "window", id: "insight-window", hidden: true },
      this.caption, this.pair, this.note);
  }

  /** Show publisher `p`'s window (hidden while it has none). */
  update(p) {
    const { optimum, curve, stream } = p;
    this.element.hidden = !optimum;
    if (!optimum) return;
    this.caption.textContent = `Over the last ${counted(optimum.window_refs, "sampled reference")}, `
      + `each replayed from an empty tier of the tier's ${withUnit(p.capacity_blocks, "blocks")}`;
    const policy = optimum.policy === p.policy ? `${optimum.policy}, the tier's policy`
      : `${optimum.policy}, standing in for ${p.policy}`;
    const scale = Math.max(optimum.hit_ratio, optimum.tier_hit_ratio) || 1;
    this.pair.replaceChildren(...[["policy", policy, optimum.tier_hit_ratio],
      ["optimum", "the optimum", optimum.hit_ratio]].flatMap(([series, label, ratio]) => [
      h("dt", { text: label }),
      h("dd", { "data-series": series, "data-ratio": JSON.stringify(ratio) },
        h("meter", { min: 0, max: scale, value: ratio, "aria-label": label }),
        ` ${withUnit(ratio, "ratio")}`),
    ]));
    const since = stream?.since ? `since ${clock(stream.since)}` : "since the stream began";
    const atTier = curve?.hit_ratios[optimum.policy]?.[curve.current_index];
    const whole = atTier === undefined ? "" : ` (there ${optimum.policy} hits `
      + `${withUnit(atTier, "ratio")} at the tier's ${withUnit(curve.current_blocks, "blocks")})`;
    this.note.textContent = (unchained(p) ? "Both read above what the tier hits, each by its own "
      + "amount: the stream's blocks do not form prefix chains (the verdict below). " : "")
      + "These two compare with each other only. The curve below covers every "
      + `sampled reference ${since}${whole}: a window this short, replayed from empty, wanders `
      + "around that.";
  }
}

/** Whether the sidecar says publisher `p`'s stream does not form prefix chains: its sampled
 * hit ratios, the window's too, then read above the tier's by an amount the sample cannot
 * measure, and the API withholds the efficiency. */
function unchained(p) {
  return p.verdicts.some((v) => v.kind === "unchained");
}

/** The capacity axis' labels: every tick's where they fit side by side, else every second's
 * (or third's...) counted from the tier's own, which is always labelled. At 390 px uPlot
 * blanked every second tick from the last, and "500", "2,000" (the tier's) and "8,000" read
 * "0". */
function spacedLabels(u, ticks, current) {
  const labels = ticks.map((t) => count(t));
  if (ticks.length < 2) return labels;
  u.ctx.save();
  u.ctx.font = u.axes[0].font[0];
  const widest = Math.max(...labels.map((l) => u.ctx.measureText(l).width)) / uPlot.pxRatio;
  u.ctx.restore();
  const gap = Math.abs(u.valToPos(ticks.at(-1), "x") - u.valToPos(ticks[0], "x")) / (ticks.length - 1);
  const step = Math.max(1, Math.ceil((widest + 8) / gap));
  return labels.map((l, i) => ((i - current) % step === 0 ? l : ""));
}

/** The indices of `curve`'s capacities the sample resolves for `policy` (all of them where
 * the answer does not say). */
function resolvedIndices(curve, policy) {
  const resolved = curve.resolved?.[policy];
  return curve.capacities.map((_, i) => i).filter((i) => !Array.isArray(resolved) || resolved[i] === true);
}

function mount(panel, context) {
  const picker = h("select", { id: "insight-publisher",
    onchange: () => context.navigate({ publisher: picker.value }) });
  // The sample's counts, which move with every read, only on the page; a failed read aloud.
  const status = h("p", { class: "detail", id: "insight-status" });
  const problem = h("p", { class: "problem", id: "insight-problem", role: "status" });
  const verdicts = h("ul", { id: "insight-verdicts", class: "verdicts" });
  const share = h("span", { class: "value", text: "–" });
  const shareGap = document.createTextNode(" ");
  const shareUnit = h("span", { class: "unit" });
  const efficiency = h("p", { class: "big", id: "insight-efficiency" }, share, shareGap, shareUnit);
  const windowFigure = new WindowFigure();
  const grid = h("div", { class: "charts" });
  const chart = new CurveChart(grid);
  const misses = new TimeChart(grid, {
    id: "miss-reasons", title: "Lost blocks by reason (lookups)", unit: "blocks/s",
    empty: "No lost blocks reported yet: the worker's stats frames carry none.",
  });
  misses.element.append(reasonKey());
  const facts = h("dl", { id: "insight-facts", class: "facts" });
  panel.append(
    h("h2", { class: "visually-hidden", text: "Insight" }),
    h("div", { class: "toolbar" }, h("label", { for: "insight-publisher", text: "Publisher: " }), picker),
    h("section", { class: "card" }, h("h2", { text: "What the numbers say" }), efficiency,
      windowFigure.element, verdicts, status, problem),
    grid,
    h("section", { class: "card" }, h("h2", { text: "Stranded blocks, dead writes, the sample" }), facts),
  );
  let wanted = "";
  let timer = null;
  let unsubscribe = null;

  function showMisses(store) {
    const mine = (series) => series.publisher === panel.dataset.publisher;
    const rates = [...counterRates(store, "miss_blocks", "reason", mine)].sort(reasonOrder);
    misses.update(store.times, rates.map(([reason, values]) => ({ name: reasonLabel(reason), values })));
  }

  function showEfficiency(p) {
    const optimum = p.optimum;
    efficiency.dataset.efficiency = p.efficiency === null ? "" : JSON.stringify(p.efficiency);
    efficiency.dataset.error = p.efficiency_error == null ? "" : JSON.stringify(p.efficiency_error);
    windowFigure.update(p);
    if (p.efficiency === null) {
      share.textContent = "–";
      shareGap.textContent = " ";
      shareUnit.textContent = !optimum ? "of the optimum's hits: its window is still filling"
        : optimum.policy !== p.policy ? `of the optimum's hits: the curve does not simulate ${p.policy}`
          : unchained(p) ? "of the optimum's hits: the sample cannot tell it on a stream whose "
            + "blocks do not form prefix chains"
            : optimum.hit_ratio === 0 ? "the optimum hits no sampled block in its window"
              : "of the optimum's hits: the tier's size is too few sampled blocks to tell (the "
                + "verdicts below say what rate would do)";
      return;
    }
    const [number, unit] = parts(p.efficiency, "ratio");
    share.textContent = number;
    shareGap.textContent = unitGap(unit);
    // Its standard error from the window's sample (0 at rate 1: said only where sampled).
    const error = p.efficiency_error > 0 ? ` ±${decimal(p.efficiency_error)} points` : "";
    shareUnit.textContent = `${unit}${error} of the hits a clairvoyant cache of the same size `
      + "would get, over the window below";
  }

  function fact(term, text, attributes = {}) {
    return [h("dt", { text: term }), h("dd", { text, ...attributes })];
  }

  /** No publisher to show (a sidecar restarted, and none has sent to it yet): nothing of the
   * one shown before stays, under words that say there is none. */
  function clear() {
    picker.replaceChildren();
    delete panel.dataset.publisher;
    Object.assign(efficiency.dataset, { efficiency: "", error: "" });
    [share.textContent, shareGap.textContent, shareUnit.textContent] = ["–", "", ""];
    windowFigure.update({ optimum: null });
    chart.update(null);
    verdicts.replaceChildren();
    facts.replaceChildren();
    if (context.history.times.length) showMisses(context.history);
    status.textContent = "No publisher yet.";
  }

  function render(body) {
    const names = body.publishers.map((p) => p.publisher);
    if (!names.length) {
      clear();
      return;
    }
    fillSelect(picker, names.map((n) => [n, n]), wanted || names[0]);
    const p = body.publishers.find((one) => one.publisher === picker.value);
    const switched = panel.dataset.publisher !== p.publisher;
    panel.dataset.publisher = p.publisher;
    if (switched && context.history.times.length) showMisses(context.history);
    showEfficiency(p);
    chart.update(p.curve);
    // The optimum's verdict says the headline's figure again: the headline alone says it.
    const said = p.verdicts.filter((v) => v.kind !== "optimum");
    verdicts.replaceChildren(...said.map((v) => h("li", {
      text: v.text, "data-kind": v.kind, "data-policy": v.policy ?? "",
    })));
    if (!said.length) verdicts.append(h("li", { class: "empty", text: "Nothing to say yet." }));
    const stream = p.stream;
    status.textContent = stream
      ? `From ${count(stream.sampled_refs)} sampled of ${counted(stream.block_refs, "block reference")} `
        + `(rate ${stream.rate}); ${count(stream.shadow_shed_block_refs)} shed by the shadow queue, `
        + `${count(stream.worker_shed_block_refs)} by the worker; simulations hold `
        + `${withUnit(p.memory.bytes, "bytes")} of ${withUnit(p.memory.max_bytes, "bytes")}.`
      : "This publisher sends no sampled stream (kvscope demo --sample-rate, 0 turns it off).";
    const stranded = Object.entries(p.stranded);
    facts.replaceChildren(
      ...stranded.flatMap(([medium, n]) => fact(`stranded on ${medium}`, withUnit(n, "blocks"),
        { "data-medium": medium, "data-stranded": String(n) })),
      ...fact("dead writes", p.dead_write_ratio === null ? "–"
        : `${withUnit(p.dead_write_ratio, "ratio")} of ${counted(p.stores_completed, "store")}`,
      { id: "insight-dead-writes", "data-ratio": p.dead_write_ratio ?? "" }),
      ...fact("hit ratio measured (every lookup of the tier)", p.measured_hit_ratio === null ? "–" : withUnit(p.measured_hit_ratio, "ratio")),
    );
    panel.dataset.rendered = "true";
  }

  const backoff = new Backoff(PERIOD_MS);
  let polling = false;
  let generation = 0; // moved on by hide(): a read then in flight schedules no next one

  async function tick(mine) {
    let wait = PERIOD_MS;
    try {
      render(await get("insight"));
      backoff.succeeded();
      say(problem, "");
    } catch (error) {
      wait = backoff.failed(error);
      say(problem, `insight unavailable: ${error.message}; trying again in ${Math.ceil(wait / 1000)} s`);
    }
    if (mine === generation) timer = setTimeout(() => tick(mine), wait);
  }

  return {
    show(params) {
      wanted = params.publisher ?? "";
      if (!polling) {
        polling = true;
        tick(generation);
      }
      unsubscribe ??= context.history.subscribe(showMisses);
    },
    hide() {
      clearTimeout(timer);
      polling = false;
      generation += 1;
      unsubscribe?.();
      unsubscribe = null;
    },
  };
}

export default { id: "insight", title: "Insight", mount };
