// Small DOM helpers: every text goes in through textContent, never HTML.

// h('a#id.cls', {href: '#'}, 'text', child...) builds an element.
export function h(tag, attrs = {}, ...children) {
  const [head, ...classes] = tag.split('.');
  const [name, id] = head.split('#');
  const el = document.createElement(name);
  if (id) el.id = id;
  if (classes.length) el.className = classes.join(' ');
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) el.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

// The classes `deltamem draw` gives a node (src/cli/picture.rs), so the
// page tells kinds apart the same way: roots bold blue rounded, failures
// red, consolidated (distilled) nodes dashed, consolidated roots gold.
export function kindClasses(node) {
  const classes = [node.type === 'ROOT' ? 'root' : 'residual'];
  classes.push(node.label === 'FAILURE' ? 'failure' : 'success');
  if (node.consolidated) classes.push('consolidated');
  if (node.consolidated_root) classes.push('consolidated-root');
  return classes;
}

export function nodeLink(id, text) {
  return h('a.node-link', { href: `#/node/${id}`, dataset: { id } }, text ?? `#${id}`);
}

export function badge(node) {
  return h(`span.badge.${kindClasses(node).join('.')}`, {}, node.type, ' ', node.label);
}

export function createdMs(node) {
  return node.created_at_ms ?? node.created_unix_ms ?? null;
}

export function formatTime(ms) {
  if (ms === null || ms === undefined || ms === 0) return '—';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

export function errorBox(error) {
  return h('div.error', { role: 'alert' }, String(error.message || error));
}

export function legend() {
  const item = (classes, text) => h('span.legend-item', {}, h(`span.swatch.${classes}`), text);
  return h('div.legend', {},
    item('root.success', 'root'),
    item('residual.success', 'residual'),
    item('residual.failure', 'failure'),
    item('residual.success.consolidated', 'consolidated (distilled)'),
    item('root.success.consolidated-root', 'consolidated root'));
}
