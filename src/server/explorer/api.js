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
// The server's page limit (docs/SERVER.md: at most 1000 items a page).
const SUMMARY_PAGE = 1000;
// Pages asked for at once after the first.
const PAGE_CONCURRENCY = 4;

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
  history: (tree) => call('GET', `/v1/trees/${enc(tree)}/history`),
  nodesPage: (tree, offset, limit) =>
    call('GET', `/v1/trees/${enc(tree)}/nodes?offset=${offset}&limit=${limit}`),
};

// Every node summary of a tree from `offset` on. The first page gives the
// total; the other pages are asked for a few at a time and put back in
// order. Nodes added meanwhile are left for the next refresh.
export async function treeSummaries(tree, offset = 0) {
  const first = await api.nodesPage(tree, offset, SUMMARY_PAGE);
  const offsets = [];
  for (let at = offset + first.nodes.length; first.nodes.length > 0 && at < first.total; at += SUMMARY_PAGE) offsets.push(at);
  const pages = new Array(offsets.length);
  let next = 0;
  const worker = async () => {
    while (next < offsets.length) {
      const slot = next++;
      pages[slot] = (await api.nodesPage(tree, offsets[slot], SUMMARY_PAGE)).nodes;
    }
  };
  await Promise.all(Array.from({ length: PAGE_CONCURRENCY }, worker));
  return first.nodes.concat(...pages);
}

// A node's stored (normalised) embedding, for "find its neighbours".
export async function nodeEmbedding(ref) {
  const node = await call('GET', `/v1/nodes/${enc(ref)}?embedding=true`);
  if (!Array.isArray(node.embedding)) throw new Error(`the server sent no embedding for node ${ref}`);
  return node;
}
