// Tree view: an interactive drawing of one tree. The tree's outline
// (ids, parents, kinds; no payloads) is loaded page by page, and the
// titles only of the nodes drawn with labels; what is drawn is only the
// expanded part,
// laid out by d3-hierarchy's tidy tree and panned/zoomed by d3-zoom.
// Nodes are written as one SVG string per redraw: at 10k nodes that is
// several times faster than creating elements one by one.
import { tree as tidyTree, hierarchy } from 'd3-hierarchy';
import { pointer, select } from 'd3-selection';
import { zoom, zoomIdentity, zoomTransform } from 'd3-zoom';
import { api, summariesOf, treeOutline } from '../api.js';
import { errorBox, h, kindClasses, legend } from '../dom.js';

const NODE_W = 230;
const NODE_H = 34;
const ROW_H = 42;
const COL_W = 280;
const TITLE_CHARS = 34;
// Open everything up to this many drawn nodes; deeper levels start
// collapsed and open on a click (lazy expansion).
const INITIAL_VISIBLE = 12000;
// Above this many drawn nodes only those in view are put into the DOM;
// above LABELLED_MAX in view, they are drawn as boxes without text.
const WINDOW_FROM = 1500;
const LABELLED_MAX = 1200;
// Titles kept at most (a few hundred bytes each) while the view pans.
const TITLES_KEPT = 20000;

const escapeXml = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const cut = (text, n) => {
  const flat = String(text ?? '').replace(/\s+/g, ' ').trim();
  return flat.length <= n ? flat : `${flat.slice(0, n - 1)}…`;
};

// The tree's nodes by id with their children, top-level roots in order,
// from the pages of its outline (`kinds` bits: 1 residual, 2 failure,
// 4 consolidated, 8 consolidated root).
export function index(pages) {
  const byId = new Map();
  for (const p of pages) {
    for (let i = 0; i < p.ids.length; i++) {
      const kind = p.kinds[i];
      byId.set(p.ids[i], {
        id: p.ids[i], parent: p.parents[i], depth: p.depths[i], success_hits: p.success_hits[i],
        type: kind & 1 ? 'RESIDUAL' : 'ROOT', label: kind & 2 ? 'FAILURE' : 'SUCCESS',
        consolidated: (kind & 4) !== 0, consolidated_root: (kind & 8) !== 0, kids: [],
      });
    }
  }
  const roots = [];
  for (const n of byId.values()) {
    const parent = n.parent === null || n.parent === undefined ? null : byId.get(n.parent);
    if (parent) parent.kids.push(n);
    else roots.push(n);
  }
  return { byId, roots };
}

// Breadth-first: open nodes while the drawn count stays within budget.
function initialExpansion(model, budget) {
  const open = new Set();
  let visible = model.roots.length;
  let level = model.roots;
  while (level.length > 0) {
    const next = [];
    for (const n of level) {
      if (n.kids.length === 0) continue;
      if (visible + n.kids.length > budget) return open;
      open.add(n.id);
      visible += n.kids.length;
      next.push(...n.kids);
    }
    level = next;
  }
  return open;
}

function countBelow(n) {
  let count = 0;
  const stack = [...n.kids];
  while (stack.length) {
    const k = stack.pop();
    count++;
    stack.push(...k.kids);
  }
  return count;
}

// `known`: the node's summary (title, external id) once fetched, or the
// error that kept it from being fetched.
function nodeSvg(d, known) {
  const n = d.data;
  const failed = known instanceof Error;
  const text = known === undefined ? '…' : failed ? `(title not loaded: ${known.message})` : known.title;
  const externalId = known && !failed ? known.external_id : null;
  const x = d.y - NODE_W / 2 + COL_W / 2;
  const y = d.x - NODE_H / 2;
  const corner = n.type === 'ROOT' ? 8 : 2;
  const caption = `#${n.id} ${n.type} d${n.depth}${n.success_hits ? ` hits ${n.success_hits}` : ''}`;
  const title = `${caption} ${n.label}${externalId ? ` · ${externalId}` : ''}: ${cut(text, 300)}`;
  let toggle = '';
  if (n.kids.length > 0) {
    const closed = !d.children;
    const sign = closed ? `+${countBelow(n)}` : '−';
    toggle = `<g class="toggle" data-toggle="${n.id}" transform="translate(${NODE_W + 4},${NODE_H / 2})"><circle r="9"/><text text-anchor="middle" y="4">${closed ? escapeXml(sign.length > 4 ? '+' : sign) : sign}</text></g>`;
  }
  return `<g class="node ${kindClasses(n).join(' ')}" data-id="${n.id}" transform="translate(${x},${y})">` +
    `<title>${escapeXml(title)}</title><rect width="${NODE_W}" height="${NODE_H}" rx="${corner}"/>` +
    (n.consolidated_root ? `<rect class="inner" x="3" y="3" width="${NODE_W - 6}" height="${NODE_H - 6}" rx="${corner - 2}"/>` : '') +
    `<text class="caption" x="6" y="12">${escapeXml(caption)}</text>` +
    `<text class="title" x="6" y="27">${escapeXml(cut(text, TITLE_CHARS))}</text>${toggle}</g>`;
}

