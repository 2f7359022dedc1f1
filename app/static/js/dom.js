// Building the page's elements. Text always goes in as textContent (never HTML): block
// hashes, publisher names and error messages come from outside the page.

/** An element with attributes (`class`, `data-*`, `aria-*`, properties) and children. */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") element.textContent = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name in element && !name.includes("-")) element[name] = value;
    else element.setAttribute(name, value === true ? "" : value);
  }
  element.append(...children.flat().filter((child) => child !== null && child !== undefined));
  return element;
}

/** Write `text` into a live region (role="status") only where it says something else: a
screen reader reads out every write, the same words again too, and regions rewritten on each
poll read out the clock, the counts and the same summary every second. */
export function say(region, text) {
  if (region.textContent !== text) region.textContent = text;
}

/** A table with a header row; returns the table and its body. */
export function table(headers, attributes = {}) {
  const body = h("tbody");
  const head = h("thead", {}, h("tr", {}, headers.map((text) => h("th", { scope: "col", text }))));
  return [h("table", attributes, head, body), body];
}

/** A <select> of `choices` ([value, label] pairs) keeping `value` selected when offered. */
export function fillSelect(select, choices, value) {
  const options = choices.map(([v, label]) => h("option", { value: v, text: label }));
  select.replaceChildren(...options);
  select.value = choices.some(([v]) => v === value) ? value : choices[0][0];
}
