// /api/v1/stats, read every second (one request at a time) and handed to every view
// that listens; the header says when the page last heard from the sidecar, or why it
// did not and when it asks again (later after each failure: js/backoff.js). A screen
// reader hears only the state: the stats arriving, or why not, once each time it changes.
import { get } from "./api.js";
import { Backoff } from "./backoff.js";
import { say } from "./dom.js";
import { STATS_PHASE_MS, untilPhase } from "./schedule.js";

const PERIOD_MS = 1000;

export class StatsPoller {
  /** `status`: the header's words, rewritten each read; `announcer`: a live region. */
  constructor(status, announcer) {
    this.status = status;
    this.announcer = announcer;
    this.latest = null;
    this.listeners = new Set();
    this.backoff = new Backoff(PERIOD_MS);
    /** Settles once the first read has answered (or failed): the page's other first reads
     * wait for it, so the sidecar gets them one at a time, not all at once. */
    this.firstRead = new Promise((resolve) => (this.settleFirstRead = resolve));
  }

  /** Call `listener(stats)` now (when read once) and after every read; returns the unsubscribe. */
  subscribe(listener) {
    this.listeners.add(listener);
    if (this.latest) this.hand(listener, this.latest);
    return () => this.listeners.delete(listener);
  }

  /** A view that cannot show an answer (one of a shape it does not know) says so in the
   * header; the other views still get it, and the next answer is tried as usual. */
  hand(listener, stats) {
    try {
      listener(stats);
    } catch (error) {
      this.show("error", `stats not shown: ${error.message}`);
    }
  }

  /** `text` in the header (with when the page asks again, `retryS`); the state aloud. */
  show(state, text, retryS = "") {
    this.status.textContent = retryS ? `${text}; trying again in ${retryS} s` : text;
    say(this.announcer, state === "ok" ? "stats arriving" : text);
    Object.assign(this.status.dataset, { state, retryS, failures: String(this.backoff.failures) });
  }

  start() {
    const tick = async () => {
      let wait;
      try {
        const stats = await get("stats");
        this.backoff.succeeded();
        wait = untilPhase(PERIOD_MS, STATS_PHASE_MS);
        this.latest = stats;
        this.show("ok", `updated ${new Date().toLocaleTimeString()}`);
        this.listeners.forEach((listener) => this.hand(listener, stats));
      } catch (error) {
        wait = this.backoff.failed(error);
        const seconds = String(Math.ceil(wait / 1000));
        this.show("error", `stats unavailable: ${error.message}`, seconds);
      }
      this.settleFirstRead();
      setTimeout(tick, wait);
    };
    tick();
  }
}

/** The media the sidecar reports, GPU first, then CPU, then any other by name. */
export function mediaOf(stats) {
  const order = (name) => ["GPU", "CPU"].indexOf(name) >>> 0; // unknown names sort last
  return Object.keys(stats.blocks_by_medium).sort((a, b) => order(a) - order(b) || a.localeCompare(b));
}
