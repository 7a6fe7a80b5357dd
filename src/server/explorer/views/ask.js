// Ask the memory: with the agent feature, what `retrieve` returns for a
// task and an environment; always, the top-k neighbours of a pasted
// vector or of a node's own embedding (what `deltamem query` returns).
import { api, nodeEmbedding } from '../api.js';
import { badge, errorBox, h, nodeLink } from '../dom.js';

function matchesTable(matches) {
  if (matches.length === 0) return h('p.muted', {}, 'no node scores at or above the threshold');
  return h('table.matches', {},
    h('thead', {}, h('tr', {}, ['rank', 'node', 'score', 'kind', 'depth', 'chain'].map((t) => h('th', {}, t)))),
    h('tbody', {}, matches.map((m, i) => h('tr', { dataset: { id: m.id, score: m.score } },
      h('td', {}, String(i + 1)), h('td', {}, nodeLink(m.id)), h('td.score', {}, m.score.toFixed(4)),
      h('td', {}, badge(m)), h('td', {}, String(m.depth)),
      h('td', {}, m.chain.map((id, j) => [j ? ' → ' : '', nodeLink(id)]))))));
}

function parseVector(text, dim) {
  const values = text.trim().replace(/^\[|\]$/g, '').split(/[\s,]+/).filter(Boolean).map(Number);
  const bad = values.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) throw new Error(`component ${bad} of the vector is not a finite number`);
  if (values.length !== dim) throw new Error(`the vector has ${values.length} components; the bank's dimension is ${dim}`);
  return values;
}

function neighbourForm(bank, out) {
  const tree = h('select', { name: 'tree' }, bank.trees.map((t) => h('option', { value: t.name }, `${t.name} (τ ${t.tau})`)));
  const k = h('input', { name: 'k', type: 'number', min: 1, max: 1000, value: 10 });
  const tau = h('input', { name: 'tau', type: 'number', step: '0.01', min: -1, max: 1, placeholder: 'tree τ' });
  const node = h('input', { name: 'node', placeholder: 'node id or external id' });
  const vector = h('textarea', { name: 'vector', rows: 3, placeholder: `or paste ${bank.dim} numbers` });
  const submit = async (event) => {
    event.preventDefault();
    out.replaceChildren(h('p.muted', {}, 'asking…'));
    try {
      let embedding;
      let what;
      if (node.value.trim()) {
        const source = await nodeEmbedding(node.value.trim());
        embedding = source.embedding;
        what = [`neighbours of node `, nodeLink(source.id), ` (${source.tree})`];
      } else {
        embedding = parseVector(vector.value, bank.dim);
        what = ['neighbours of the pasted vector'];
      }
      const body = { embedding, k: Number(k.value) };
      if (tau.value !== '') body.tau = Number(tau.value);
      const answer = await api.query(tree.value, body);
      out.replaceChildren(h('h3', {}, ...what, ` in tree ${tree.value}`), matchesTable(answer.matches));
      out.dataset.answered = 'true';
    } catch (error) {
      out.replaceChildren(errorBox(error));
    }
  };
  return h('form#neighbours.ask', { onsubmit: submit },
    h('h3', {}, 'Neighbours of a node or a vector'),
    h('div.row', {}, h('label', {}, 'tree ', tree), h('label', {}, 'k ', k), h('label', {}, 'τ ', tau)),
    h('div.row', {}, h('label', {}, 'node ', node)), h('div.row', {}, vector),
    h('button', { type: 'submit' }, 'Find neighbours'));
}

function retrieved(found) {
  const chainCard = (name, m) => h('section.card', { dataset: { tree: name, node: m ? m.node : '', chain: m ? JSON.stringify(m.chain) : '[]' } }, h('h3', {}, `${name} tree`),
    m ? [h('p', {}, 'best node ', nodeLink(m.node), ` score ${m.score.toFixed(4)}, depth ${m.depth}, ${m.node_type} ${m.label}; chain `,
      m.chain.map((id, j) => [j ? ' → ' : '', nodeLink(id)]))] : h('p.muted', {}, 'nothing at or above the threshold'));
  return [chainCard('task', found.task), chainCard('env', found.env),
    h('section.card', {}, h('h3', {}, 'rendered context'), h('pre#retrieved-context.rendered', {}, found.context || '(empty: nothing matched)'))];
}

function retrieveForm(out) {
  const task = h('textarea', { name: 'task', rows: 3, placeholder: 'the task, as the agent is given it' });
  const env = h('textarea', { name: 'env', rows: 3, placeholder: 'the environment description' });
  const submit = async (event) => {
    event.preventDefault();
    out.replaceChildren(h('p.muted', {}, 'retrieving…'));
    try {
      out.replaceChildren(...retrieved(await api.retrieve(task.value, env.value)));
      out.dataset.answered = 'true';
    } catch (error) {
      out.replaceChildren(errorBox(error));
    }
  };
  return h('form#retrieve.ask', { onsubmit: submit }, h('h3', {}, 'What would the agent be shown?'),
    h('label.block', {}, 'task', task), h('label.block', {}, 'environment', env), h('button', { type: 'submit' }, 'Retrieve'));
}

export async function render(container, _args, state) {
  const bank = state.bank;
  const retrieveOut = h('div#retrieve-answer.answer');
  const neighbourOut = h('div#neighbour-answer.answer');
  container.replaceChildren(
    h('h2', {}, 'Ask the memory'),
    bank.agent ? h('div.retrieve', {}, retrieveForm(retrieveOut), retrieveOut)
      : h('p.muted', {}, 'This server was built without the agent feature: task and environment retrieval is off. Neighbour search works on stored vectors.'),
    neighbourForm(bank, neighbourOut), neighbourOut);
  return {};
}