// The tree's name where its top-level roots hang, as `draw` shows it.
function virtualRootSvg(layout, name) {
  const cx = layout.y + COL_W / 2 + NODE_W / 2 - 60;
  return `<g class="virtual-root"><ellipse cx="${cx}" cy="${layout.x}" rx="60" ry="16"/>` +
    `<text x="${cx}" y="${layout.x + 4}" text-anchor="middle">${escapeXml(cut(name, 16))}</text></g>`;
}

function edgePath(source, target) {
  const x0 = source.y + COL_W / 2 + NODE_W / 2;
  const x1 = target.y + COL_W / 2 - NODE_W / 2;
  const xm = (x0 + x1) / 2;
  return `M${x0},${source.x}C${xm},${source.x} ${xm},${target.x} ${x1},${target.x}`;
}

// Zoomed far out, boxes without text: one path per node kind.
function compactSvg(nodes) {
  const paths = new Map();
  for (const d of nodes) {
    const key = kindClasses(d.data).join(' ');
    const x = d.y - NODE_W / 2 + COL_W / 2;
    paths.set(key, (paths.get(key) || '') + `M${x},${d.x - NODE_H / 2}h${NODE_W}v${NODE_H}h${-NODE_W}z`);
  }
  return [...paths].map(([key, d]) => `<g class="node-block ${key}"><path d="${d}"/></g>`).join('');
}

class TreeDrawing {
  constructor(host, name, onOpen, maxBatch) {
    this.name = name;
    this.onOpen = onOpen;
    this.svg = select(host).append('svg').attr('class', 'tree-canvas');
    this.viewport = this.svg.append('g').attr('class', 'viewport');
    this.edges = this.viewport.append('path').attr('class', 'edges');
    this.nodes = this.viewport.append('g').attr('class', 'nodes');
    this.zoom = zoom().scaleExtent([0.02, 3]).on('zoom', (e) => this.onZoom(e.transform));
    this.svg.call(this.zoom).on('dblclick.zoom', null);
    this.nodes.on('click', (e) => this.click(e));
    this.open = new Set();
    this.focused = null;
    // Summaries (or the error of their fetch) by node id, for the nodes
    // drawn with labels; emptied at each refresh (an error is then asked
    // again, and a read-only server may have moved to another bank) and
    // when it outgrows TITLES_KEPT. `loading` is the fetch under way.
    this.titles = new Map();
    this.loading = null;
    this.maxBatch = maxBatch;
  }

  // Fetches the titles of labelled nodes not known yet, then paints again.
  want(nodes) {
    if (this.loading) return;
    const ids = nodes.map((d) => d.data.id).filter((id) => !this.titles.has(id));
    if (ids.length === 0) return;
    if (this.titles.size + ids.length > TITLES_KEPT) this.titles.clear();
    // A failed id keeps its error until the next refresh: not asked again
    // at every paint.
    this.loading = summariesOf(ids, this.maxBatch)
      .then((found) => { for (const id of ids) this.titles.set(id, found.get(id) ?? new Error('the server sent none')); })
      .finally(() => {
        this.loading = null;
        this.paint();
      });
  }

  // Resolves once the titles of the nodes drawn with labels are in.
  async settled() {
    while (this.loading) await this.loading;
  }

  setModel(model, keepOpen) {
    this.model = model;
    if (!keepOpen) this.open = initialExpansion(model, INITIAL_VISIBLE);
  }

  click(event) {
    const toggle = event.target.closest('[data-toggle]');
    if (toggle) {
      const id = Number(toggle.dataset.toggle);
      if (this.open.has(id)) this.open.delete(id);
      else this.open.add(id);
      this.draw();
      return;
    }
    const node = event.target.closest('.node');
    if (node) this.onOpen(Number(node.dataset.id));
    else if (this.compact) this.svg.call(this.zoom.scaleTo, 1, pointer(event, this.svg.node()));
  }

