// The node page's serial console (docs/console.md): a single-use ticket (POST with the
// session's CSRF header: a WebSocket cannot carry it), the WebSocket with ?ticket=, then the
// captured log (so what was printed before the page opened is there) and the live bytes in
// xterm.js. The vendored xterm.js is loaded only here, when a node has a console.
// Binary frames are bytes both ways; text frames are JSON events (server) and commands.
import { api } from './api.js';
import { el } from './dom.js';

const LOG_TAIL = 256 * 1024;
let loading = null;

function loadXterm() {
  if (window.Terminal) return Promise.resolve();
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      document.head.append(el('link', { rel: 'stylesheet', href: '/ui/assets/xterm.css' }));
      const s = el('script', { src: '/ui/assets/xterm.js' });
      s.addEventListener('load', () => resolve());
      s.addEventListener('error', () => { loading = null; reject(new Error('cannot load xterm.js')); });
      document.head.append(s);
    });
  }
  return loading;
}

// One live console for node `uuid`; `element` stays the same across the page's redraws so
// the terminal and its socket survive them. `close()` ends it.
export function liveConsole(uuid) {
  const status = el('span', { class: 'muted', 'data-console': 'status' }, 'connecting…');
  const pen = el('span', { 'data-console': 'pen' }, '');
  const takeover = el('button', { type: 'button', 'data-action': 'console-takeover', hidden: true }, 'Take over');
  const again = el('button', { type: 'button', 'data-action': 'console-reconnect', hidden: true }, 'Reconnect');
  const screen = el('div', { class: 'console-screen', id: 'console-screen' });
  const element = el('div', { class: 'console-live', id: 'console' },
    el('div', { class: 'console-bar' }, pen, ' ', takeover, ' ', again, ' ', status), screen);
  let ws = null;
  let term = null;
  let closed = false;

  const say = (t) => { status.textContent = t; };
  const showPen = (holder) => { pen.textContent = holder ? `pen: ${holder}` : 'pen: free'; };
  const send = (v) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(v); };
  takeover.addEventListener('click', () => send(JSON.stringify({ takeover: true })));
  again.addEventListener('click', () => { again.hidden = true; start(); });

  async function start() {
    if (closed) return;
    try {
      await loadXterm();
      if (!term) {
        term = new window.Terminal({ scrollback: 5000, convertEol: false, disableStdin: true, cursorBlink: true });
        term.open(screen);
        // Tests read the rendered buffer through this; it holds nothing the page does not show.
        window.rivetConsole = { term, uuid };
        term.onData((d) => { if (!term.options.disableStdin) send(new TextEncoder().encode(d)); });
        term.onBinary((d) => {
          if (term.options.disableStdin) return;
          send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff));
        });
      }
      const ticket = await api('POST', `/v1/nodes/${uuid}/console/ticket`);
      const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
      ws = new WebSocket(`${proto}//${location.host}${ticket.url}`);
      ws.binaryType = 'arraybuffer';
    } catch (e) {
      say(`console unavailable: ${e.message || e}`);
      again.hidden = false;
      return;
    }
    // Until the log is written, live bytes wait here: log first, then what came after.
    let early = [];
    const socket = ws;
    socket.addEventListener('message', (m) => {
      if (typeof m.data !== 'string') {
        const bytes = new Uint8Array(m.data);
        if (early) early.push(bytes); else term.write(bytes);
        return;
      }
      let ev;
      try { ev = JSON.parse(m.data); } catch { return; }
      if (ev.event === 'hello') {
        // The server subscribed us before saying hello: the log read now misses nothing
        // (a chunk printed in between may show twice).
        term.options.disableStdin = !ev.can_write;
        takeover.hidden = !ev.can_write;
        element.dataset.canWrite = String(!!ev.can_write);
        showPen(ev.holder);
        say(ev.can_write ? 'connected' : 'connected, read-only');
        backlog().then((log) => {
          term.reset();
          if (log) term.write(log);
          for (const b of early) term.write(b);
          early = null;
          term.write('', () => { element.dataset.ready = '1'; });
        });
      } else if (ev.event === 'pen') {
        showPen(ev.holder);
        // A refusal shown earlier is stale once the pen moved (a takeover, a release).
        if (status.dataset.refused) { delete status.dataset.refused; say('connected'); }
      } else if (ev.event === 'session') {
        say(ev.state === 'lost' ? 'session lost: rivetd re-opens it' : 'session up');
      } else if (ev.event === 'refused') {
        say(`not sent: ${ev.reason}`);
        status.dataset.refused = '1';
      } else if (ev.event === 'lagged') {
        say(`fell behind: ${ev.skipped} chunks skipped (the log has them)`);
      } else if (ev.event === 'error') {
        say(String(ev.reason));
      }
    });
    socket.addEventListener('close', () => {
      if (socket !== ws || closed) return;
      say('disconnected');
      term.options.disableStdin = true;
      takeover.hidden = true;
      again.hidden = false;
      delete element.dataset.ready;
    });
  }

  async function backlog() {
    try {
      const r = await fetch(`/v1/nodes/${uuid}/console/log?tail=${LOG_TAIL}`,
        { credentials: 'same-origin', headers: { 'X-OpenStack-Ironic-API-Version': 'latest' } });
      return r.ok ? new Uint8Array(await r.arrayBuffer()) : null;
    } catch {
      return null;
    }
  }

  start();
  return {
    element,
    close() {
      closed = true;
      if (ws) ws.close();
      if (term) term.dispose();
      if (window.rivetConsole && window.rivetConsole.term === term) delete window.rivetConsole;
    },
  };
}

// A node without a live console here: its captured log, when there is one (kept after the
// console is disabled).
export async function capturedLog(uuid) {
  try {
    const r = await fetch(`/v1/nodes/${uuid}/console/log?tail=20000`,
      { credentials: 'same-origin', headers: { 'X-OpenStack-Ironic-API-Version': 'latest' } });
    if (!r.ok) return el('p', { class: 'muted', id: 'console' }, 'console not enabled');
    return el('pre', { class: 'console', id: 'console' }, await r.text());
  } catch {
    return el('p', { class: 'muted', id: 'console' }, 'console not enabled');
  }
}
