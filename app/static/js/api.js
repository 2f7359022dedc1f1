// The sidecar's API, by relative URLs: the page works under any path prefix a proxy
// puts it behind, and sends the session cookie (same origin) but never the token.

export class ApiError extends Error {
  /** `retryAfterS`: the answer's Retry-After in seconds (a 429 or a 503), else null. */
  constructor(status, detail, retryAfterS = null) {
    super(detail);
    this.status = status;
    this.retryAfterS = retryAfterS;
  }
}

/** Retry-After as seconds: only its delay form (digits); its date form reads as none. */
function retryAfter(response) {
  const text = response.headers.get("Retry-After");
  return text !== null && /^\d{1,9}$/.test(text) ? Number(text) : null;
}

function detailOf(body, status) {
  const detail = body && body.detail;
  let text = `HTTP ${status}`;
  if (typeof detail === "string") text = detail;
  else if (Array.isArray(detail) && detail.length) text = detail.map((d) => String(d?.msg)).join("; ");
  // The session cookie expired or the sidecar's token changed: only a new login helps.
  return status === 401 ? `${text}: open the page as /?token=TOKEN again` : text;
}

async function answer(response) {
  const body = await response.json().catch(() => undefined);
  if (!response.ok) throw new ApiError(response.status, detailOf(body, response.status), retryAfter(response));
  // A proxy's error page, or an answer cut short: not an answer the views can read.
  if (body === undefined) throw new ApiError(response.status, `HTTP ${response.status} with no JSON answer`);
  return body;
}

/** GET api/v1/PATH with `params` (those null or "" left out); the JSON answer. */
export async function get(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(name, value);
  }
  const text = query.toString();
  return answer(await fetch(`api/v1/${path}${text ? `?${text}` : ""}`));
}

/** POST api/v1/PATH with a JSON body; the JSON answer. */
export async function post(path, body) {
  const headers = { "Content-Type": "application/json" };
  return answer(await fetch(`api/v1/${path}`, { method: "POST", headers, body: JSON.stringify(body) }));
}
