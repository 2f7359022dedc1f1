// Time-series charts drawn by uPlot (vendored: static/vendor/uPlot.iife.min.js defines the
// global `uPlot`): time axes, values with units on the axis, in the legend and under the
// cursor, drag to zoom (double-click to zoom out), a line's name a button that hides or shows
// the line (js/legend_toggles.js), a plot whose cursor the arrow keys move too
// (js/keyboard_cursor.js) and whose keys zoom as a drag does (js/keyboard_zoom.js), cursors
// in step across charts, and one colour per series name on every chart and every load.
// Colours and lines come from the stylesheet's custom properties, so light and dark schemes
// both read.
import { h } from "./dom.js";
import { withUnit, clock, short, unitName } from "./format.js";
import { legendToggles } from "./legend_toggles.js";
import { keyboardCursor } from "./keyboard_cursor.js";
import { keyboardZoom } from "./keyboard_zoom.js";

const PALETTE_SIZE = 8;
/** Series names with a fixed colour (distinct within each chart); any other gets one from a
hash of its name. */
const KNOWN = {
  GPU: 0, CPU: 1, "GPU→CPU": 2, "CPU→GPU": 3, stores: 0, loads: 1, "evicted: capacity": 2,
  "evicted: failed_store": 4, "evicted: clear": 5, "hit ratio": 6, "dead writes": 7,
  "GPU→CPU p50": 2, "GPU→CPU p99": 4, "CPU→GPU p50": 3, "CPU→GPU p99": 5,
  cold: 0, evicted: 1, "not admitted": 2, "in flight": 3, "prefix lost": 4, "no room": 5,
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

/** uPlot's own axis font, named so that the axes' labels are measured in it. */
const AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, '
  + '"Noto Sans", sans-serif';
const AXIS_TEXT = document.createElement("canvas").getContext("2d");
AXIS_TEXT.font = AXIS_FONT;
/** The width of the widest of `texts` in the axis font, in CSS pixels. */
const widest = (texts) => Math.max(...texts.map((text) => AXIS_TEXT.measureText(text).width));

// The time axis writes its own labels. uPlot's wrote a date under a tick's time
// ("11/29/26 2:23pm") but spaced its ticks by the time alone, so that date ran into the next
// tick's label. Here a tick is its time, in the reader's locale as the legend's time is (with
// seconds where the ticks are under a minute apart), and the date goes on the line under it
// only where it tells something: the first tick, and the first of each new day. Ticks stand
// at least the widest label either line can hold apart, so no two labels meet at any width.
const TIME = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" });
const TIME_SECONDS = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit", second: "2-digit" });
const DAY = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
/** The least blank between two neighbouring labels, so that they read as two. */
const LABEL_GAP = 16;

/** The room a tick needs ({minutes, seconds}: where labels have no seconds, and where they
do): the widest label either line can hold, in the axis's font and the reader's locale, of
every hour of a day and every month, whose names and digits differ in width. */
const LABEL_SPACE = (() => {
  const hours = Array.from({ length: 24 }, (_, hour) => new Date(2026, 0, 1, hour, 58, 58));
  const days = Array.from({ length: 12 }, (_, month) => DAY.format(new Date(2026, month, 28)));
  return {
    minutes: Math.max(widest(hours.map((d) => TIME.format(d))), widest(days)) + LABEL_GAP,
    seconds: Math.max(widest(hours.map((d) => TIME_SECONDS.format(d))), widest(days)) + LABEL_GAP,
  };
})();

/** The least room between ticks, for uPlot, which takes the smallest step that leaves it:
the labels' without seconds where even 30 s steps would not leave that (the step is then a
minute or more, and no label has seconds), else the labels' with seconds. */
function labelSpace(u, axisIndex, min, max, plotWidth) {
  return (30 * plotWidth) / (max - min) < LABEL_SPACE.minutes ? LABEL_SPACE.minutes : LABEL_SPACE.seconds;
}

/** uPlot's time steps from a second to a day, then two days and a week (a retention set past
6 h), and the 2 s and 2 min uPlot lacks: without them, a chart whose 1 min ticks would crowd
jumped to 5 min (3 ticks on a quarter hour a window wide, where 2 min gives 7 or 8). None
under a second, since the history's points are whole seconds apart, and a tick between two
of them would repeat its neighbour's label. */
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600,
  43200, 86400, 172800, 604800];

/** Every zone's offset from UTC today is a whole number of quarter hours, so every time a clock
reads a whole hour is a whole quarter hour of unix time. */
const QUARTER_HOUR = 900;

