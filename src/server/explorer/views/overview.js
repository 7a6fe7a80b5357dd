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

// Bytes per node from the file sizes when the stats do not carry them
// (the server's /v1/stats has the sizes only).
function perNode(stats) {
  if (stats.bytes_per_node) return stats.bytes_per_node;
  const n = Math.max(1, stats.nodes);
  const [vectors, table, payload] = [stats.vector_bytes / n, stats.table_bytes / n, stats.payload_bytes / n];
  return { vectors, table, payload, total: vectors + table + payload };
}

function bankCard(stats, bank) {
  const per = perNode(stats);
  const rows = [
    ['nodes', stats.nodes],
    ['dimension', `${stats.dim} (${stats.precision}${stats.kernel ? `, scan kernel ${stats.kernel}` : ''})`],
    ['thresholds', `ε ${bank.eps} · max depth ${bank.max_depth} · consolidate after ${bank.consolidate_after} hits`],
    ['trees', bank.trees.map((t) => `${t.name} (τ ${t.tau})`).join(', ')],
    ['bytes per node', `${Math.round(per.total)} total: vectors ${Math.round(per.vectors)}, table ${Math.round(per.table)}, payloads ${Math.round(per.payload)}`],
    ['files', `vectors ${formatBytes(stats.vector_bytes)}, table ${formatBytes(stats.table_bytes)}, payloads ${formatBytes(stats.payload_bytes)}`],
    ['WAL', formatBytes(stats.wal_bytes)],
    ['last checkpoint', `LSN ${stats.checkpoint_lsn} (${stats.checkpointed_nodes ?? '—'} nodes in the data files)`],
    ['mode', [stats.frozen ? 'frozen' : 'live', bank.read_only ? 'served read-only' : 'served writable', bank.agent ? 'agent feature on' : 'agent feature off'].join(' · ')],
  ];
  return h('section.card.bank-card', {}, h('h3', {}, 'bank'),
    h('table.kv', {}, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, String(v)))))));
}

export async function render(container) {
  const draw = async () => {
    const [stats, bank] = await Promise.all([api.stats(), api.bank()]);
    container.replaceChildren(
      h('h2', {}, 'Overview'),
      h('div.cards', {}, bankCard(stats, bank), ...stats.trees.map(treeCard)),
      legend());
  };
  await draw();
  return { refresh: draw };
}
