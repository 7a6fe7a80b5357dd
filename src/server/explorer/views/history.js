// History: per tree, nodes over time (creation times), consolidations as
// events on that time line, and success hits per node. The server
// aggregates each tree (`/v1/trees/{tree}/history`): a few hundred
// samples, however many nodes the tree holds.
import { api } from '../api.js';
import { h } from '../dom.js';
import { barChart, stepChart } from '../plot.js';

function marks(history) {
  return history.consolidation_marks.map((m) => ({
    t: m.created_at_ms, href: `#/node/${m.id}`, title: `consolidated root #${m.id} created ${new Date(m.created_at_ms).toISOString()}`,
  }));
}

function hits(history) {
  return history.top_hits.map((n) => ({
    label: `#${n.id}`, value: n.success_hits, href: `#/node/${n.id}`, title: `#${n.id}: ${n.success_hits} success hits, ${n.retrievals} retrievals`,
  }));
}

function treeSection(name, history) {
  const events = marks(history);
  const hitBars = hits(history);
  const shown = events.length < history.consolidations ? ` (the newest ${events.length} marked)` : '';
  return h('section.card.history', { dataset: { tree: name } },
    h('h3', {}, `tree ${name}`),
    h('div.muted', {}, `nodes over time (${history.nodes}${history.undated ? `, ${history.undated} without a creation time` : ''}); gold marks: ${history.consolidations} consolidations${shown}`),
    stepChart(history.growth.map((p) => ({ t: p.t_ms, n: p.nodes })), events, { width: 560, height: 200, className: 'growth' }),
    h('div.muted', {}, hitBars.length ? `success hits per node (top ${hitBars.length})` : 'no success hits counted yet'),
    hitBars.length ? barChart(hitBars, { width: 560, height: 170, className: 'hits' }) : null);
}

export async function render(container, _args, state) {
  const draw = async (bank) => {
    const trees = (bank || state.bank).trees.map((t) => t.name);
    const all = await Promise.all(trees.map((t) => api.history(t)));
    container.replaceChildren(h('h2', {}, 'History'), h('div.cards', {}, trees.map((t, i) => treeSection(t, all[i]))));
  };
  await draw(state.bank);
  return { refresh: draw };
}
