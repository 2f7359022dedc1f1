// How long a periodic read waits after it failed: twice as long after each failure in a row
// (up to a ceiling), never less than the sidecar's Retry-After, and back to its period after
// a success. A sidecar that is overloaded (503), rate limiting (429) or down is not asked
// once a second by every open page while it recovers.

const CEILING_MS = 30_000;
const RETRY_AFTER_MAX_MS = 300_000; // a Retry-After past this is read as this

export class Backoff {
  constructor(periodMs) {
    this.periodMs = periodMs;
    this.failures = 0;
  }

  /** The read succeeded: the next one comes after the period. */
  succeeded() {
    this.failures = 0;
  }

  /** The read failed with `error` (an ApiError may carry retryAfterS): ms until the next. */
  failed(error) {
    this.failures += 1;
    const doubled = Math.min(CEILING_MS, this.periodMs * 2 ** this.failures);
    const asked = Math.min(RETRY_AFTER_MAX_MS, 1000 * (error?.retryAfterS ?? 0));
    return Math.max(doubled, asked);
  }
}
