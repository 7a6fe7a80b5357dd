// History: per tree, nodes over time (creation times), consolidations as
// events on that time line, and success hits per node.
import { treeSummaries } from '../api.js';
import { createdMs, h } from '../dom.js';
import { barChart, stepChart } from '../plot.js';

const TOP_HIT_NODES = 40;

function growth(nodes) {
  const times = nodes.map(createdMs).filter((t) => t).sort((a, b) => a - b);
  return times.map((t, i) => ({ t, n: i + 1 }));
}

function consolidations(nodes) {
  return nodes.filter((n) => n.consolidated_root && createdMs(n)).map((n) => ({
    t: createdMs(n), href: `#/node/${n.id}`, title: `consolidated root #${n.id} created ${new Date(createdMs(n)).toISOString()}`,
  }));
}

function hits(nodes) {
  return nodes.filter((n) => n.success_hits > 0)
    .sort((a, b) => b.success_hits - a.success_hits || a.id - b.id)
    .slice(0, TOP_HIT_NODES)
    .map((n) => ({ label: `#${n.id}`, value: n.success_hits, href: `#/node/${n.id}`, title: `#${n.id}: ${n.success_hits} success hits, ${n.retrievals} retrievals` }));
}

function treeSection(name, nodes) {
  const events = consolidations(nodes);
  const hitBars = hits(nodes);
  const undated = nodes.filter((n) => !createdMs(n)).length;
  return h('section.card.history', { dataset: { tree: name } },
    h('h3', {}, `tree ${name}`),
    h('div.muted', {}, `nodes over time (${nodes.length}${undated ? `, ${undated} without a creation time` : ''}); gold marks: ${events.length} consolidations`),
    stepChart(growth(nodes), events, { width: 560, height: 200, className: 'growth' }),
    h('div.muted', {}, hitBars.length ? `success hits per node (top ${hitBars.length})` : 'no success hits counted yet'),
    hitBars.length ? barChart(hitBars, { width: 560, height: 170, className: 'hits' }) : null);
}

export async function render(container, _args, state) {
  const draw = async (bank) => {
    const trees = (bank || state.bank).trees.map((t) => t.name);
    const all = await Promise.all(trees.map((t) => treeSummaries(t)));
    container.replaceChildren(h('h2', {}, 'History'), h('div.cards', {}, trees.map((t, i) => treeSection(t, all[i]))));
  };
  await draw(state.bank);
  return { refresh: draw };
}
