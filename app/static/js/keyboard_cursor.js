// Reading a chart's past values took a pointer: hovering moves uPlot's cursor, and the legend
// shows that instant's values. This plugin makes the plot a tab stop whose keys move the same
// cursor through uPlot's own setCursor, a point at a time (Left, Right; Home and End: the first
// and last point in view; Escape: back to the newest values), so the legend, and the charts in
// step with this one, read as they do under a pointer. A point's place is not rounded to a
// pixel, so the keys reach every point even where points stand closer than a pixel apart.

/** Each key's move: the index it puts the cursor on from the index `at` it is on. */
const MOVES = {
  ArrowLeft: (at) => at - 1,
  ArrowRight: (at) => at + 1,
  Home: () => 0,
  End: () => Infinity,
};

/** uPlot's own place for a cursor with no pointer on the chart: off the plot. */
const OFF = -10;

/** The plugin, for uPlot's `plugins` option, on a chart headed `title`. */
export function keyboardCursor(title) {
  // The time the keys put the cursor on, until a pointer moves it or focus leaves: new points
  // and a zoom move the plot under a cursor, which would otherwise stand on another time.
  let held = null;

  /** The cursor on point `index`, or the nearest in view, and the charts in step with it. */
  function place(u, index) {
    const [first, last] = u.series[0].idxs;
    held = u.data[0][Math.min(Math.max(index, first), last)];
    u.setCursor({ left: u.valToPos(held, "x"), top: u.over.clientHeight / 2 }, true, true);
  }

  function release(u) {
    held = null;
    u.setCursor({ left: OFF, top: OFF }, true, true);
  }

  return {
    hooks: {
      init(u) {
        const plot = u.over;
        plot.tabIndex = 0;
        plot.setAttribute("role", "group");
        plot.setAttribute("aria-label", `${title}: use left and right arrow keys to read earlier values`);
        plot.addEventListener("keydown", (event) => {
          // Alt+Left is the browser's Back, and other chords are someone else's too.
          if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
          if (Object.hasOwn(MOVES, event.key)) {
            place(u, MOVES[event.key](u.cursor.idx ?? u.series[0].idxs[1]));
          } else if (event.key === "Escape" && held !== null) {
            release(u);
          } else {
            return;
          }
          event.preventDefault(); // the arrows and Home/End would scroll the page too
        });
        plot.addEventListener("blur", () => {
          if (held !== null) release(u);
        });
      },
      draw(u) {
        if (held !== null) place(u, u.valToIdx(held));
      },
      setCursor(u) {
        if (held !== null && u.data[0][u.cursor.idx] !== held) held = null; // a pointer moved it
      },
    },
  };
}
