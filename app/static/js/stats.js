// /api/v1/stats, read every second (one request at a time) and handed to every view
// that listens; the header says when the page last heard from the sidecar.
import { get } from "./api.js";
import { STATS_PHASE_MS, untilPhase } from "./schedule.js";

const PERIOD_MS = 1000;

export class StatsPoller {
  constructor(status) {
    this.status = status;
    this.latest = null;
    this.listeners = new Set();
    /** Settles once the first read has answered (or failed): the page's other first reads
     * wait for it, so the sidecar gets them one at a time, not all at once. */
    this.firstRead = new Promise((resolve) => (this.settleFirstRead = resolve));
  }

  /** Call `listener(stats)` now (when read once) and after every read; returns the unsubscribe. */
  subscribe(listener) {
    this.listeners.add(listener);
    if (this.latest) listener(this.latest);
    return () => this.listeners.delete(listener);
  }

  start() {
    const tick = async () => {
      try {
        this.latest = await get("stats");
        this.status.textContent = `updated ${new Date().toLocaleTimeString()}`;
        this.status.dataset.state = "ok";
        this.listeners.forEach((listener) => listener(this.latest));
      } catch (error) {
        this.status.textContent = `stats unavailable: ${error.message}`;
        this.status.dataset.state = "error";
      }
      this.settleFirstRead();
      setTimeout(tick, untilPhase(PERIOD_MS, STATS_PHASE_MS));
    };
    tick();
  }
}

/** The media the sidecar reports, GPU first, then CPU, then any other by name. */
export function mediaOf(stats) {
  const order = (name) => ["GPU", "CPU"].indexOf(name) >>> 0; // unknown names sort last
  return Object.keys(stats.blocks_by_medium).sort((a, b) => order(a) - order(b) || a.localeCompare(b));
}