  draw() {
    const top = { id: -1, virtual: true, kids: this.model.roots };
    const root = hierarchy(top, (n) => (n.virtual || this.open.has(n.id) ? n.kids : null));
    this.layout = tidyTree().nodeSize([ROW_H, COL_W]).separation((a, b) => (a.parent === b.parent ? 1 : 1.25))(root);
    this.drawn = this.layout.descendants().filter((d) => !d.data.virtual);
    this.drawnCount = this.drawn.length;
    this.windowed = this.drawn.length > WINDOW_FROM;
    this.bounds = this.drawn.reduce((b, d) => ({
      x0: Math.min(b.x0, d.y), x1: Math.max(b.x1, d.y + COL_W), y0: Math.min(b.y0, d.x), y1: Math.max(b.y1, d.x),
    }), { x0: this.layout.y + COL_W / 2 + NODE_W / 2 - 130, x1: -Infinity, y0: Infinity, y1: -Infinity });
    this.paint();
  }

  // The nodes inside the canvas (plus a margin) under the current zoom.
  inWindow() {
    const t = zoomTransform(this.svg.node());
    const { width, height } = this.svg.node().getBoundingClientRect();
    const margin = 200 / t.k;
    const [x0, x1] = [-t.x / t.k - margin, (width - t.x) / t.k + margin];
    const [y0, y1] = [-t.y / t.k - margin, (height - t.y) / t.k + margin];
    return this.drawn.filter((d) => d.y + COL_W >= x0 && d.y <= x1 && d.x >= y0 && d.x <= y1);
  }

  // Puts the drawing into the DOM: all of it for a small tree; for a big
  // one only what the canvas shows (redone as the view pans and zooms),
  // as text-less boxes when more than LABELLED_MAX nodes are in view.
  paint() {
    const nodes = this.windowed ? this.inWindow() : this.drawn;
    this.compact = nodes.length > LABELLED_MAX;
    let edges = '';
    for (const d of nodes) if (d.parent) edges += edgePath(d.parent, d);
    this.edges.attr('d', edges);
    if (!this.compact) this.want(nodes);
    const body = this.compact ? compactSvg(nodes) : nodes.map((d) => nodeSvg(d, this.titles.get(d.data.id))).join('');
    this.nodes.html(virtualRootSvg(this.layout, this.name) + body);
    this.paintedCount = this.compact ? 0 : nodes.length;
    if (this.focused !== null) this.mark(this.focused);
  }

  onZoom(transform) {
    this.viewport.attr('transform', transform);
    if (!this.windowed || this.paintPending) return;
    this.paintPending = true;
    requestAnimationFrame(() => {
      this.paintPending = false;
      this.paint();
    });
  }

  // Fit the whole drawing (never enlarged past 1:1) into the canvas.
  fit() {
    const { width, height } = this.svg.node().getBoundingClientRect();
    const b = this.bounds;
    if (!Number.isFinite(b.x0)) return;
    const scale = Math.min(1, width / (b.x1 - b.x0 + 40), height / (b.y1 - b.y0 + NODE_H + 40));
    const fitted = Math.max(scale, 0.35);
    const tx = 20 - b.x0 * fitted;
    const ty = scale >= 0.35 ? height / 2 - ((b.y0 + b.y1) / 2) * fitted : 20 - (b.y0 - NODE_H) * fitted;
    this.svg.call(this.zoom.transform, zoomIdentity.translate(tx, ty).scale(fitted));
  }

  mark(id) {
    for (const el of this.nodes.node().querySelectorAll('.node.focused')) el.classList.remove('focused');
    const el = this.nodes.node().querySelector(`.node[data-id="${id}"]`);
    if (el) el.classList.add('focused');
  }

  // Open every ancestor of a node, redraw, and bring it to the centre.
  focus(id) {
    const n = this.model.byId.get(id);
    if (!n) return false;
    for (let p = this.model.byId.get(n.parent); p; p = this.model.byId.get(p.parent)) this.open.add(p.id);
    this.focused = id;
    this.draw();
    const d = this.layout.descendants().find((x) => x.data.id === id);
    const { width, height } = this.svg.node().getBoundingClientRect();
    const scale = 1;
    this.svg.call(this.zoom.transform, zoomIdentity.translate(width / 2 - (d.y + COL_W / 2) * scale, height / 2 - d.x * scale).scale(scale));
    return true;
  }

