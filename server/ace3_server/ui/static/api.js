// The dashboard's only way to the service: /v1 with the API key as a bearer header.
// The key lives in sessionStorage (gone when the tab closes), never in a URL or a cookie.

const KEY_STORAGE = "ace3.apiKey";

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value === undefined || value === null || value === "") continue;
    search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

export class Api {
  constructor(key, onUnauthorized = () => {}) {
    this.key = key;
    this.onUnauthorized = onUnauthorized;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  async request(method, path, { params, body, signal } = {}) {
    const init = { method, headers: this.headers(), signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(`/v1${path}${query(params)}`, init);
    if (response.status === 401) this.onUnauthorized();
    if (!response.ok) {
      let detail = response.statusText;
      try {
        detail = (await response.json()).detail;
      } catch {
        /* not JSON */
      }
      throw new ApiError(response.status, detail);
    }
    if (response.status === 204) return null;
    return response.json();
  }

  get(path, params, signal) {
    return this.request("GET", path, { params, signal });
  }

  post(path, body) {
    return this.request("POST", path, { body: body === undefined ? {} : body });
  }

  delete(path) {
    return this.request("DELETE", path);
  }

  // Every item of a cursor-paginated list (the API's {data, next_cursor}), up to `max`.
  async all(path, params = {}, max = 1000) {
    const items = [];
    let cursor = null;
    do {
      const page = await this.get(path, { ...params, limit: 200, cursor });
      items.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor && items.length < max);
    return items;
  }

  // A download that needs the bearer header: fetched, then handed to the browser as a file.
  async download(path, filename) {
    const response = await fetch(`/v1${path}`, { headers: this.headers() });
    if (!response.ok) throw new ApiError(response.status, response.statusText);
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = filename;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  // Server-sent events over fetch() (EventSource cannot send the bearer header). Yields
  // {event, data, id}; reconnects with Last-Event-ID after a dropped connection and returns
  // after the stream's `end` event or when `signal` aborts.
  async *events(path, { signal, params } = {}) {
    let lastEventId = null;
    let failures = 0;
    while (!signal?.aborted) {
      let response;
      try {
        const headers = this.headers({ Accept: "text/event-stream" });
        if (lastEventId) headers["Last-Event-ID"] = lastEventId;
        response = await fetch(`/v1${path}${query(params)}`, { headers, signal });
      } catch (error) {
        if (signal?.aborted) return;
        await sleep(Math.min(1000 * 2 ** failures++, 10_000));
        continue;
      }
      if (response.status === 401) this.onUnauthorized();
      if (!response.ok) throw new ApiError(response.status, response.statusText);
      failures = 0;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let message = { event: "message", data: [], id: null };
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let newline;
          while ((newline = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, newline).replace(/\r$/, "");
            buffer = buffer.slice(newline + 1);
            if (line === "") {
              if (message.data.length) {
                if (message.id !== null) lastEventId = message.id;
                const event = { event: message.event, data: message.data.join("\n"), id: message.id };
                yield event;
                if (event.event === "end") return;
              }
              message = { event: "message", data: [], id: null };
            } else if (!line.startsWith(":")) {
              const colon = line.indexOf(":");
              const field = colon < 0 ? line : line.slice(0, colon);
              const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
              if (field === "event") message.event = text;
              else if (field === "data") message.data.push(text);
              else if (field === "id") message.id = text;
            }
          }
        }
      } catch (error) {
        if (signal?.aborted) return;
      }
      await sleep(500);
    }
  }
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