/** Ticks `hours` apart on the reader's clock, from `min` to `max` (unix seconds): each time
the clock reads a whole hour divisible by `hours`. uPlot steps a fixed number of seconds from
its first tick and corrects by an hour where the clocks change, which left ticks two hours
apart on odd hours after a change (3:00, 5:00, 7:00) and gave an hour the change repeats
two ticks that read alike. Here an hour the clocks skip has no tick, and one they repeat has
one, at its first reading on the axis. */
function hourTicks(min, max, hours) {
  const ticks = [];
  let previous = "";
  for (let at = Math.ceil(min / QUARTER_HOUR) * QUARTER_HOUR; at <= max; at += QUARTER_HOUR) {
    const clock = new Date(at * 1000);
    const reading = `${clock.toDateString()} ${clock.getHours()}`;
    if (clock.getMinutes() === 0 && clock.getHours() % hours === 0 && reading !== previous) {
      ticks.push(at);
      previous = reading;
    }
  }
  return ticks;
}

/** The ticks at the least step, from the one uPlot found, that leaves every two neighbours
the room their labels need: of hours (under a day) on the reader's clock (`hourTicks`), else
uPlot's own (`timeTicks`). uPlot finds the step as if every interval were a step long, but
where the clocks change an interval between ticks of hours can be shorter (0:00 to 3:00 on a
day that skips 2:00): the next step up leaves the room there. */
function roomyTicks(timeTicks) {
  return function ticks(u, axisIndex, min, max, step, space) {
    const room = step < 60 ? LABEL_SPACE.seconds : LABEL_SPACE.minutes;
    const ofHours = step % 3600 === 0 && step < 86400;
    const found = ofHours ? hourTicks(min, max, step / 3600) : timeTicks(u, axisIndex, min, max, step, space);
    const crowded = found.some((tick, i) => i > 0 && ((tick - found[i - 1]) * space) / step < room);
    const next = TIME_STEPS.find((larger) => larger > step);
    return crowded && next ? ticks(u, axisIndex, min, max, next, (space * next) / step) : found;
  };
}

/** Wraps uPlot's own time ticks, which it sets on the axis before this hook and exports no
other way. */
function spaceTimeTicks(u) {
  u.axes[0].splits = roomyTicks(u.axes[0].splits);
}

/** Each tick's time, and its date under it where the day is not the previous tick's. */
function timeLabels(u, ticks, axisIndex, space, step) {
  const time = step < 60 ? TIME_SECONDS : TIME;
  return ticks.map((tick, i) => {
    const date = new Date(tick * 1000);
    const sameDay = i > 0 && new Date(ticks[i - 1] * 1000).toDateString() === date.toDateString();
    return sameDay ? time.format(date) : `${time.format(date)}\n${DAY.format(date)}`;
  });
}

/** Half the widest label, centred on its tick: when a tick is the plot's edge (a history
starting or ending on a whole minute), this much of its label stands beyond the plot, over
the y axis on the left and in the padding on the right. */
const LABEL_OVERHANG = Math.ceil((LABEL_SPACE.seconds - LABEL_GAP) / 2) + 4;

/** The y axis' tick and the blank between it and its label (CSS pixels), set on the axis so
that its width counts them. */
const TICK_SIZE = 10;
const TICK_GAP = 5;

/** The y axis' width: its widest tick label as measured, the tick, its blank and a few pixels
to spare, and never less than a time label's overhang, which a narrower axis ("2%") cut off
the canvas. */
function tickWidth(u, values) {
  const labels = values ? Math.ceil(widest(values)) + TICK_SIZE + TICK_GAP + 4 : 50;
  return Math.max(labels, LABEL_OVERHANG);
}

/** The least width a plot keeps for its time axis: three ticks' room, so that a quarter hour
has ticks 5 min apart and six hours 2 h apart. */
const TIME_AXIS_ROOM = 3 * LABEL_SPACE.minutes;

/** The y axis' labels: each value with its unit ("27,447 blocks"), or short ("27.4k") where
those would leave the plot narrower than TIME_AXIS_ROOM: on a phone the unit's name took all
but one time tick's room. The chart's caption names the unit either way. */
function valueLabels(unit) {
  return (u, ticks) => {
    const full = ticks.map((value) => withUnit(value, unit));
    const plot = u.width - tickWidth(u, full) - LABEL_OVERHANG;
    return plot >= TIME_AXIS_ROOM ? full : ticks.map((value) => short(value, unit));
  };
}

/** The time scale: the history's span, and a minute around a history of one point, where
uPlot's own span is a day counted in milliseconds (a thousand days in seconds), past every
step above, and the axis had no tick at all. */
function timeRange(u, min, max) {
  return u.data[0].length === 1 ? [min - 30, min + 30] : [min, max];
}

