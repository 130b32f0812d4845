// The fleet's charts, drawn as plain SVG from /ui/charts.json (rivetd's own metrics): nodes
// per state now, mean time per provision state and per step, failures over the last hour and
// day, the deploy-duration distribution. No chart library: five bar charts are a few dozen
// lines, a library would be the largest file the UI loads, and every label here is set as
// text (createElementNS + textContent), never parsed as markup.
import { el, duration } from './dom.js';

const NS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function figure(id, title, total, body) {
  return el('figure', { class: 'chart', 'data-chart': id, 'data-total': total },
    el('figcaption', {}, title), body);
}

// Horizontal bars: rows of { label, value, text }; one row per line, longest bar = full width.
function hbars(rows) {
  if (!rows.length) return el('p', { class: 'muted' }, 'nothing yet');
  const W = 420; const LABEL = 170; const H = 18;
  const max = Math.max(...rows.map((r) => r.value), 1e-9);
  const s = svg('svg', { width: W, height: rows.length * H + 4, viewBox: `0 0 ${W} ${rows.length * H + 4}`, role: 'img' });
  rows.forEach((r, i) => {
    const y = i * H + 2;
    const w = Math.max(1, ((W - LABEL - 80) * r.value) / max);
    s.append(
      svg('text', { x: LABEL - 6, y: y + 13, 'text-anchor': 'end', class: 'label' }, r.label),
      svg('rect', { x: LABEL, y: y + 3, width: w.toFixed(1), height: H - 6, class: 'bar', 'data-label': r.label, 'data-value': r.value },
        svg('title', {}, `${r.label}: ${r.text}`)),
      svg('text', { x: LABEL + w + 4, y: y + 13, class: 'value' }, r.text));
  });
  return s;
}

// Vertical bars: columns of { label, value, tick }; `tick` (optional) is written under it.
function vbars(cols) {
  const W = 420; const H = 110; const BASE = 92;
  const max = Math.max(...cols.map((c) => c.value), 1);
  const bw = W / cols.length;
  const s = svg('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img' });
  cols.forEach((c, i) => {
    const h = (80 * c.value) / max;
    s.append(svg('rect', { x: (i * bw + 1).toFixed(1), y: (BASE - h).toFixed(1), width: Math.max(1, bw - 2).toFixed(1), height: h.toFixed(1),
      class: c.value ? 'bar' : 'bar zero', 'data-label': c.label, 'data-value': c.value }, svg('title', {}, `${c.label}: ${c.value}`)));
    if (c.tick) {
      const anchor = i === 0 ? 'start' : i === cols.length - 1 ? 'end' : 'middle';
      const x = anchor === 'start' ? i * bw : anchor === 'end' ? (i + 1) * bw : i * bw + bw / 2;
      s.append(svg('text', { x: x.toFixed(1), y: H - 4, 'text-anchor': anchor, class: 'tick' }, c.tick));
    }
  });
  s.append(svg('text', { x: 0, y: 10, class: 'tick' }, `max ${max}`));
  return s;
}

function mean(v) { return v.count ? v.seconds / v.count : 0; }

// A duration short enough for a bar's label: tenths under 10 s, else whole units.
function short(secs) {
  if (secs < 10) return `${secs.toFixed(1)} s`;
  if (secs < 60) return `${Math.round(secs)} s`;
  if (secs < 3600) return `${Math.round(secs / 60)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

function clock(t) {
  const d = new Date(t * 1000);
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
}

function spentRows(m) {
  return Object.entries(m || {}).map(([k, v]) => ({ label: k, value: mean(v), text: `${short(mean(v))} avg × ${v.count}` }))
    .sort((a, b) => b.value - a.value).slice(0, 15);
}

export function drawCharts(d) {
  const nodes = Object.entries(d.nodes || {}).sort((a, b) => b[1] - a[1]);
  const buckets = (d.deploys && d.deploys.buckets) || [];
  const perMin = (d.failures && d.failures.per_minute) || [];
  const perHour = (d.failures && d.failures.per_hour) || [];
  const failed = perHour.reduce((a, h) => a + h[1], 0);
  const deploys = d.deploys ? d.deploys.count : 0;
  return el('div', { class: 'charts', id: 'charts' },
    figure('nodes', 'Nodes per provision state', nodes.reduce((a, n) => a + n[1], 0),
      hbars(nodes.map(([k, v]) => ({ label: k, value: v, text: String(v) })))),
    figure('deploys', `Deploy duration (deploys: ${deploys}${deploys ? `, ${short(mean(d.deploys))} avg` : ''})`,
      deploys,
      vbars(buckets.map((b, i) => {
        const lo = i ? buckets[i - 1].le : 0;
        const tick = b.le === null ? `>${short(lo)}` : short(b.le).replace('.0 s', ' s');
        return { label: b.le === null ? `longer than ${duration(lo)}` : `up to ${duration(b.le)}`, value: b.count, tick };
      }))),
    figure('failures-hour', `Failures in the last hour (per minute): ${perMin.reduce((a, m) => a + m[1], 0)}`,
      perMin.reduce((a, m) => a + m[1], 0),
      vbars(perMin.map(([t, n], i) => ({ label: clock(t), value: n, tick: i % 10 === 0 ? clock(t) : '' })))),
    figure('failures-day', `Failures in the last 24 hours (per hour): ${failed}`, failed,
      vbars(perHour.map(([t, n], i) => ({ label: clock(t), value: n, tick: i % 4 === 0 ? clock(t) : '' })))),
    figure('states', 'Time per provision state (mean, as nodes left it)', Object.keys(d.states || {}).length,
      hbars(spentRows(d.states))),
    figure('steps', 'Time per step (mean)', Object.keys(d.steps || {}).length, hbars(spentRows(d.steps))));
}

// The charts page: drawn once, then redrawn when nodes change (at most every 2 s: a fleet
// changing all at once must not refetch once per node).
export async function chartsPage(root, watch) {
  const load = async () => {
    const r = await fetch('/ui/charts.json', { credentials: 'same-origin', headers: { accept: 'application/json' } });
    if (!r.ok) throw new Error(`charts: ${r.status}`);
    return r.json();
  };
  const draw = async () => {
    root.replaceChildren(el('h1', {}, 'Charts'),
      el('p', { class: 'muted' }, 'From this rivetd\'s own metrics since it started (also on /metrics).'),
      drawCharts(await load()));
    root.dataset.ready = '1';
  };
  let timer = 0;
  const later = () => {
    if (timer) return;
    timer = setTimeout(() => { timer = 0; draw().catch(() => {}); }, 2000);
  };
  watch(later, later);
  await draw();
}
