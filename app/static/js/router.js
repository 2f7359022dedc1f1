// The view and its state live in the URL's fragment (#/blocks?medium=CPU&q=123), so a link
// opens the same view with the same filters, and the back button steps between views.
// The tabs follow WAI-ARIA's tabs pattern: one tab stop for the tab list, arrow keys
// (and Home, End) move between tabs and open the one they reach.
import { h } from "./dom.js";

/** {view, params} from a fragment such as "#/blocks?medium=CPU". */
export function parseHash(hash) {
  const [path, query = ""] = hash.replace(/^#\/?/, "").split("?", 2);
  return { view: path, params: Object.fromEntries(new URLSearchParams(query)) };
}

/** The fragment for `view` with `params` (empty values left out). */
export function formatHash(view, params = {}) {
  const kept = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  const query = new URLSearchParams(kept).toString();
  return `#/${view}${query ? `?${query}` : ""}`;
}

export class Router {
  /** Tabs in `tabList` and panels in `panels` for `views` ([{id, title, mount}]), with `context`. */
  constructor(views, tabList, panels, context) {
    this.views = views;
    this.current = null;
    this.controllers = new Map();
    this.tabs = views.map((view) => h("a", {
      id: `tab-${view.id}`, role: "tab", href: formatHash(view.id), "aria-controls": `view-${view.id}`,
      "aria-selected": "false", tabindex: "-1", text: view.title,
    }));
    this.panels = views.map((view) => h("section", {
      id: `view-${view.id}`, role: "tabpanel", "aria-labelledby": `tab-${view.id}`, tabindex: "0", hidden: true,
    }));
    tabList.append(...this.tabs);
    panels.append(...this.panels);
    tabList.addEventListener("keydown", (event) => this.onKey(event));
    this.context = { ...context, navigate: (params) => this.navigate(this.current, params) };
    window.addEventListener("hashchange", () => this.apply());
  }

  /** Replace the current view's state in the URL (no new history entry) and show it. */
  navigate(view, params) {
    history.replaceState(null, "", formatHash(view, params));
    this.apply();
  }

  apply() {
    const { view, params } = parseHash(location.hash);
    const index = Math.max(0, this.views.findIndex((v) => v.id === view));
    const chosen = this.views[index];
    if (this.current !== chosen.id) {
      if (this.current) this.controllers.get(this.current).hide();
      this.tabs.forEach((tab, i) => {
        tab.setAttribute("aria-selected", String(i === index));
        tab.tabIndex = i === index ? 0 : -1;
      });
      this.panels.forEach((panel, i) => { panel.hidden = i !== index; });
      this.current = chosen.id;
      document.title = `kvscope · ${chosen.title}`;
    }
    this.tabs[index].setAttribute("href", formatHash(chosen.id, params)); // back to this state
    if (!this.controllers.has(chosen.id)) {
      this.controllers.set(chosen.id, chosen.mount(this.panels[index], this.context));
    }
    this.controllers.get(chosen.id).show(params);
  }

  onKey(event) {
    const at = this.tabs.indexOf(document.activeElement);
    if (at < 0) return;
    const last = this.tabs.length - 1;
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: last }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    const tab = this.tabs[(to + this.tabs.length) % this.tabs.length];
    tab.focus();
    location.hash = tab.getAttribute("href");
  }
}
