// Thin wrappers over the HTTP API of `deltamem serve` (docs/SERVER.md).
// Every call throws an Error carrying the server's message on failure.

async function call(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    throw new Error(`${method} ${path}: ${response.status}, not JSON: ${text.slice(0, 200)}`);
  }
  if (!response.ok) {
    throw new Error(`${method} ${path}: ${response.status} ${data && data.error ? data.error : text}`);
  }
  return data;
}

const enc = encodeURIComponent;
const SUMMARY_PAGE = 5000;

export const api = {
  bank: () => call('GET', '/v1/bank'),
  stats: () => call('GET', '/v1/stats'),
  node: (ref) => call('GET', `/v1/nodes/${enc(ref)}`),
  chain: (ref) => call('GET', `/v1/nodes/${enc(ref)}/chain`),
  renderedChain: (ref) => call('GET', `/v1/nodes/${enc(ref)}/chain?render=true`),
  children: (ref) => call('GET', `/v1/nodes/${enc(ref)}/children`),
  search: (tree, q, limit = 50) => call('GET', `/v1/search?tree=${enc(tree)}&q=${enc(q)}&limit=${limit}`),
  query: (tree, body) => call('POST', `/v1/trees/${enc(tree)}/query`, body),
  retrieve: (task, env) => call('POST', '/v1/retrieve', { task, env }),
  nodesPage: (tree, offset, limit) =>
    call('GET', `/v1/trees/${enc(tree)}/nodes?offset=${offset}&limit=${limit}`),
};

// Every node summary of a tree from `offset` on, page by page (bounded by
// the total the server reports, so a growing tree cannot loop forever).
export async function treeSummaries(tree, offset = 0) {
  const first = await api.nodesPage(tree, offset, SUMMARY_PAGE);
  const nodes = first.nodes.slice();
  const pages = Math.ceil(Math.max(0, first.total - offset) / SUMMARY_PAGE);
  for (let page = 1; page < pages && nodes.length + offset < first.total; page++) {
    const next = await api.nodesPage(tree, offset + nodes.length, SUMMARY_PAGE);
    if (next.nodes.length === 0) break;
    nodes.push(...next.nodes);
  }
  return nodes;
}

// A node's stored (normalised) embedding, for "find its neighbours".
export async function nodeEmbedding(ref) {
  const node = await call('GET', `/v1/nodes/${enc(ref)}?embedding=true`);
  if (!Array.isArray(node.embedding)) throw new Error(`the server sent no embedding for node ${ref}`);
  return node;
}
