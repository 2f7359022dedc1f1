// Blocks: look one block up by its hash (decimal for an int hash, 0x and hex for bytes, as
// the API reads them) and see where it is held, per tier; paste a prompt's hash chain and
// see how long a run of it each tier holds; page through the index, filtered by medium
// and publisher. The search, the filters and the page are in the URL.
import { get, post } from "../api.js";
import { fillSelect, h, table } from "../dom.js";
import { age, count, counted, dateTime } from "../format.js";
import { formatHash } from "../router.js";
import { mediaOf } from "../stats.js";

const PAGE = 50;
// Requests one page of the view makes at most: each examines a bounded stretch of the
// index (a filter few blocks match may find none in it), so the view asks again after
// the cursor until it has a page's worth, and past this leaves the rest to Next.
const ASKS = 16;

function field(label, control) {
  return h("label", { class: "field" }, h("span", { text: label }), control);
}

function describe(block, media, now) {
  const held = new Set(block.media);
  const rows = [
    ["hash", block.block_hash],
    ...media.map((medium) => [medium, held.has(medium) ? "held" : "not held"]),
    ["publishers", block.publishers.join(", ") || "–"],
    ["block size", block.block_size === null ? "–" : counted(block.block_size, "token")],
    ["hits (loads back to the GPU)", count(block.hits)],
    ["first stored", `${dateTime(block.first_stored)} (${age(now - block.first_stored)} ago)`],
    ["last stored", `${dateTime(block.last_stored)} (${age(now - block.last_stored)} ago)`],
  ];
  return h("dl", { class: "facts", "data-held": block.media.join("|"), "data-seq": String(block.seq) },
    rows.flatMap(([term, value]) => [h("dt", { text: term }), h("dd", { text: value })]));
}

function runs(answer, length) {
  const tiers = Object.entries(answer.runs).map(([medium, run]) => h("li", { "data-medium": medium,
    "data-run": String(run) }, h("span", { class: "tier", text: medium }),
  h("meter", { min: 0, max: Math.max(1, length), value: run, "aria-label": `${medium} run` }),
  ` ${count(run)} of ${counted(length, "block")}`));
  const through = answer.break_index === length ? "every block is held somewhere"
    : `block ${count(answer.break_index)} (counting from 0) is held nowhere`;
  return [h("p", { "data-break": String(answer.break_index),
    text: `A chain of ${counted(length, "block")}: ${through}. The leading run held on each tier:` }),
  h("ul", { class: "runs" }, tiers)];
}

