// When the page's periodic reads go out: each on its own phase of the second, so the stats
// and history reads never queue behind each other at the sidecar, and at a phase drawn per
// page load, so they do not all land on the whole second, when the sidecar does its own
// once-a-second work (the history's sample; workers send their stats frames then too).

/** Milliseconds from now to the next instant that is `phaseMs` past a multiple of `periodMs`. */
export function untilPhase(periodMs, phaseMs) {
  const wait = (((phaseMs - Date.now()) % periodMs) + periodMs) % periodMs;
  return wait || periodMs;
}

/** The stats read's phase, away from the whole second; the history read half a second on. */
export const STATS_PHASE_MS = 100 + Math.floor(Math.random() * 300);
export const HISTORY_PHASE_MS = STATS_PHASE_MS + 500;
