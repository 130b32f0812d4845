// The UI's entry: who is logged in, then the view the path names (/ui/, /ui/charts or
// /ui/nodes/<id>).
import { whoami, logout, watch } from './api.js';
import { el } from './dom.js';
import { fleetPage } from './fleet.js';
import { nodePage } from './node.js';
import { chartsPage } from './charts.js';

async function main() {
  const root = document.getElementById('main');
  let me;
  try { me = await whoami(); } catch { return; }
  const who = document.getElementById('who');
  who.textContent = me.auth ? `${me.user} (${me.role})` : 'auth off: anonymous admin';
  const out = document.getElementById('logout');
  if (me.auth && me.csrf) {
    out.hidden = false;
    out.addEventListener('click', () => logout());
  }
  const fsm = await (await fetch('/ui/state-machine.json', { credentials: 'same-origin' })).json();
  const m = location.pathname.match(/^\/ui\/nodes\/([^/]+)\/?$/);
  try {
    if (m) await nodePage(root, me, fsm, decodeURIComponent(m[1]));
    else if (/^\/ui\/charts\/?$/.test(location.pathname)) await chartsPage(root, (c, r) => watch(c, r));
    else await fleetPage(root, me, fsm);
  } catch (e) {
    root.replaceChildren(el('p', { class: 'error', role: 'alert' }, String(e.message || e)));
  }
}

main();
