// Node page: everything stored about one node, its chain, and the chain
// as the agent's prompt shows it (the server's `chain --render` text).
import { api } from '../api.js';
import { badge, createdMs, formatTime, h, kindClasses, nodeLink } from '../dom.js';

// Fields written by the memory loop that the prompt never shows; they get
// their own sections here (src/agent/prompts.rs HIDDEN_FIELDS).
const TRAJECTORY = 'trajectory';
const PROVENANCE = 'provenance';

function provenanceSection(text) {
  if (text === undefined) return h('p.muted', {}, 'no provenance recorded (imported or inserted by hand)');
  let parsed = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  if (!parsed || typeof parsed !== 'object') return h('p', {}, text);
  const names = { episode: 'episode', extractor: 'extractor model', prompt: 'prompt kind', embedder: 'embedder', outcome: 'outcome', source: 'distilled from node', chain: 'chain', unix_ms: 'written' };
  return h('table.kv.provenance', {}, h('tbody', {}, Object.entries(parsed).map(([key, value]) => {
    let shown = typeof value === 'object' ? JSON.stringify(value) : String(value);
    if (key === 'unix_ms') shown = formatTime(value);
    const cell = key === 'source' && Number.isInteger(value) ? nodeLink(value) : shown;
    return h('tr', {}, h('th', {}, names[key] || key), h('td', {}, cell));
  })));
}

function payloadSection(node) {
  const fields = Object.entries(node.payload || {}).filter(([k]) => k !== TRAJECTORY && k !== PROVENANCE);
  return h('dl.payload', {},
    h('dt', {}, 'scenario'), h('dd', { dataset: { field: 'scenario' } }, node.scenario ?? ''),
    fields.flatMap(([key, value]) => [h('dt', {}, key), h('dd', { dataset: { field: key } }, typeof value === 'string' ? value : JSON.stringify(value, null, 2))]));
}

// The link of a consolidation, both ways: a consolidated node names the
// root distilled from its chain, a consolidated root its source node.
function consolidationLinks(node) {
  const link = node.link ?? node.consolidated_into ?? node.distilled_from ?? null;
  if (node.consolidated) {
    return h('p', {}, 'Consolidated: its chain was distilled into root ', link !== null ? nodeLink(link) : '(not named by the server)', '.');
  }
  if (node.consolidated_root) {
    return h('p', {}, 'Consolidated root: distilled from the chain of ', link !== null ? nodeLink(link) : '(not named by the server)', '.');
  }
  return null;
}

function facts(node) {
  const rows = [
    ['type', badge(node)],
    ['tree', h('a', { href: `#/tree/${encodeURIComponent(node.tree)}/${node.id}` }, node.tree)],
    ['depth', node.depth],
    ['external id', node.external_id || '—'],
    ['created', formatTime(createdMs(node))],
    ['success hits', node.success_hits],
    ['retrievals', node.retrievals],
    ['flags', [node.consolidated && 'consolidated', node.consolidated_root && 'consolidated root'].filter(Boolean).join(', ') || 'none'],
    ['parent', node.parent === null || node.parent === undefined ? 'none (top-level root)' : nodeLink(node.parent)],
  ];
  return h('table.kv.facts', {}, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', { dataset: { fact: k } }, v)))));
}

function chainList(chain) {
  return h('ol.chain', {}, chain.map((c) => h(`li.${kindClasses(c).join('.')}`, {},
    nodeLink(c.id), ' ', badge(c), ' ', h('span', {}, (c.payload && c.payload.activation_condition) || c.scenario || ''))));
}

export async function render(container, args) {
  const ref = args[0];
  const [node, chain, rendered, children] = await Promise.all([
    api.node(ref), api.chain(ref), api.renderedChain(ref), api.children(ref),
  ]);
  const trajectory = (node.payload || {})[TRAJECTORY];
  container.replaceChildren(
    h('h2', {}, `Node #${node.id} `, h('span.muted', {}, `in tree ${node.tree}`)),
    h('div.node-grid', {},
      h('section.card', {}, h('h3', {}, 'node'), facts(node), consolidationLinks(node)),
      h('section.card', {}, h('h3', {}, 'provenance'), provenanceSection((node.payload || {})[PROVENANCE]))),
    h('section.card', {}, h('h3', {}, 'payload'), payloadSection(node),
      trajectory === undefined ? null : h('details.trajectory', {}, h('summary', {}, `raw trajectory (${trajectory.length} characters)`), h('pre', {}, trajectory))),
    h('section.card', {}, h('h3', {}, `chain from the root (${chain.chain.length} nodes)`), chainList(chain.chain)),
    h('section.card', {}, h('h3', {}, 'as the agent sees it'), h('pre#rendered-chain.rendered', {}, rendered.text)),
    h('section.card', {}, h('h3', {}, `children (${children.children.length})`),
      children.children.length === 0 ? h('p.muted', {}, 'none') :
        h('ul.children', {}, children.children.map((c) => h('li', {}, nodeLink(c.id), ' ', badge(c), ' ', c.title || ''))))
  );
  return {};
}
