// The page's views, in tab order. A view is one module whose default export is
// {id, title, mount(panel, context) -> {show(params), hide()}}: `mount` builds it in its
// panel the first time it is opened, `show` gets the URL's parameters each time, `hide`
// stops its updates. `context` holds `stats` (StatsPoller), `history` (HistoryStore) and
// `navigate(params)`, which puts the view's state in the URL. To add a view, write its
// module and list it here.
import overview from "./overview.js";
import blocks from "./blocks.js";
import publishers from "./publishers.js";
import events from "./events.js";
import insight from "./insight.js";

export const VIEWS = [overview, blocks, publishers, events, insight];
