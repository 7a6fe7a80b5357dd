// The explorer page in a real headless Chromium, against `deltamem serve`
// on a bank built from the reference ScienceWorld trees. Expected values
// come from the deltamem command line on the same bank, never from the page.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, test } from 'node:test';
import { launch, ready } from './browser.js';
import { AGENT_ENVS, AGENT_TASKS, buildAgentBank, buildBank, cli, CONSOLIDATED, jsonLines, screenshotPath, startServer } from './harness.js';

let bank;
let server;
let browser;
let page;
let nodes;

before(async () => {
  bank = buildBank();
  nodes = jsonLines(cli(['dump', bank.bank, '--embeddings']));
  server = await startServer(bank.bank);
  browser = await launch();
  page = await browser.context.newPage();
  page.on('pageerror', (error) => { throw error; });
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
  if (bank) fs.rmSync(bank.dir, { recursive: true, force: true });
});

// A full load each time: a hash-only change would not reload the page,
// and the previous view's ready flag could then be read.
async function open(route) {
  await page.goto('about:blank');
  await page.goto(`${server.url}#/${route}`);
  await ready(page);
}

const inTree = (tree) => nodes.filter((n) => n.tree === tree);

test('overview shows every tree with the counts of `stats --json`', async () => {
  const stats = JSON.parse(cli(['stats', bank.bank, '--json']));
  await open('overview');
  for (const tree of stats.trees) {
    const card = page.locator(`.tree-card[data-tree="${tree.name}"]`);
    for (const key of ['nodes', 'roots', 'residuals', 'failures', 'consolidated', 'consolidated_roots']) {
      assert.equal(await card.locator(`[data-count="${key}"]`).textContent(), String(tree[key]), `${tree.name} ${key}`);
    }
    assert.equal(await card.locator('rect.bar').count(), tree.depth_histogram.length);
  }
  const card = await page.locator('.bank-card').textContent();
  assert.match(card, new RegExp(`LSN ${stats.checkpoint_lsn}`));
  assert.match(card, new RegExp(`ε ${stats.eps} · max depth ${stats.max_depth} · consolidate after ${stats.consolidate_after} hits`));
  assert.match(card, new RegExp(`bytes per node${Math.round(stats.bytes_per_node.total)} total`));
  await page.screenshot({ path: screenshotPath('overview') });
});

const drawnNodes = () => page.$$eval('.tree-canvas .node', (els) => els.map((e) => ({
  id: Number(e.dataset.id), cls: e.getAttribute('class'), text: e.querySelector('text.title').textContent,
})));

// Titles are fetched after the outline, for the nodes drawn with labels:
// each shows the start of its activation condition or scenario.
function titlesShown(drawn, expected) {
  for (const n of expected) {
    const full = (n.payload.activation_condition || n.scenario).replace(/\s+/g, ' ').trim();
    const text = drawn.find((d) => d.id === n.id).text;
    if (full.length <= 34) assert.equal(text, full, `node ${n.id} title`);
    else assert.ok(text.endsWith('…') && full.startsWith(text.slice(0, -1)) && text.length === 34, `node ${n.id} title: ${text}`);
  }
}

test('the tree view draws one element per node, styled by kind', async () => {
  for (const tree of ['task', 'env']) {
    await open(`tree/${tree}`);
    const drawn = await drawnNodes();
    const expected = inTree(tree);
    titlesShown(drawn, expected);
    assert.deepEqual(drawn.map((d) => d.id).sort((a, b) => a - b), expected.map((n) => n.id).sort((a, b) => a - b));
    for (const n of expected) {
      const cls = drawn.find((d) => d.id === n.id).cls.split(' ');
      assert.equal(cls.includes('failure'), n.label === 'FAILURE', `node ${n.id} failure class`);
      assert.equal(cls.includes('root'), n.type === 'ROOT', `node ${n.id} root class`);
      assert.equal(cls.includes('consolidated'), n.consolidated, `node ${n.id} consolidated class`);
      assert.equal(cls.includes('consolidated-root'), n.consolidated_root, `node ${n.id} consolidated-root class`);
    }
    await page.screenshot({ path: screenshotPath(`tree-${tree}`) });
  }
});

