// One node: its fields, the timeline of its history with durations, inventory, RAID, boot
// mode, the verbs the viewer may send now, and the serial console when rivetd has one.
import { api, watch, ApiError } from './api.js';
import { el, text, stepName, stepCell, withProgress, duration, bytes } from './dom.js';
import { verbBar } from './verbs.js';
import { liveConsole, capturedLog } from './console.js';

const SHOWN = ['uuid', 'name', 'driver', 'provision_state', 'target_provision_state', 'power_state',
  'target_power_state', 'maintenance', 'maintenance_reason', 'fault', 'last_error', 'owner', 'lessee',
  'resource_class', 'conductor', 'reservation', 'provision_updated_at', 'inspection_finished_at',
  'instance_uuid', 'automated_clean', 'protected', 'retired', 'description'];

function section(title, ...body) {
  return el('section', {}, el('h2', {}, title), ...body);
}

function fieldsTable(node) {
  const rows = SHOWN.filter((k) => k in node).map((k) => el('tr', {},
    el('th', {}, k), el('td', { 'data-field': k }, typeof node[k] === 'boolean' ? String(node[k]) : text(node[k]))));
  const step = stepName(node.clean_step) ? node.clean_step : node.deploy_step;
  if (stepName(step)) rows.push(el('tr', {}, el('th', {}, 'current step'), el('td', { 'data-field': 'step' }, stepCell(step))));
  if (node.traits && node.traits.length) rows.push(el('tr', {}, el('th', {}, 'traits'), el('td', {}, node.traits.join(', '))));
  return el('table', { class: 'fields' }, el('tbody', {}, rows));
}

async function timeline(uuid) {
  let data;
  try {
    data = await api('GET', `/v1/nodes/${uuid}/history?detail=true`);
  } catch (e) {
    return el('p', { class: 'muted' }, `history unavailable: ${e.message}`);
  }
  const items = (data.history || []);
  if (!items.length) return el('p', { class: 'muted' }, 'no history yet');
  return el('ol', { class: 'timeline', id: 'timeline' }, items.map((h) => el('li', { class: (h.severity || '').toLowerCase() },
    el('time', {}, text(h.created_at)), ' ',
    el('b', {}, text(h.state || h.event_type)), ' ',
    h.duration_seconds !== undefined && h.duration_seconds !== null ? el('span', { class: 'muted' }, `(${duration(h.duration_seconds)} in the previous state) `) : '',
    el('span', {}, text(h.event)))));
}

async function inventory(uuid) {
  let data;
  try {
    data = await api('GET', `/v1/nodes/${uuid}/inventory`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return el('p', { class: 'muted' }, 'not inspected yet');
    return el('p', { class: 'muted' }, `inventory unavailable: ${e.message}`);
  }
  const inv = (data && data.inventory) || {};
  const cpu = inv.cpu || {};
  const mem = inv.memory || {};
  const disks = inv.disks || [];
  const nics = inv.interfaces || [];
  return el('div', { id: 'inventory' },
    el('p', {}, `CPU: ${text(cpu.count)} × ${text(cpu.model_name)} (${text(cpu.architecture)})`),
    el('p', {}, `Memory: ${mem.physical_mb ? `${mem.physical_mb} MiB` : bytes(mem.total)}`),
    el('table', { class: 'list' }, el('thead', {}, el('tr', {}, ['disk', 'size', 'model', 'serial', 'rotational'].map((h) => el('th', {}, h)))),
      el('tbody', {}, disks.map((d) => el('tr', {}, el('td', {}, text(d.name)), el('td', {}, bytes(d.size)),
        el('td', {}, text(d.model)), el('td', {}, text(d.serial)), el('td', {}, String(!!d.rotational)))))),
    el('table', { class: 'list' }, el('thead', {}, el('tr', {}, ['NIC', 'MAC', 'IPv4', 'speed'].map((h) => el('th', {}, h)))),
      el('tbody', {}, nics.map((n) => el('tr', {}, el('td', {}, text(n.name)), el('td', { 'data-mac': n.mac_address || '' }, text(n.mac_address)),
        el('td', {}, text(n.ipv4_address)), el('td', {}, n.speed_mbps ? `${n.speed_mbps} Mb/s` : '—'))))));
}

function json(v) {
  if (v === undefined || v === null || (typeof v === 'object' && !Object.keys(v).length)) return el('p', { class: 'muted' }, 'none');
  return el('pre', {}, JSON.stringify(v, null, 2));
}

export async function nodePage(root, me, fsm, ident) {
  let node = await api('GET', `/v1/nodes/${encodeURIComponent(ident)}`);
  const uuid = encodeURIComponent(node.uuid);
  let refreshing = false;
  let again = false;
  // The live console outlives redraws (a node change must not reconnect it).
  let live = null;

  async function consolePanel() {
    if (node.console_enabled) {
      if (!live) live = liveConsole(uuid);
      return live.element;
    }
    if (live) { live.close(); live = null; }
    return capturedLog(uuid);
  }

  async function draw() {
    const [tl, inv, con] = await Promise.all([timeline(uuid), inventory(uuid), consolePanel()]);
    root.replaceChildren(
      el('p', {}, el('a', { href: '/ui/' }, '← fleet')),
      el('h1', {}, node.name || node.uuid, ' ', el('span', { class: 'state', id: 'node-state', 'data-state': node.provision_state }, node.provision_state)),
      verbBar(node, me, fsm, refresh),
      section('Fields', fieldsTable(node)),
      section('Boot', el('p', { id: 'boot' }, `boot mode: ${text(node.boot_mode)}, secure boot: ${text(node.secure_boot)}`)),
      section('Timeline', tl),
      section('Inventory', inv),
      section('RAID', el('h3', {}, 'current'), json(node.raid_config), el('h3', {}, 'target'), json(node.target_raid_config)),
      section('Console', con));
    root.dataset.node = node.uuid;
    root.dataset.ready = '1';
  }

  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      do {
        again = false;
        node = await api('GET', `/v1/nodes/${uuid}`);
        await draw();
      } while (again);
    } catch (e) {
      root.prepend(el('p', { class: 'error', role: 'alert' }, String(e.message || e)));
    } finally {
      refreshing = false;
    }
  }

  // Only this node's changes matter here; a dialog left open is not redrawn under the user.
  watch((c) => {
    if (c.uuid !== node.uuid || document.getElementById('confirm-dialog')) return;
    refresh();
  }, () => refresh(), (ev) => {
    // Progress moves often: only the step's cell is redrawn.
    if (ev.uuid !== node.uuid) return;
    node = { ...node, clean_step: withProgress(node.clean_step, ev), deploy_step: withProgress(node.deploy_step, ev) };
    const cell = document.querySelector('td[data-field=step]');
    const step = stepName(node.clean_step) ? node.clean_step : node.deploy_step;
    if (cell) cell.replaceChildren(...stepCell(step));
  });
  await draw();
}