function mount(panel, { stats, navigate }) {
  let params = {};
  let media = [];
  let loaded = null;
  let trail = [];

  const query = h("input", { id: "block-query", type: "search", spellcheck: false, autocomplete: "off",
    placeholder: "12345 or 0x9f00…", required: true });
  const found = h("div", { id: "block-result", role: "status" });
  const search = h("form", { class: "inline", onsubmit: (event) => {
    event.preventDefault();
    navigate({ ...params, q: query.value.trim() });
  } }, field("Block hash", query), h("button", { type: "submit", text: "Find" }));

  const chain = h("textarea", { id: "lookup-hashes", rows: 3, spellcheck: false,
    placeholder: "a prompt's block hashes in order, separated by spaces, commas or new lines" });
  const matched = h("div", { id: "lookup-result", role: "status" });
  const lookup = h("form", { onsubmit: async (event) => {
    event.preventDefault();
    const hashes = chain.value.split(/[\s,]+/).filter(Boolean);
    matched.replaceChildren(h("p", { text: "looking up…" }));
    try {
      matched.replaceChildren(...runs(await post("lookup", { block_hashes: hashes }), hashes.length));
    } catch (error) {
      matched.replaceChildren(h("p", { class: "problem", text: error.message }));
    }
  } }, field("Hash chain", chain), h("button", { type: "submit", text: "Look up" }));

  const medium = h("select", { id: "filter-medium", onchange: () => refilter() });
  const publisher = h("select", { id: "filter-publisher", onchange: () => refilter() });
  const [listing, body] = table(["hash", "held on", "publishers", "block size", "hits", "first stored",
    "last stored"], { id: "blocks-table" });
  const position = h("span", { class: "detail", role: "status" });
  const first = h("button", { type: "button", text: "First page", onclick: () => {
    trail = [];
    navigate({ ...params, cursor: "" });
  } });
  const previous = h("button", { type: "button", text: "Previous", onclick: () => {
    navigate({ ...params, cursor: trail.pop() ?? "" });
  } });
  const next = h("button", { type: "button", text: "Next", onclick: () => {
    trail.push(params.cursor ?? "");
    navigate({ ...params, cursor: next.dataset.cursor });
  } });

  panel.append(
    h("div", { class: "columns" },
      h("section", { class: "card" }, h("h2", { text: "Find a block" }), search, found),
      h("section", { class: "card" }, h("h2", { text: "Prefix lookup" }), lookup, matched)),
    h("section", { class: "card" }, h("h2", { text: "Index" }),
      h("div", { class: "toolbar" }, field("Medium", medium), field("Publisher", publisher),
        h("button", { type: "button", text: "Refresh", onclick: () => load(true) })),
      h("div", { class: "scroll" }, listing),
      h("div", { class: "toolbar" }, first, previous, next, position)),
  );

  function refilter() {
    trail = [];
    navigate({ ...params, medium: medium.value, publisher: publisher.value, cursor: "" });
  }

  function offer(select, names, label, chosen) {
    const choices = [["", `every ${label}`], ...[...new Set([...names, chosen].filter(Boolean))]
      .map((name) => [name, name])];
    fillSelect(select, choices, chosen ?? "");
  }

  function fillFilters(s) {
    media = mediaOf(s);
    offer(medium, media, "medium", params.medium);
    offer(publisher, s.publishers.map((p) => p.name), "publisher", params.publisher);
  }

  async function find(text) {
    query.value = text ?? "";
    if (!text) return found.replaceChildren();
    found.replaceChildren(h("p", { text: "looking…" }));
    try {
      const block = await get(`blocks/${encodeURIComponent(text)}`);
      const known = [...new Set([...media, ...block.media])];
      found.replaceChildren(describe(block, known, Date.now() / 1000));
    } catch (error) {
      const message = error.status === 404 ? `${text} is not indexed (held on no tier).` : error.message;
      found.replaceChildren(h("p", { class: "problem", "data-missing": "true", text: message }));
    }
  }

  async function load(force = false) {
    const wanted = { medium: params.medium, publisher: params.publisher, cursor: params.cursor, limit: PAGE };
    const key = JSON.stringify(wanted);
    if (key === loaded && !force) return;
    loaded = key;
    try {
      const blocks = [];
      let cursor = params.cursor;
      for (let asked = 0; asked < ASKS && cursor !== null && blocks.length < PAGE; asked += 1) {
        const page = await get("blocks", { ...wanted, cursor, limit: PAGE - blocks.length });
        if (loaded !== key) return; // a newer request went out meanwhile
        blocks.push(...page.blocks);
        cursor = page.next_cursor;
      }
      body.replaceChildren(...blocks.map((b) => h("tr", { "data-hash": b.block_hash, "data-seq": String(b.seq) },
        h("td", {}, h("a", { href: formatHash("blocks", { ...params, q: b.block_hash }), text: b.block_hash })),
        h("td", { text: b.media.join(", ") }), h("td", { text: b.publishers.join(", ") }),
        h("td", { text: b.block_size === null ? "–" : count(b.block_size) }), h("td", { text: count(b.hits) }),
        h("td", { text: dateTime(b.first_stored) }), h("td", { text: dateTime(b.last_stored) }))));
      next.disabled = cursor === null;
      next.dataset.cursor = cursor ?? "";
      previous.disabled = !trail.length;
      first.disabled = !params.cursor;
      position.textContent = blocks.length ? counted(blocks.length, "block")
        + `${params.cursor ? ` after #${params.cursor}` : " from the oldest"}`
        : cursor === null ? "no blocks on this page" : `none found yet up to #${cursor}: Next looks further`;
    } catch (error) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: 7, class: "problem", text: error.message })));
    }
  }

  let unsubscribe = null;
  return {
    show(state) {
      const asked = state.q !== params.q;
      params = state;
      if (stats.latest) fillFilters(stats.latest);
      else [[medium, "medium"], [publisher, "publisher"]].forEach(([s, n]) => offer(s, [], n, params[n]));
      unsubscribe ??= stats.subscribe(fillFilters);
      if (asked || !found.childElementCount) find(params.q);
      load();
    },
    hide() { unsubscribe?.(); unsubscribe = null; },
  };
}

export default { id: "blocks", title: "Blocks", mount };
