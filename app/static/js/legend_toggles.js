// uPlot hides or shows a chart's line when its name in the legend is clicked, a listener on
// the name's table cell, which no key reaches. This plugin puts each name in a button: Tab
// reaches it, Enter and Space press it (the click goes on to uPlot's listener on the cell),
// and aria-pressed says whether its line is shown.

function pressed(u) {
  u.root.querySelectorAll(".u-toggle").forEach((button) => {
    button.setAttribute("aria-pressed", String(u.series[Number(button.dataset.series)].show));
  });
}

/** The plugin, for uPlot's `plugins` option. */
export function legendToggles() {
  return {
    hooks: {
      init(u) {
        u.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
          if (i === 0) return; // the x values: uPlot toggles no line there
          const cell = row.querySelector("th");
          const button = document.createElement("button");
          Object.assign(button, { type: "button", className: "u-toggle" });
          button.dataset.series = String(i);
          button.append(...cell.childNodes);
          cell.append(button);
        });
        pressed(u);
      },
      setSeries: pressed,
    },
  };
}
