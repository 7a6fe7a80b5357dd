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
// Most ids per `/v1/summaries` request (fewer if the server's batch
// limit is lower).
const SUMMARY_BATCH = 500;
// Outline pages asked for at once after the first.
const PAGE_CONCURRENCY = 2;

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
  outline: (tree, offset) => call('GET', `/v1/trees/${enc(tree)}/outline?offset=${offset}`),
  summaries: (ids) => call('POST', '/v1/summaries', { ids }),
};

// A tree's whole shape (ids, parents, depths, hits, kinds; no payloads),
// a page of up to 100,000 nodes at a time: the first gives the total,
// the others are asked for a few at a time and put back in order. Nodes
// added meanwhile are left for the next refresh.
export async function treeOutline(tree) {
  const first = await api.outline(tree, 0);
  const offsets = [];
  for (let at = first.ids.length; first.ids.length > 0 && at < first.total; at += first.ids.length) offsets.push(at);
  const pages = new Array(offsets.length);
  let next = 0;
  const worker = async () => {
    while (next < offsets.length) {
      const slot = next++;
      pages[slot] = await api.outline(tree, offsets[slot]);
    }
  };
  await Promise.all(Array.from({ length: PAGE_CONCURRENCY }, worker));
  return [first, ...pages];
}

// Summaries (titles, external ids) of the nodes named, in requests of at
// most `maxBatch` ids (the server's `max_batch`, from /v1/bank). A batch
// that fails leaves the others' answers: each id maps to its summary or
// to the error of its batch.
export async function summariesOf(ids, maxBatch) {
  const batch = Math.max(1, Math.min(SUMMARY_BATCH, maxBatch || SUMMARY_BATCH));
  const out = new Map();
  for (let at = 0; at < ids.length; at += batch) {
    const part = ids.slice(at, at + batch);
    try {
      for (const s of (await api.summaries(part)).nodes) out.set(s.id, s);
    } catch (error) {
      for (const id of part) out.set(id, error);
    }
  }
  return out;
}

// A node's stored (normalised) embedding, for "find its neighbours".
export async function nodeEmbedding(ref) {
  const node = await call('GET', `/v1/nodes/${enc(ref)}?embedding=true`);
  if (!Array.isArray(node.embedding)) throw new Error(`the server sent no embedding for node ${ref}`);
  return node;
}
