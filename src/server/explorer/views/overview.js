// Overview: every tree with its counts and depth histogram, the bank's
// sizes, WAL, last checkpoint and thresholds (GET /v1/stats, /v1/bank).
import { api } from '../api.js';
import { formatBytes, h, legend } from '../dom.js';
import { barChart } from '../plot.js';

const COUNTS = [
  ['nodes', 'nodes'], ['roots', 'roots'], ['residuals', 'residuals'], ['successes', 'successes'],
  ['failures', 'failures'], ['consolidated', 'consolidated'], ['consolidated_roots', 'consolidated roots'],
  ['due_for_consolidation', 'due'],
];

function treeCard(tree) {
  const histogram = (tree.depth_histogram || []).map((count, i) => ({ label: String(i + 1), value: count, title: `depth ${i + 1}: ${count} nodes` }));
  return h('section.card.tree-card', { dataset: { tree: tree.name } },
    h('h3', {}, h('a', { href: `#/tree/${encodeURIComponent(tree.name)}` }, `tree ${tree.name}`), h('span.muted', {}, ` τ ${tree.tau}`)),
    h('table.counts', {}, h('tbody', {}, COUNTS.map(([key, title]) =>
      h('tr', {}, h('th', {}, title), h('td', { dataset: { count: key } }, String(tree[key] ?? '—')))))),
    h('div.chart-box', {}, h('div.muted', {}, 'depth histogram'), barChart(histogram, { width: 300, height: 150, xTitle: 'depth' })));
}

function bankCard(stats, bank) {
  const per = stats.bytes_per_node || {};
  const rows = [
    ['nodes', stats.nodes],
    ['dimension', `${stats.dim} (${stats.precision}, scan kernel ${stats.kernel ?? '—'})`],
    ['thresholds', `ε ${stats.eps} · max depth ${stats.max_depth} · consolidate after ${stats.consolidate_after} hits`],
    ['trees', (bank.trees || stats.trees).map((t) => `${t.name} (τ ${t.tau})`).join(', ')],
    ['bytes per node', `${Math.round(per.total ?? 0)} total: vectors ${Math.round(per.vectors ?? 0)}, table ${Math.round(per.table ?? 0)}, payloads ${Math.round(per.payload ?? 0)}`],
    ['files', `vectors ${formatBytes(stats.vector_bytes)}, table ${formatBytes(stats.table_bytes)}, payloads ${formatBytes(stats.payload_bytes)}`],
    ['WAL', formatBytes(stats.wal_bytes)],
    ['last checkpoint', `LSN ${stats.checkpoint_lsn} (${stats.checkpointed_nodes ?? '—'} nodes in the data files)`],
    ['mode', [stats.frozen ? 'frozen' : 'live', bank.read_only ? 'served read-only' : 'served writable', bank.agent ? 'agent feature on' : 'agent feature off'].join(' · ')],
  ];
  return h('section.card.bank-card', {}, h('h3', {}, 'bank'),
    h('table.kv', {}, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, String(v)))))));
}

export async function render(container, _args, state) {
  const draw = async (bank) => {
    const stats = await api.stats();
    container.replaceChildren(
      h('h2', {}, 'Overview'),
      h('div.cards', {}, bankCard(stats, bank || state.bank), ...stats.trees.map(treeCard)),
      legend());
  };
  await draw(state.bank);
  return { refresh: draw };
}