  setAll(open) {
    this.open = new Set(open ? [...this.model.byId.values()].filter((n) => n.kids.length).map((n) => n.id) : []);
    this.draw();
    this.fit();
  }
}

// Search results stay listed; picking one focuses it in the drawing and
// records it in the address without re-rendering the view.
function searchBox(treeName, drawing, results) {
  const input = h('input', { type: 'search', id: 'tree-search', placeholder: 'node id, external id or scenario text', size: 36 });
  const pick = (id) => {
    drawing.focus(id);
    history.replaceState(null, '', `#/tree/${encodeURIComponent(treeName)}/${id}`);
  };
  const item = (n) => h('li', {},
    h('a', { href: `#/tree/${encodeURIComponent(treeName)}/${n.id}`, dataset: { id: n.id }, onclick: (e) => { e.preventDefault(); pick(n.id); } }, `#${n.id}`),
    ' ', h('span.muted', {}, n.external_id || ''), ' ', cut(n.title, 80), ' ', h('a', { href: `#/node/${n.id}` }, 'open'));
  const run = async (event) => {
    event.preventDefault();
    const q = input.value.trim();
    if (!q) return;
    results.replaceChildren(h('span.muted', {}, 'searching…'));
    try {
      const found = (await api.search(treeName, q, 50)).nodes;
      results.replaceChildren(
        h('div.muted', {}, found.length ? `${found.length} found${found.length === 50 ? ' (first 50)' : ''}` : 'nothing found'),
        h('ol.search-results', {}, found.map(item)));
      if (found.length > 0) pick(found[0].id);
      results.dataset.done = 'true';
    } catch (error) {
      results.replaceChildren(errorBox(error));
    }
  };
  return h('form.search', { onsubmit: run }, input, h('button', { type: 'submit' }, 'Search'));
}

export async function render(container, args, state) {
  const names = state.bank.trees.map((t) => t.name);
  const name = args[0] && names.includes(args[0]) ? args[0] : names[0];
  const focusId = args[1] !== undefined && args[1] !== '' ? Number(args[1]) : null;
  const started = performance.now();
  const model = index(await treeOutline(name));
  const results = h('div.search-box');
  const canvas = h('div.canvas-host');
  const info = h('span.muted.tree-info');
  const drawing = new TreeDrawing(canvas, name, (id) => { location.hash = `#/node/${id}`; }, state.bank.max_batch);
  const tabs = h('div.tabs', {}, names.map((n) => h(`a${n === name ? '.active' : ''}`, { href: `#/tree/${encodeURIComponent(n)}` }, n)));
  const tools = h('div.tools', {},
    h('button', { type: 'button', onclick: () => drawing.setAll(true) }, 'Expand all'),
    h('button', { type: 'button', onclick: () => drawing.setAll(false) }, 'Collapse to roots'),
    h('button', { type: 'button', onclick: () => drawing.fit() }, 'Fit'));
  container.replaceChildren(
    h('div.tree-head', {}, h('h2', {}, `Tree ${name}`), tabs, searchBox(name, drawing, results), tools),
    h('div.tree-body', {}, canvas, results),
    h('div.tree-foot', {}, info, legend()));
  const describe = () => {
    info.textContent = `${model.byId.size} nodes, ${drawing.drawnCount} open${drawing.windowed ? ' (those in view are drawn)' : ''} · drag to pan, wheel to zoom, ± opens and closes a subtree, a click opens the node`;
  };
  drawing.setModel(model, false);
  drawing.draw();
  if (focusId === null || !drawing.focus(focusId)) drawing.fit();
  await drawing.settled();
  describe();
  container.dataset.renderMs = String(Math.round(performance.now() - started));
  return {
    async refresh() {
      const fresh = index(await treeOutline(name));
      // A new child of a drawn leaf is shown at once: its parent opens.
      for (const n of fresh.byId.values()) {
        const parent = model.byId.get(n.parent);
        if (!model.byId.has(n.id) && parent && parent.kids.length === 0) drawing.open.add(parent.id);
      }
      drawing.setModel(fresh, true);
      drawing.titles.clear();
      const transform = zoomTransform(drawing.svg.node());
      drawing.draw();
      drawing.svg.call(drawing.zoom.transform, transform);
      await drawing.settled();
      Object.assign(model, fresh);
      describe();
    },
  };
}
