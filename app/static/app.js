// kvscope's page: tabs over the views of js/views/, the state of each in the URL.
// With a token set, the page was opened as /?token=TOKEN, which the sidecar answered with a
// session cookie and a redirect to /: every request carries that cookie, and no URL the
// page makes carries the token.
import { HistoryStore } from "./js/history.js";
import { Router } from "./js/router.js";
import { StatsPoller } from "./js/stats.js";
import { VIEWS } from "./js/views/index.js";

const stats = new StatsPoller(document.getElementById("updated"), document.getElementById("connection"));
const router = new Router(VIEWS, document.getElementById("tabs"), document.getElementById("views"), {
  stats,
  history: new HistoryStore(stats.firstRead),
});
stats.start();
router.apply();
