// The sidecar's API, by relative URLs: the page works under any path prefix a proxy
// puts it behind, and sends the session cookie (same origin) but never the token.

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function detailOf(body, status) {
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail) && detail.length) return detail.map((d) => d.msg).join("; ");
  return `HTTP ${status}`;
}

async function answer(response) {
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, detailOf(body, response.status));
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
