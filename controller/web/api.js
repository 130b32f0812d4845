// Calls to rivetd: the /v1 API authenticated by the session cookie (the browser sends it;
// script never sees it), with the session's CSRF value on every change.

let session = null;

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function toLogin() {
  location.assign('/ui/login');
  return new ApiError(401, 'not logged in');
}

export async function whoami() {
  const r = await fetch('/ui/whoami', { credentials: 'same-origin', headers: { accept: 'application/json' } });
  if (r.status === 401) throw toLogin();
  if (!r.ok) throw new ApiError(r.status, `whoami: ${r.status}`);
  session = await r.json();
  return session;
}

function fault(data, fallback) {
  if (data && typeof data.error_message === 'string') {
    try { return JSON.parse(data.error_message).faultstring || data.error_message; } catch { return data.error_message; }
  }
  return fallback;
}

export async function api(method, path, body) {
  const headers = { 'X-OpenStack-Ironic-API-Version': 'latest', accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (method !== 'GET' && session && session.csrf) headers[session.csrf_header] = session.csrf;
  const r = await fetch(path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.status === 401) throw toLogin();
  const raw = await r.text();
  let data = null;
  try { data = raw ? JSON.parse(raw) : null; } catch { data = null; }
  if (!r.ok) throw new ApiError(r.status, fault(data, raw || r.statusText));
  return data;
}

export async function logout() {
  const headers = {};
  if (session && session.csrf) headers[session.csrf_header] = session.csrf;
  await fetch('/ui/logout', { method: 'POST', credentials: 'same-origin', headers });
  location.assign('/ui/login');
}

// Live node changes. `onChange(summary)` per change; `onResync()` when changes were missed
// (the stream lagged or reconnected), so the caller re-reads what it shows; `onProgress(ev)`
// (optional) when a running step's progress moved (`{uuid, command_id, step, progress}`).
export function watch(onChange, onResync, onProgress) {
  const es = new EventSource('/ui/events');
  let opened = false;
  es.addEventListener('hello', () => { if (opened) onResync(); opened = true; });
  es.addEventListener('node', (e) => {
    try { onChange(JSON.parse(e.data)); } catch (err) { console.warn('bad node event', err); }
  });
  es.addEventListener('resync', () => onResync());
  if (onProgress) {
    es.addEventListener('progress', (e) => {
      try { onProgress(JSON.parse(e.data)); } catch (err) { console.warn('bad progress event', err); }
    });
  }
  es.addEventListener('error', async () => {
    // A closed stream reconnects by itself; an ended session must log in again.
    if (es.readyState === EventSource.CLOSED) {
      try { await whoami(); } catch { /* redirected */ }
    }
  });
  return es;
}
