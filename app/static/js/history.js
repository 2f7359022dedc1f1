// The sidecar's aggregates over time: /api/v1/history loaded when a chart is first shown
// (so a page opened late draws the past at once), then extended with the points that
// follow (`since` the newest one held), and trimmed to what the sidecar itself keeps.
import { get } from "./api.js";
import { Backoff } from "./backoff.js";
import { HISTORY_PHASE_MS, untilPhase } from "./schedule.js";

/** How far back each choice of range reaches, and at which of the sidecar's resolutions. */
export const RANGES = {
  "15m": { resolution: 1, label: "15 min, 1 s points" },
  "6h": { resolution: 10, label: "6 h, 10 s points" },
};

function seriesKey(series) {
  const labels = Object.entries(series.labels).sort().map(([k, v]) => `${k}=${v}`);
  return `${series.publisher ?? ""}\u0000${series.metric}\u0000${labels.join(",")}`;
}

export class HistoryStore {
  /** `after`: a promise the first load waits for (the first stats read), so the two first
   * reads reach the sidecar one after the other. */
  constructor(after = Promise.resolve()) {
    this.after = after;
    this.resolution = RANGES["15m"].resolution;
    this.times = [];
    this.series = new Map(); // key -> {publisher, metric, labels, kind, values}
    this.maxPoints = Infinity;
    this.listeners = new Set();
    this.timer = null;
    this.generation = 0;
    /** Why the last read failed and when the next goes out ({message, retryS}), or null. */
    this.problem = null;
  }

  /** Call `listener(store)` after every change while subscribed; returns the unsubscribe. */
  subscribe(listener) {
    this.listeners.add(listener);
    if (this.listeners.size === 1) this.start();
    else if (this.times.length) listener(this);
    return () => {
      this.listeners.delete(listener);
      if (!this.listeners.size) this.stop();
    };
  }

  /** Switch to `resolution` seconds per point: everything is loaded again at that one. */
  setResolution(resolution) {
    if (resolution === this.resolution) return;
    this.resolution = resolution;
    this.times = [];
    this.series = new Map();
    if (this.listeners.size) {
      this.stop();
      this.start();
    }
  }

  start() {
    const generation = ++this.generation;
    const backoff = new Backoff(1000 * this.resolution);
    const tick = async () => {
      await this.after;
      let wait;
      try {
        await this.fetch();
        backoff.succeeded();
        wait = untilPhase(1000 * this.resolution, HISTORY_PHASE_MS);
      } catch (error) {
        wait = backoff.failed(error);
        this.problem = { message: error.message, retryS: Math.ceil(wait / 1000) };
        this.listeners.forEach((listener) => listener(this)); // to say so where the charts are
      }
      if (generation === this.generation) this.timer = setTimeout(tick, wait);
    };
    tick();
  }

  stop() {
    this.generation += 1;
    clearTimeout(this.timer);
  }

  async fetch() {
    const newest = this.times.at(-1);
    // Points start on whole seconds; half a step past the newest asks for the next ones only.
    const since = newest === undefined ? null : newest + this.resolution / 2;
    const resolution = this.resolution;
    const answer = await get("history", { since, resolution });
    if (resolution !== this.resolution) return; // the range changed meanwhile
    this.problem = null; // before the listeners hear of this answer, not after them
    this.merge(answer);
    this.listeners.forEach((listener) => listener(this));
  }

  merge(answer) {
    const index = answer.resolutions_s.indexOf(answer.resolution_s);
    this.maxPoints = Math.ceil(answer.retention_s[index] / answer.resolution_s);
    const held = this.times.length;
    const added = answer.times.length;
    const seen = new Set();
    for (const series of answer.series) {
      const key = seriesKey(series);
      seen.add(key);
      let kept = this.series.get(key);
      if (!kept) {
        kept = { ...series, values: new Array(held).fill(null) };
        this.series.set(key, kept);
      }
      kept.values.push(...series.values);
    }
    for (const [key, kept] of this.series) {
      if (!seen.has(key)) kept.values.push(...new Array(added).fill(null));
    }
    this.times.push(...answer.times);
    const extra = this.times.length - this.maxPoints;
    if (extra > 0) {
      this.times.splice(0, extra);
      for (const kept of this.series.values()) kept.values.splice(0, extra);
    }
  }

  /** The series of `metric` (every publisher's), optionally only those `where` accepts. */
  select(metric, where = () => true) {
    return [...this.series.values()].filter((s) => s.metric === metric && where(s));
  }
}

/** Point by point, the sum of the known values (null where none is known). */
export function sum(columns, length) {
  const total = new Array(length).fill(null);
  for (const values of columns) {
    values.forEach((value, i) => {
      if (value !== null) total[i] = (total[i] ?? 0) + value;
    });
  }
  return total;
}

/** Point by point, the largest known value: a worst case across publishers (latencies). */
export function max(columns, length) {
  const top = new Array(length).fill(null);
  for (const values of columns) {
    values.forEach((value, i) => {
      if (value !== null && (top[i] === null || value > top[i])) top[i] = value;
    });
  }
  return top;
}

/** A counter's increase into each point (a drop is a restart: counted from zero). */
export function increases(values) {
  return values.map((value, i) => {
    const before = values[i - 1];
    if (i === 0 || value === null || before === null || before === undefined) return null;
    return value >= before ? value - before : value;
  });
}

/** Per second: a counter's increase into each point over the time the point covers. */
export function perSecond(values, times) {
  return increases(values).map((delta, i) => (delta === null ? null : delta / (times[i] - times[i - 1])));
}

/** Grouped by one label (every series in one group without it): label value -> series. */
export function byLabel(series, label) {
  const groups = new Map();
  for (const one of series) {
    const name = one.labels[label] ?? "";
    if (!groups.has(name)) groups.set(name, []);
    groups.get(name).push(one);
  }
  return groups;
}

/** A gauge summed across publishers, per value of `label`: label value -> values. */
export function gaugeTotals(store, metric, label) {
  const groups = byLabel(store.select(metric), label);
  const length = store.times.length;
  return new Map([...groups].map(([name, all]) => [name, sum(all.map((s) => s.values), length)]));
}

/** A counter's rate per second, each publisher's summed, per value of `label` (of the series
 * `where` accepts: every one unless given). */
export function counterRates(store, metric, label, where) {
  const groups = byLabel(store.select(metric, where), label);
  const { times } = store;
  const rate = (s) => perSecond(s.values, times);
  return new Map([...groups].map(([name, all]) => [name, sum(all.map(rate), times.length)]));
}
