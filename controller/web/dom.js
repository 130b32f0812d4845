// Building DOM from data without innerHTML: every value becomes a text node, so nothing a
// node record carries (names, errors, inventory strings) can become markup or script.

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, '');
    else e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function text(v) {
  if (v === undefined || v === null || v === '') return '—';
  return String(v);
}

export function stepName(step) {
  if (!step || typeof step !== 'object' || !step.step) return '';
  return step.interface ? `${step.interface}.${step.step}` : String(step.step);
}

export function duration(seconds) {
  if (seconds === undefined || seconds === null) return '';
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function bytes(n) {
  if (typeof n !== 'number') return text(n);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// A running step's progress as its agent reported it (`clean_step.progress` /
// `deploy_step.progress`: done, total, message, rate): the percentage when the total is known,
// and a short text.
export function stepProgress(step) {
  const p = step && step.progress;
  if (!p || typeof p !== 'object') return null;
  const done = Number(p.done) || 0;
  const total = Number(p.total) || 0;
  const pct = total > 0 ? Math.min(100, Math.floor((done * 100) / total)) : null;
  const parts = [];
  if (pct !== null) parts.push(`${pct} %`);
  if (p.message) parts.push(String(p.message));
  if (p.rate) parts.push(`${bytes(Number(p.rate))}/s`);
  return { pct, text: parts.join(', ') };
}

// The step's name with a small progress bar after it (the bar only when the total is known).
export function stepCell(step) {
  const name = stepName(step);
  const p = stepProgress(step);
  if (!name || !p) return [name];
  const out = [name];
  if (p.pct !== null) {
    const fill = el('i');
    fill.style.width = `${p.pct}%`;
    out.push(el('span', { class: 'progress', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': p.pct }, fill));
  }
  out.push(' ', el('span', { 'data-field': 'progress', 'data-pct': p.pct === null ? '' : p.pct }, p.text));
  return out;
}

// A step with a progress event merged in (`{step, progress}` from /ui/events), when the event
// is about this step; else the step unchanged.
export function withProgress(step, ev) {
  if (!step || typeof step !== 'object' || !step.step) return step;
  if (ev.step && ev.step !== step.step) return step;
  return { ...step, progress: ev.progress };
}