// The titles are asked for in batches no larger than the server allows.
test('titles load from a server whose batch limit is small', async () => {
  const small = await startServer(bank.bank, ['--read-only', '--max-batch', '3']);
  try {
    await page.goto('about:blank');
    await page.goto(`${small.url}#/tree/task`);
    await ready(page);
    titlesShown(await drawnNodes(), inTree('task'));
  } finally {
    await small.stop();
  }
});

test('collapsing a subtree hides its descendants and expanding shows them again', async () => {
  await open('tree/task');
  const before = await page.locator('.tree-canvas .node').count();
  const below = (id) => inTree('task').filter((n) => n.parent === id).flatMap((k) => [k, ...below(k.id)]);
  await page.locator('[data-toggle="0"]').click();
  assert.equal(await page.locator('.tree-canvas .node').count(), before - below(0).length);
  await page.locator('[data-toggle="0"]').click();
  assert.equal(await page.locator('.tree-canvas .node').count(), before);
});

test('a click on a node opens its page with its payload', async () => {
  const target = inTree('env').find((n) => n.depth === 4);
  await open('tree/env');
  await page.locator(`.tree-canvas .node[data-id="${target.id}"] rect`).click();
  await page.waitForURL(new RegExp(`#/node/${target.id}$`));
  await ready(page);
  assert.equal(await page.locator('dd[data-field="scenario"]').textContent(), target.scenario);
  for (const [key, value] of Object.entries(target.payload)) {
    assert.equal(await page.locator(`dd[data-field="${key}"]`).textContent(), value, `payload field ${key}`);
  }
  assert.equal(await page.locator('[data-fact="external id"]').textContent(), target.external_id);
  assert.equal(await page.locator('ol.chain > li').count(), target.depth);
  await page.screenshot({ path: screenshotPath('node'), fullPage: false });
});

test('the rendered chain is exactly `deltamem chain --render`', async () => {
  const deepest = inTree('task').reduce((a, b) => (b.depth > a.depth ? b : a));
  for (const id of [deepest.id, CONSOLIDATED, bank.consolidation.new_root ?? nodes.length - 1]) {
    await open(`node/${id}`);
    const expected = cli(['chain', bank.bank, String(id), '--render']);
    const shown = await page.locator('#rendered-chain').textContent();
    assert.equal(shown.replace(/\n$/, ''), expected.replace(/\n$/, ''), `node ${id}`);
  }
});

test('a consolidated node and its distilled root link to each other', async () => {
  const root = nodes.find((n) => n.consolidated_root);
  await open(`node/${CONSOLIDATED}`);
  assert.ok(await page.locator(`.card a.node-link[data-id="${root.id}"]`).count() > 0, 'link to the distilled root');
  await open(`node/${root.id}`);
  assert.ok(await page.locator(`.card a.node-link[data-id="${CONSOLIDATED}"]`).count() > 0, 'link back to the source');
  assert.match(await page.locator('table.provenance').textContent(), /browser-test/);
  await page.screenshot({ path: screenshotPath('node-consolidated-root') });
});

test('search finds a node by its external id and focuses it in the tree', async () => {
  const target = inTree('env').find((n) => n.depth === 5);
  await open('tree/env');
  await page.fill('#tree-search', target.external_id);
  await page.press('#tree-search', 'Enter');
  await page.waitForSelector(`.search-results a[data-id="${target.id}"]`);
  await page.waitForSelector(`.tree-canvas .node.focused[data-id="${target.id}"]`);
  assert.match(page.url(), new RegExp(`#/tree/env/${target.id}$`));
  assert.equal(await page.locator('.search-results li').count(), 1);
  await page.screenshot({ path: screenshotPath('tree-search') });
});

test('ask the memory returns what `deltamem query` returns for a node\'s vector', async () => {
  const source = inTree('task').find((n) => n.depth === 3);
  const query = { tree: 'task', embedding: source.embedding, k: 5 };
  const expected = JSON.parse(cli(['query', bank.bank], `${JSON.stringify(query)}\n`)).matches;
  assert.ok(expected.length > 1, 'the query must find several nodes to compare');
  await open('ask');
  await page.selectOption('#neighbours select[name=tree]', 'task');
  await page.fill('#neighbours input[name=k]', '5');
  await page.fill('#neighbours input[name=node]', String(source.id));
  await page.click('#neighbours button[type=submit]');
  await page.waitForSelector('#neighbour-answer[data-answered="true"]');
  const shown = await page.$$eval('#neighbour-answer tbody tr', (rows) => rows.map((r) => ({ id: Number(r.dataset.id), score: Number(r.dataset.score) })));
  assert.deepEqual(shown, expected.map((m) => ({ id: m.id, score: m.score })));
  await page.screenshot({ path: screenshotPath('ask') });
});

