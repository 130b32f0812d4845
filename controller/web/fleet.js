// The fleet: every node, read page by page with the API's limit/marker paging, kept in memory
// and rendered as a virtual list (only the rows in view exist in the DOM, so 10,000 nodes
// scroll as smoothly as 10). Live: the conductor's changes arrive as server-sent events and
// update their row in place.
import { api, watch } from './api.js';
import { el, text, stepCell, withProgress } from './dom.js';

const FIELDS = ['uuid', 'name', 'provision_state', 'target_provision_state', 'power_state',
  'target_power_state', 'maintenance', 'maintenance_reason', 'fault', 'last_error', 'owner',
  'resource_class', 'clean_step', 'deploy_step'].join(',');
const PAGE = 1000;
const ROW_H = 32;
const OVERSCAN = 8;

export async function fleetPage(root, me, fsm) {
  const nodes = new Map();
  const filters = { state: '', fault: '', owner: '', q: '' };
  let shown = [];
  let loading = false;
  let pending = [];

  const counts = el('div', { id: 'counts', class: 'counts' });
  const stateSel = el('select', { name: 'state', 'aria-label': 'provision state' },
    el('option', { value: '' }, 'any state'), fsm.states.map((s) => el('option', { value: s }, s)));
  const faultSel = el('select', { name: 'fault', 'aria-label': 'fault' },
    el('option', { value: '' }, 'any'),
    el('option', { value: 'error' }, 'with last error'),
    el('option', { value: 'maintenance' }, 'in maintenance'),
    el('option', { value: 'faulty' }, 'error or maintenance'),
    el('option', { value: 'healthy' }, 'no error, no maintenance'));
  const ownerIn = el('input', { name: 'owner', placeholder: 'owner', 'aria-label': 'owner' });
  const qIn = el('input', { name: 'q', type: 'search', placeholder: 'search name, uuid, error…', 'aria-label': 'search' });
  const summary = el('span', { id: 'shown', class: 'muted' });
  const head = el('div', { class: 'row head' },
    ['name', 'provision state', 'power', 'maint.', 'step', 'owner', 'resource class', 'last error']
      .map((h) => el('span', {}, h)));
  const spacer = el('div', { class: 'spacer' });
  const viewport = el('div', { id: 'rows', class: 'viewport' }, spacer);
  root.replaceChildren(
    el('h1', {}, 'Fleet'), counts,
    el('div', { class: 'filters' }, stateSel, faultSel, ownerIn, qIn, summary),
    head, viewport);

  const onFilter = () => {
    filters.state = stateSel.value;
    filters.fault = faultSel.value;
    filters.owner = ownerIn.value.trim().toLowerCase();
    filters.q = qIn.value.trim().toLowerCase();
    schedule();
  };
  stateSel.addEventListener('change', onFilter);
  faultSel.addEventListener('change', onFilter);
  ownerIn.addEventListener('input', onFilter);
  qIn.addEventListener('input', onFilter);
  // Scroll events come many times a frame: the rows are drawn once per frame.
  let scrollFrame = 0;
  viewport.addEventListener('scroll', () => {
    if (scrollFrame) return;
    scrollFrame = requestAnimationFrame(() => { scrollFrame = 0; drawRows(); });
  });

  function matches(n) {
    if (filters.state && n.provision_state !== filters.state) return false;
    const err = !!n.last_error;
    switch (filters.fault) {
      case 'error': if (!err) return false; break;
      case 'maintenance': if (!n.maintenance) return false; break;
      case 'faulty': if (!err && !n.maintenance) return false; break;
      case 'healthy': if (err || n.maintenance) return false; break;
      default: break;
    }
    if (filters.owner && !(n.owner || '').toLowerCase().includes(filters.owner)) return false;
    if (filters.q) {
      const hay = [n.name, n.uuid, n.owner, n.resource_class, n.last_error, n.provision_state,
        n.maintenance_reason, n.fault].filter(Boolean).join(' ').toLowerCase();
      if (!hay.includes(filters.q)) return false;
    }
    return true;
  }

  let frame = 0;
  function schedule() {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = 0; render(); });
  }

  function render() {
    const per = new Map();
    for (const n of nodes.values()) per.set(n.provision_state, (per.get(n.provision_state) || 0) + 1);
    counts.replaceChildren(
      el('button', { type: 'button', class: filters.state ? 'chip' : 'chip on', 'data-state': '',
        onclick: () => { stateSel.value = ''; onFilter(); } }, `all ${nodes.size}`),
      ...[...per.entries()].sort().map(([s, c]) => el('button', {
        type: 'button', class: filters.state === s ? 'chip on' : 'chip', 'data-state': s,
        onclick: () => { stateSel.value = s; onFilter(); },
      }, `${s} `, el('b', { 'data-count': s }, c))));
    shown = [...nodes.values()].filter(matches)
      .sort((a, b) => (a.name || a.uuid).localeCompare(b.name || b.uuid));
    summary.textContent = loading ? `loading… ${nodes.size}` : `${shown.length} of ${nodes.size} shown`;
    spacer.style.height = `${shown.length * ROW_H}px`;
    drawn = new Map();
    viewport.replaceChildren(spacer);
    drawRows();
  }

  function row(n, i) {
    const prov = n.target_provision_state ? `${n.provision_state} → ${n.target_provision_state}` : n.provision_state;
    const power = n.target_power_state ? `${text(n.power_state)} → ${n.target_power_state}` : text(n.power_state);
    const step = n.clean_step && n.clean_step.step ? n.clean_step : n.deploy_step;
    const a = el('a', {
      class: `row${n.last_error ? ' err' : ''}${n.maintenance ? ' maint' : ''}`,
      href: `/ui/nodes/${encodeURIComponent(n.uuid)}`, 'data-node': n.uuid,
    },
    el('span', { 'data-field': 'name', title: n.uuid }, n.name || n.uuid),
    el('span', { 'data-field': 'provision_state', 'data-state': n.provision_state }, prov),
    el('span', { 'data-field': 'power_state' }, power),
    el('span', { 'data-field': 'maintenance', title: n.maintenance_reason || '' }, n.maintenance ? 'yes' : ''),
    el('span', { 'data-field': 'step' }, stepCell(step)),
    el('span', { 'data-field': 'owner' }, n.owner || ''),
    el('span', { 'data-field': 'resource_class' }, n.resource_class || ''),
    el('span', { 'data-field': 'last_error', title: n.last_error || '' }, n.last_error || ''));
    // Through the CSSOM: the page's CSP refuses a `style` attribute (an inline style).
    a.style.top = `${i * ROW_H}px`;
    return a;
  }

  // The rows in the DOM, by their index in `shown` (a new `shown` starts it afresh). A scroll
  // builds only the rows coming into view and removes those leaving it, rather than every
  // row in view each time: rebuilding ~30 rows a frame dropped frames (rivet-bench ui).
  let drawn = new Map();
  function drawRows() {
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(shown.length, Math.ceil((viewport.scrollTop + viewport.clientHeight) / ROW_H) + OVERSCAN);
    for (const [i, r] of drawn) {
      if (i < first || i >= last) { r.remove(); drawn.delete(i); }
    }
    // What stays is one run of indices; new rows go before or after it, so the DOM keeps
    // the rows in list order.
    let kept = Infinity;
    for (const i of drawn.keys()) kept = Math.min(kept, i);
    const above = [];
    const below = [];
    for (let i = first; i < last; i++) {
      if (drawn.has(i)) continue;
      const r = row(shown[i], i);
      drawn.set(i, r);
      (i < kept ? above : below).push(r);
    }
    spacer.after(...above);
    viewport.append(...below);
  }

  function apply(change) {
    if (loading) { pending.push(change); return; }
    if (change.removed) nodes.delete(change.uuid);
    else nodes.set(change.uuid, change);
    schedule();
  }

  async function loadAll() {
    if (loading) return;
    loading = true;
    pending = [];
    const fresh = new Map();
    let marker = '';
    try {
      for (;;) {
        const page = await api('GET', `/v1/nodes?fields=${FIELDS}&limit=${PAGE}${marker ? `&marker=${encodeURIComponent(marker)}` : ''}`);
        for (const n of page.nodes) fresh.set(n.uuid, n);
        if (page.nodes.length < PAGE || !page.next) break;
        marker = page.nodes[page.nodes.length - 1].uuid;
        summary.textContent = `loading… ${fresh.size}`;
      }
    } finally {
      loading = false;
    }
    nodes.clear();
    for (const [k, v] of fresh) nodes.set(k, v);
    // Changes that arrived while the pages were read are newer than what the pages said.
    const late = pending;
    pending = [];
    for (const c of late) apply(c);
    schedule();
  }

  function progressed(ev) {
    const n = nodes.get(ev.uuid);
    if (!n) return;
    nodes.set(ev.uuid, { ...n, clean_step: withProgress(n.clean_step, ev), deploy_step: withProgress(n.deploy_step, ev) });
    schedule();
  }

  watch(apply, () => loadAll().catch((e) => { summary.textContent = String(e.message || e); }), progressed);
  await loadAll();
  root.dataset.ready = '1';
  // The first render with every node read (rivet-bench ui reads it: ms since navigation).
  requestAnimationFrame(() => performance.mark('rivet:fleet-ready'));
}
