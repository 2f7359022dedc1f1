// When the page's periodic reads go out: each on its own phase of the second, so the stats
// and history reads never queue behind each other at the sidecar.

/** Milliseconds from now to the next instant that is `phaseMs` past a multiple of `periodMs`. */
export function untilPhase(periodMs, phaseMs) {
  const wait = (((phaseMs - Date.now()) % periodMs) + periodMs) % periodMs;
  return wait || periodMs;
}

/** The stats read's phase; the history read goes out half a second after it. */
export const STATS_PHASE_MS = 0;
export const HISTORY_PHASE_MS = 500;