/** The time axis as drawn, on the chart's element: its font, the room ticks keep
(LABEL_SPACE), the span shown (unix seconds, zoomed or not), ticks (unix seconds), their
places (CSS pixels from the canvas's left edge), labels and the canvas's width, so that a
test reads the span a zoom left and measures the labels where the browser drew them. */
function keepTimeAxis(element) {
  return (u) => {
    const { _splits: ticks, _values: labels } = u.axes[0];
    element.dataset.timeAxis = JSON.stringify({
      font: AXIS_FONT, room: LABEL_SPACE, shown: [u.scales.x.min, u.scales.x.max], ticks, labels,
      width: u.width, at: ticks.map((tick) => u.valToPos(tick, "x", true) / uPlot.pxRatio),
    });
  };
}

/** With no cursor on the chart, its legend shows the newest values (hover shows any other). */
function showLatest(u) {
  if (u.cursor.left < 0 && u.legend.idx !== u.data[0].length - 1) u.setLegend({ idx: u.data[0].length - 1 });
}

/** A line's name in the legend, where it is the button that hides the line: a blank one
(a worker's label value "" or spaces) as words, so that the button has a name to show and to
be read by. */
function legendName(name) {
  if (name === "") return "(blank)";
  return name.trim() ? name : JSON.stringify(name); // white space alone, quoted: " " and "  " differ
}

const charts = new Set();
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
  charts.forEach((chart) => chart.rebuild());
});

export class TimeChart {
  /** A chart in `container` ({title, unit, empty}: its heading, unit and no-data text); the
  heading names the unit, which short y-axis labels leave out. */
  constructor(container, { id, title, unit, empty }) {
    this.title = title;
    this.unit = unit;
    this.empty = h("p", { class: "empty", text: empty });
    this.plotArea = h("div", { class: "plot" });
    this.element = h("figure", { class: "chart", "data-chart": id, "data-empty": "true" },
      h("figcaption", {}, title, h("span", { class: "unit", text: `, in ${unitName(unit)}` })),
      this.empty, this.plotArea);
    container.append(this.element);
    this.plot = null;
    this.names = [];
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
    // A copy: the history store extends its times in place, which grew the plot's own
    // before zoomed() compared its scale with them, so every chart read as zoomed in and kept
    // the time range it was built with as new points came.
    this.data = [times.slice(), ...shown.map((line) => line.values)];
    const names = shown.map((line) => line.name);
    const renamed = names.length !== this.names.length || names.some((name, i) => name !== this.names[i]);
    this.names = names;
    if (!shown.length) return;
    if (renamed || !this.plot) {
      this.rebuild();
    } else {
      this.plot.setData(this.data, !this.zoomed());
    }
  }

  zoomed() {
    const { min, max } = this.plot.scales.x;
    const times = this.plot.data[0];
    return times.length > 1 && (min > times[0] || max < times.at(-1));
  }

  rebuild() {
    // A line may be named "" (a worker's empty label value): only no line at all is nothing
    // to draw. Its chart once stayed blank, neither plot nor note, whenever "" came first.
    if (!this.data || !this.names.length) return;
    // A new plot replaces the focused one (a line added, the colour scheme changed): the
    // keyboard's place moves to it, not back to the top of the page.
    const focused = this.plot?.over === document.activeElement;
    this.plot?.destroy();
    const colours = theme();
    const format = (value) => (value === null ? "–" : withUnit(value, this.unit));
    const axis = {
      stroke: colours.axis, font: AXIS_FONT, grid: { stroke: colours.grid },
      ticks: { stroke: colours.grid, size: TICK_SIZE }, gap: TICK_GAP,
    };
    const options = {
      width: Math.max(200, this.plotArea.clientWidth),
      height: 200,
      cursor: { sync: { key: "kvscope" }, drag: { x: true, y: false } },
      scales: { x: { time: true, range: timeRange }, y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max : 1] } },
      padding: [null, LABEL_OVERHANG, null, null],
      axes: [
        { ...axis, space: labelSpace, incrs: TIME_STEPS, values: timeLabels },
        { ...axis, size: tickWidth, values: valueLabels(this.unit) },
      ],
      hooks: {
        init: [spaceTimeTicks], draw: [showLatest, keepTimeAxis(this.element)], setCursor: [showLatest],
      },
      plugins: [legendToggles(), keyboardCursor(this.title), keyboardZoom()],
      series: [
        { label: "time", value: (u, ts) => (ts === null ? "–" : clock(ts)) },
        ...this.names.map((name) => ({
          label: legendName(name), stroke: colours.colour(name), width: 1.5, value: (u, v) => format(v),
          points: { show: false },
        })),
      ],
    };
    this.plot = new uPlot(options, this.data, this.plotArea);
    if (focused) this.plot.over.focus();
  }

  resize() {
    if (this.plot && this.plotArea.clientWidth > 0) {
      this.plot.setSize({ width: this.plotArea.clientWidth, height: 200 });
    }
  }
}
