// Zooming a chart took a pointer: a drag across the plot narrows its time range to the span
// dragged, and a double-click shows every point again. This plugin gives the plot's keys the
// same, through the same uPlot setScale a drag ends in: + (or =) shows half the points in
// view, - twice as many, and 0 every point. The point the legend reads (the cursor's, else
// the newest in view) stays where it stands on the plot, as a mouse wheel's zoom keeps the
// point under the pointer, so a zoom in narrows the range around it. A screen reader hears
// the range a key shows, in a live region the keys alone write, once each time it changes.
import { h, say } from "./dom.js";
import { clock } from "./format.js";

/** The fewest points a zoom in leaves in view: a line still, not a dot or two. */
const CLOSEST = 10;

/** Half the `shown` points, or as many as CLOSEST leaves (none more than are shown). */
const closer = (shown) => Math.max(Math.ceil(shown / 2), Math.min(CLOSEST, shown));

/** Each key's count of points in view, from the `shown` now and the `all` there are. */
const COUNTS = {
  "+": closer,
  "=": closer, // + without Shift, on a US keyboard
  "-": (shown, all) => Math.min(2 * shown, all),
  "0": (shown, all) => all,
};

/** The plugin, for uPlot's `plugins` option, after keyboardCursor's: the plot it makes a tab
stop and names takes these keys too, and its name says so. */
export function keyboardZoom() {
  const region = h("span", { class: "visually-hidden", role: "status" });

  /** The points in view that `count` (one of COUNTS) wants, the legend's point where it
  stood. */
  function zoom(u, count) {
    const times = u.data[0];
    const [first, last] = u.series[0].idxs;
    const wanted = count(last - first + 1, times.length);
    const at = u.cursor.left >= 0 ? u.cursor.idx ?? last : last;
    // The legend's point stays at its share of the plot's width, as near as whole points go.
    const share = last > first ? (at - first) / (last - first) : 1;
    const start = Math.min(Math.max(at - Math.round(share * (wanted - 1)), 0), times.length - wanted);
    const end = start + wanted - 1;
    if (start === first && end === last) return;
    u.setScale("x", { min: times[start], max: times[end] });
    const range = `${clock(times[start])} to ${clock(times[end])}`;
    say(region, wanted === times.length ? `showing all: ${range}` : `showing ${range}`);
  }

  return {
    hooks: {
      init(u) {
        const plot = u.over;
        const name = plot.getAttribute("aria-label");
        plot.setAttribute("aria-label", `${name}, plus and minus to zoom, zero to show all`);
        u.root.append(region);
        plot.addEventListener("keydown", (event) => {
          // Ctrl and + is the browser's own zoom; Shift is how some keyboards type +.
          if (event.altKey || event.ctrlKey || event.metaKey || !Object.hasOwn(COUNTS, event.key)) return;
          if (u.data[0].length > 1) zoom(u, COUNTS[event.key]); // one point: nothing to zoom
        });
      },
    },
  };
}
