// One rule for every number the page shows, so that "183" never sits next to "6,591.9":
// integers (counts) are grouped and have no decimals; any other value keeps three
// significant figures, never more decimals than that needs (5,608 / 29.9 / 4.75 / 0.0532);
// bytes scale by 1000 (kB, MB, GB), seconds by 1000 (µs, ms, s), ratios show as percent.
// Every value goes out with its unit (but on an axis too narrow for the unit's name, whose
// short labels leave it to the chart's caption); a count's unit is a noun, singular for
// exactly one (a rate's, "blocks/s", is a unit like "B/s" and stays as it is). A percent is written
// against its number ("97.8%"), as the API's verdicts, the CLI and the README write it, so a
// verdict and the figure beside it read alike; every other unit stands a space apart.

const grouped = new Map();

function numberFormat(options) {
  const key = JSON.stringify(options);
  if (!grouped.has(key)) grouped.set(key, new Intl.NumberFormat(undefined, options));
  return grouped.get(key);
}

/** A number by the page's rule: three significant figures, grouped, no trailing noise. */
export function decimal(value) {
  const size = Math.abs(value);
  if (size >= 100 || size === 0) return numberFormat({ maximumFractionDigits: 0 }).format(value);
  if (size >= 10) return numberFormat({ maximumFractionDigits: 1 }).format(value);
  if (size >= 1) return numberFormat({ maximumFractionDigits: 2 }).format(value);
  return numberFormat({ maximumSignificantDigits: 3 }).format(value);
}

/** A count: grouped digits, no decimals ("27,447"). */
export function count(value) {
  return numberFormat({ maximumFractionDigits: 0 }).format(value);
}

/** A count's noun: the singular for exactly one, the plural for any other count, zero
included ("1 block", "0 blocks"). Every count the page writes beside a noun takes it from
here, so no text reads "1 blocks". */
export function noun(value, singular, plural = `${singular}s`) {
  return value === 1 ? singular : plural;
}

/** A count and its noun: "1 block", "27,447 blocks", "1 sampled reference". */
export function counted(value, singular, plural) {
  return `${count(value)} ${noun(value, singular, plural)}`;
}

const SI = ["", "k", "M", "G", "T", "P"];

function scaled(value, base, steps, unit) {
  let step = 0;
  let size = value;
  while (Math.abs(size) >= base && step < steps.length - 1) {
    size /= base;
    step += 1;
  }
  return [decimal(size), `${steps[step]}${unit}`];
}

function seconds(value) {
  const size = Math.abs(value);
  if (size === 0 || size >= 1) return [decimal(value), "s"];
  if (size >= 1e-3) return [decimal(value * 1e3), "ms"];
  return [decimal(value * 1e6), "µs"];
}

const UNITS = {
  blocks: (v) => [count(v), noun(v, "block")],
  events: (v) => [count(v), noun(v, "event")],
  "blocks/s": (v) => [decimal(v), "blocks/s"],
  "events/s": (v) => [decimal(v), "events/s"],
  bytes: (v) => scaled(v, 1000, SI, "B"),
  "bytes/s": (v) => scaled(v, 1000, SI, "B/s"),
  seconds,
  ratio: (v) => [decimal(100 * v), "%"],
  tokens: (v) => [count(v), noun(v, "token")],
};

/** [number, unit] for a value of one of the page's units ("–" and the unit when unknown). */
export function parts(value, unit) {
  const format = UNITS[unit];
  if (!format) throw new Error(`no unit ${unit}`);
  if (value === null || value === undefined || Number.isNaN(value)) return ["–", format(0)[1]];
  return format(value);
}

/** What goes between a number and its unit `name`: nothing before "%", a space before any other. */
export function unitGap(name) {
  return name === "%" ? "" : " ";
}

/** "5,608 blocks/s", "2.87 MB/s", "0.424 ms", "0.532%". */
export function withUnit(value, unit) {
  const [number, name] = parts(value, unit);
  return `${number}${unitGap(name)}${name}`;
}

/** The name of `unit` as it stands unscaled beside a number other than one: "blocks", "B/s",
"s", "%". */
export function unitName(unit) {
  return parts(2, unit)[1];
}

/** A value in few characters, for an axis too narrow for its unit's name: three significant
figures and the unit's SI prefix without the unit ("27.4k" blocks, "2.87G" B/s, "424µ" s),
which goes once beside the axis (`unitName`). A ratio keeps its percent sign: the percent is
its scale ("97.8%"). */
export function short(value, unit) {
  const [number, name] = parts(value, unit);
  if (unit === "ratio") return `${number}${name}`;
  if (unit === "seconds") return `${number}${name.slice(0, -1)}`;
  return scaled(value, 1000, SI, "").join("");
}

/** A wall-clock time (unix seconds) in the reader's locale. */
export function clock(ts) {
  return ts === null || ts === undefined ? "–" : new Date(ts * 1000).toLocaleTimeString();
}

/** A date and time (unix seconds), for block timestamps. */
export function dateTime(ts) {
  return ts === null || ts === undefined ? "–" : new Date(ts * 1000).toLocaleString();
}

/** Past this many days (about 270 years) an age is no clock's: it reads "over 100,000 d", where a
stamp in the far past wrote out hundreds of digits. */
const MOST_DAYS = 100_000;

/** How long ago, from a number of seconds: "6.27 ms", "12.3 s", "4 min 10 s", "5 h 2 min",
"20,787 d 12 h" (under a minute by the rule for seconds: a frame 6 ms old read "0.00627 s"; days
grouped as every count is: a worker's stats stamped by a clock counting from its boot read
"498884 h 9 min" behind, and stamped in the far past "2.7777777638888895e+296 h 40 min"). */
export function age(secondsAgo) {
  if (secondsAgo === null || secondsAgo === undefined) return "–";
  if (secondsAgo < 60) return withUnit(Math.max(0, secondsAgo), "seconds");
  const minutes = Math.floor(secondsAgo / 60);
  if (minutes < 60) return `${minutes} min ${Math.floor(secondsAgo % 60)} s`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return `${hours} h ${minutes % 60} min`;
  const days = Math.floor(hours / 24);
  if (days >= MOST_DAYS) return `over ${count(MOST_DAYS)} d`;
  return `${count(days)} d ${hours % 24} h`;
}
