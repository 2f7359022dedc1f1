// Time-series charts drawn by uPlot (vendored: static/vendor/uPlot.iife.min.js defines the
// global `uPlot`): time axes, values with units on the axis, in the legend and under the
// cursor, drag to zoom (double-click to zoom out), cursors in step across charts, and one
// colour per series name on every chart and every load. Colours and lines come from the
// stylesheet's custom properties, so light and dark schemes both read.
import { h } from "./dom.js";
import { withUnit, clock } from "./format.js";

const PALETTE_SIZE = 8;
/** Series names with a fixed colour (distinct within each chart); any other gets one from a
hash of its name. */
const KNOWN = {
  GPU: 0, CPU: 1, "GPU→CPU": 2, "CPU→GPU": 3, stores: 0, loads: 1, "evicted: capacity": 2,
  "evicted: failed_store": 4, "evicted: clear": 5, "hit ratio": 6, "dead writes": 7,
  "GPU→CPU p50": 2, "GPU→CPU p99": 4, "CPU→GPU p50": 3, "CPU→GPU p99": 5,
  cold: 0, evicted: 1, not_admitted: 2, in_flight: 3, prefix_lost: 4,
};

function colourIndex(name) {
  if (Object.hasOwn(KNOWN, name)) return KNOWN[name];
  let hash = 0;
  for (const char of name) hash = (hash * 31 + char.codePointAt(0)) >>> 0;
  return hash % PALETTE_SIZE;
}

function theme() {
  const style = getComputedStyle(document.documentElement);
  const read = (name) => style.getPropertyValue(name).trim();
  return {
    axis: read("--muted"),
    grid: read("--grid"),
    colour: (name) => read(`--series-${colourIndex(name) + 1}`),
  };
}

/** uPlot's own axis font, named so that the date's width below is measured in it. */
const AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, '
  + '"Noto Sans", sans-serif';

/** Half the widest date uPlot writes under a time axis's first tick ("12/31/26 12:59pm"),
centred on it: when that tick is the plot's left edge (a history starting on a whole minute),
this much of it stands left of the plot, over the y axis. */
const DATE_OVERHANG = (() => {
  const context = document.createElement("canvas").getContext("2d");
  context.font = AXIS_FONT;
  return Math.ceil(context.measureText("12/31/26 12:59pm").width / 2) + 4;
})();

/** The y axis' width: its longest tick label (about 7 px a character) and the tick itself,
and never less than the date's overhang, which a narrower axis ("2 %") cut off the canvas. */
function tickWidth(u, values) {
  const labels = values ? 24 + 7 * Math.max(...values.map((text) => text.length)) : 50;
  return Math.max(labels, DATE_OVERHANG);
}

/** With no cursor on the chart, its legend shows the newest values (hover shows any other). */
function showLatest(u) {
  if (u.cursor.left < 0 && u.legend.idx !== u.data[0].length - 1) u.setLegend({ idx: u.data[0].length - 1 });
}

const charts = new Set();
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
  charts.forEach((chart) => chart.rebuild());
});

export class TimeChart {
  /** A chart in `container` ({title, unit, empty}: its heading, unit and no-data text). */
  constructor(container, { id, title, unit, empty }) {
    this.unit = unit;
    this.empty = h("p", { class: "empty", text: empty });
    this.plotArea = h("div", { class: "plot" });
    this.element = h("figure", { class: "chart", "data-chart": id, "data-empty": "true" },
      h("figcaption", { text: title }), this.empty, this.plotArea);
    container.append(this.element);
    this.plot = null;
    this.names = "";
    this.data = null;
    new ResizeObserver(() => this.resize()).observe(this.plotArea);
    charts.add(this);
  }

  /** Draw `times` (unix seconds) against `lines` ([{name, values}]); keeps a zoom in place. */
  update(times, lines) {
    const shown = lines.filter((line) => line.values.some((v) => v !== null));
    const first = shown.length ? times.findIndex((_, i) => shown.some((l) => l.values[i] !== null)) : -1;
    const dataset = this.element.dataset;
    dataset.empty = String(!shown.length);
    dataset.series = shown.map((line) => line.name).join("|");
    dataset.points = String(times.length);
    dataset.firstTs = first >= 0 ? String(times[first]) : "";
    dataset.lastTs = times.length ? String(times.at(-1)) : "";
    this.empty.hidden = shown.length > 0;
    this.plotArea.hidden = !shown.length;
    this.data = [times, ...shown.map((line) => line.values)];
    const names = shown.map((line) => line.name).join("\u0000");
    if (!shown.length) return;
    if (names !== this.names || !this.plot) {
      this.names = names;
      this.rebuild(shown.map((line) => line.name));
    } else {
      this.plot.setData(this.data, !this.zoomed());
    }
  }

  zoomed() {
    const { min, max } = this.plot.scales.x;
    const times = this.plot.data[0];
    return times.length > 1 && (min > times[0] || max < times.at(-1));
  }

  rebuild(names = this.names.split("\u0000")) {
    if (!this.data || !names[0]) return;
    this.plot?.destroy();
    const colours = theme();
    const format = (value) => (value === null ? "–" : withUnit(value, this.unit));
    const axis = {
      stroke: colours.axis, font: AXIS_FONT, grid: { stroke: colours.grid }, ticks: { stroke: colours.grid },
    };
    const options = {
      width: Math.max(200, this.plotArea.clientWidth),
      height: 200,
      cursor: { sync: { key: "kvscope" }, drag: { x: true, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max : 1] } },
      axes: [axis, { ...axis, size: tickWidth, values: (u, ticks) => ticks.map(format) }],
      hooks: { draw: [showLatest], setCursor: [showLatest] },
      series: [
        { label: "time", value: (u, ts) => (ts === null ? "–" : clock(ts)) },
        ...names.map((name) => ({
          label: name, stroke: colours.colour(name), width: 1.5, value: (u, v) => format(v),
          points: { show: false },
        })),
      ],
    };
    this.plot = new uPlot(options, this.data, this.plotArea);
  }

  resize() {
    if (this.plot && this.plotArea.clientWidth > 0) {
      this.plot.setSize({ width: this.plotArea.clientWidth, height: 200 });
    }
  }
}
