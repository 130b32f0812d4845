// The verbs a node page offers: those the state machine allows in the node's provision state
// (rivetd's own table, /ui/state-machine.json) that the viewer's role may send (/ui/whoami),
// plus power and maintenance. Destructive ones ask first, in an in-page dialog.
import { api } from './api.js';
import { el } from './dom.js';

// UI verb → the API verbs that mean it (an alias pair counts once).
const PROVISION = {
  manage: ['manage'], provide: ['provide'], inspect: ['inspect'], clean: ['clean'],
  deploy: ['active', 'deploy'], undeploy: ['deleted', 'undeploy'], rescue: ['rescue'],
  unrescue: ['unrescue'], abort: ['abort'],
};
const DESTRUCTIVE = new Set(['undeploy', 'clean', 'rescue', 'power-off', 'reboot', 'abort', 'deploy']);
const CLEANING = new Set(['cleaning', 'clean wait', 'clean hold']);

export function allowedVerbs(node, me, fsm) {
  const out = [];
  const inState = new Set(fsm.verbs[node.provision_state] || []);
  if (me.may.provision) {
    for (const [verb, api] of Object.entries(PROVISION)) {
      if (!api.some((v) => inState.has(v))) continue;
      // Deploying writes the image into instance_info first: a role that may not change
      // node records cannot deploy from here.
      if (verb === 'deploy' && !me.may.update) continue;
      out.push(verb);
    }
  }
  if (me.may.power && !node.reservation && !node.target_power_state && !CLEANING.has(node.provision_state)) {
    if (node.power_state === 'power on') out.push('power-off', 'reboot');
    else out.push('power-on');
  }
  if (me.may.maintenance) out.push(node.maintenance ? 'maintenance-off' : 'maintenance-on');
  return out;
}

// The form fields a verb asks for in its dialog.
function fieldsFor(verb) {
  switch (verb) {
    case 'deploy': return [
      el('label', {}, 'Image URL ', el('input', { name: 'image_source', type: 'url', required: true, placeholder: 'http://…/image.qcow2' })),
      el('label', {}, 'Image checksum ', el('input', { name: 'image_checksum', required: true, placeholder: 'sha256 hex' })),
      el('label', {}, 'Config drive (optional: JSON {meta_data, user_data, …}, a URL, or gzip+base64) ', el('textarea', { name: 'configdrive', rows: 3 })),
    ];
    case 'clean': return [
      el('label', {}, 'Clean steps (JSON) ', el('textarea', { name: 'clean_steps', rows: 3 },
        '[{"interface": "deploy", "step": "erase_devices_metadata"}]')),
    ];
    case 'rescue': return [
      el('label', {}, 'Rescue password ', el('input', { name: 'rescue_password', type: 'password', required: true })),
    ];
    default: return [];
  }
}

function parseConfigdrive(raw) {
  const v = raw.trim();
  if (!v) return undefined;
  if (v.startsWith('{')) return JSON.parse(v);
  return v;
}

async function run(verb, node, form, me) {
  const id = encodeURIComponent(node.uuid);
  const provision = (body) => api('PUT', `/v1/nodes/${id}/states/provision`, body);
  const val = (name) => (form && form.elements[name] ? form.elements[name].value : '');
  switch (verb) {
    case 'deploy': {
      const image = val('image_source').trim();
      const checksum = val('image_checksum').trim();
      if (!image || !checksum) throw new Error('an image URL and its checksum are required');
      const configdrive = parseConfigdrive(val('configdrive'));
      await api('PATCH', `/v1/nodes/${id}`, [
        { op: 'add', path: '/instance_info/image_source', value: image },
        { op: 'add', path: '/instance_info/image_checksum', value: checksum },
      ]);
      return provision(configdrive === undefined ? { target: 'active' } : { target: 'active', configdrive });
    }
    case 'clean': return provision({ target: 'clean', clean_steps: JSON.parse(val('clean_steps') || '[]') });
    case 'rescue': return provision({ target: 'rescue', rescue_password: val('rescue_password') });
    case 'undeploy': return provision({ target: 'deleted' });
    case 'power-on': return api('PUT', `/v1/nodes/${id}/states/power`, { target: 'power on' });
    case 'power-off': return api('PUT', `/v1/nodes/${id}/states/power`, { target: 'power off' });
    case 'reboot': return api('PUT', `/v1/nodes/${id}/states/power`, { target: 'rebooting' });
    case 'maintenance-on': return api('PUT', `/v1/nodes/${id}/maintenance`, { reason: `set in the web UI by ${me.user}` });
    case 'maintenance-off': return api('DELETE', `/v1/nodes/${id}/maintenance`);
    default: return provision({ target: verb });
  }
}

// Ask in an in-page dialog; resolves with the dialog's form when accepted, null when not.
function confirmDialog(verb, node) {
  return new Promise((resolve) => {
    const form = el('form', { method: 'dialog', class: 'confirm' },
      el('h2', {}, `${verb} ${node.name || node.uuid}?`),
      el('p', {}, DESTRUCTIVE.has(verb) ? 'This changes what the machine is doing and may erase or interrupt work.' : ''),
      fieldsFor(verb),
      el('div', { class: 'buttons' },
        el('button', { type: 'button', value: 'cancel', 'data-cancel': true }, 'Cancel'),
        el('button', { type: 'submit', value: 'ok', 'data-confirm': verb, class: 'danger' }, verb)));
    const dialog = el('dialog', { id: 'confirm-dialog' }, form);
    document.body.append(dialog);
    const done = (ok) => { dialog.close(); dialog.remove(); resolve(ok ? form : null); };
    form.querySelector('[data-cancel]').addEventListener('click', () => done(false));
    form.addEventListener('submit', (e) => { e.preventDefault(); if (form.reportValidity()) done(true); });
    dialog.addEventListener('cancel', () => done(false));
    dialog.showModal();
  });
}

export function verbBar(node, me, fsm, onDone) {
  const status = el('span', { class: 'status', id: 'verb-status', role: 'status' });
  const verbs = allowedVerbs(node, me, fsm);
  const buttons = verbs.map((verb) => el('button', {
    type: 'button', 'data-verb': verb, class: DESTRUCTIVE.has(verb) ? 'danger' : '',
    onclick: async () => {
      let form = null;
      if (DESTRUCTIVE.has(verb) || fieldsFor(verb).length) {
        form = await confirmDialog(verb, node);
        if (!form) return;
      }
      status.textContent = `${verb}…`;
      try {
        await run(verb, node, form, me);
        status.textContent = `${verb}: accepted`;
      } catch (e) {
        status.textContent = `${verb} refused: ${e.message || e}`;
        status.className = 'status error';
      }
      onDone();
    },
  }, verb));
  if (!buttons.length) {
    return el('div', { id: 'verbs', class: 'verbs' },
      el('span', { class: 'muted' }, me.may.provision ? 'no verbs in this state' : `role ${me.role}: read only`));
  }
  return el('div', { id: 'verbs', class: 'verbs' }, buttons, status);
}