test('history plots growth, the consolidation and the success hits', async () => {
  await open('history');
  const task = page.locator('.history[data-tree="task"]');
  assert.equal(await task.locator('path.step').count(), 1);
  assert.equal(await task.locator('.event').count(), nodes.filter((n) => n.tree === 'task' && n.consolidated_root).length);
  const hit = nodes.filter((n) => n.tree === 'task' && n.success_hits > 0);
  assert.equal(await task.locator('.hits rect.bar').count(), hit.length);
  assert.equal(await page.locator('.history[data-tree="env"] .event').count(), 0);
  await page.screenshot({ path: screenshotPath('history') });
});

test('an insert made through the API appears without a reload', async () => {
  await open('tree/task');
  await page.evaluate(() => { window.notReloaded = true; });
  const before = await page.locator('.tree-canvas .node').count();
  const embedding = Array.from({ length: 768 }, (_, i) => (i === 7 ? 1 : 0));
  // Under a leaf (no toggle drawn yet), so the page must open its parent.
  const leaf = inTree('task').find((n) => n.depth === 2 && !nodes.some((k) => k.parent === n.id));
  const insert = { tree: 'task', attach: { parent: leaf.id }, label: 'SUCCESS', scenario: 'inserted while the page is open', payload: { execution_procedure: 'appear live' }, embedding, id: 'live-insert' };
  const response = await fetch(`${server.url}v1/nodes`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(insert) });
  assert.equal(response.status, 200, await response.clone().text());
  const ack = await response.json();
  await page.waitForSelector(`.tree-canvas .node[data-id="${ack.id}"]`, { timeout: 10000 });
  assert.equal(await page.locator('.tree-canvas .node').count(), before + 1);
  assert.equal(await page.evaluate(() => window.notReloaded), true);
  await page.waitForFunction((n) => document.getElementById('bank-line').dataset.nodeCount === String(n), nodes.length + 1);
});

// With the agent feature the page asks `retrieve`; it must show what
// `deltamem retrieve --json` gives for the same task and environment.
// tools/test.sh sets DELTAMEM_REQUIRE_ASSETS=1: a server without the agent
// feature is then a failure, not a skip.
test('ask the memory shows what `deltamem retrieve` returns (feature agent)', async (t) => {
  const agentBank = buildAgentBank();
  const agentServer = await startServer(agentBank.bank);
  try {
    const info = await (await fetch(`${agentServer.url}v1/bank`)).json();
    if (!info.agent) {
      assert.notEqual(process.env.DELTAMEM_REQUIRE_ASSETS, '1', 'the server was built without the agent feature');
      t.skip('the server was built without the agent feature');
      return;
    }
    const task = `${AGENT_TASKS[0]} quickly`;
    const env = AGENT_ENVS[0];
    const expected = JSON.parse(cli(['retrieve', agentBank.bank, '--task', task, '--env', env, '--json']));
    assert.ok(expected.task && expected.env, 'the fixture must match in both trees');
    await page.goto('about:blank');
    await page.goto(`${agentServer.url}#/ask`);
    await ready(page);
    await page.fill('#retrieve textarea[name=task]', task);
    await page.fill('#retrieve textarea[name=env]', env);
    await page.click('#retrieve button[type=submit]');
    await page.waitForSelector('#retrieve-answer[data-answered="true"]');
    assert.equal(await page.locator('#retrieved-context').textContent(), expected.context);
    for (const tree of ['task', 'env']) {
      const card = page.locator(`#retrieve-answer [data-tree="${tree}"]`);
      assert.equal(Number(await card.getAttribute('data-node')), expected[tree].node, `${tree} best node`);
      assert.deepEqual(JSON.parse(await card.getAttribute('data-chain')), expected[tree].chain, `${tree} chain`);
    }
    await page.screenshot({ path: screenshotPath('ask-retrieve') });
  } finally {
    // Stopped while the page is still open on it, listening to /v1/events.
    await agentServer.stop();
    fs.rmSync(agentBank.dir, { recursive: true, force: true });
  }
});
