// Measurement, not a test: the explorer on a 100k-node bank. Builds the
// bank with `import --npy` (tree `task`: 10,000 nodes, `env`: 90,000;
// 2,000 and 18,000 roots with four descendants each), serves it, and times
// in headless Chromium, from navigation until the view reports it is
// drawn: the overview, and the tree view of `task` with all 10k nodes.
//   node measure-100k.js [runs]      (prints medians; keeps nothing)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { launch, ready } from './browser.js';
import { cli, startServer } from './harness.js';

const DIM = 32;
const RUNS = Number(process.argv[2] || 5);

// A float32 .npy of `rows` random unit-ish vectors.
function writeNpy(file, rows) {
  const header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${rows}, ${DIM}), }`;
  const padded = header.padEnd(Math.ceil((header.length + 11) / 64) * 64 - 11, ' ') + '\n';
  const head = Buffer.alloc(10);
  Buffer.from([0x93, ...Buffer.from('NUMPY'), 1, 0]).copy(head);
  head.writeUInt16LE(padded.length, 8);
  const data = new Float32Array(rows * DIM).map(() => Math.random() - 0.5);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(padded, 'latin1'), Buffer.from(data.buffer)]));
}

// Each root is followed by two children, each with one child of its own.
function writeMeta(file, rows, firstId) {
  const lines = [];
  for (let r = 0; r < rows; r += 5) {
    const root = firstId + r;
    lines.push({ attach: 'root', scenario: `root ${r / 5} of a measured tree` });
    lines.push({ attach: { parent: root }, scenario: `child a of ${root}` });
    lines.push({ attach: { parent: root }, scenario: `child b of ${root}`, label: 'FAILURE' });
    lines.push({ attach: { parent: root + 1 }, scenario: `grandchild of ${root}` });
    lines.push({ attach: { parent: root + 2 }, scenario: `grandchild of ${root}` });
  }
  fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
}

function buildBank(dir) {
  const bank = path.join(dir, 'bank');
  cli(['init', bank, '--dim', String(DIM)]);
  let first = 0;
  for (const [tree, rows] of [['task', 10000], ['env', 90000]]) {
    writeNpy(path.join(dir, `${tree}.npy`), rows);
    writeMeta(path.join(dir, `${tree}.jsonl`), rows, first);
    cli(['import', bank, '--tree', tree, '--npy', path.join(dir, `${tree}.npy`), '--meta', path.join(dir, `${tree}.jsonl`), '--batch', '5000']);
    first += rows;
  }
  return bank;
}

const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function timeView(page, url, route) {
  await page.goto('about:blank');
  const started = Date.now();
  await page.goto(`${url}#/${route}`);
  await ready(page);
  return Date.now() - started;
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'deltamem-100k-'));
let server;
let browser;
try {
  const built = Date.now();
  const bank = buildBank(dir);
  console.log(`bank of 100,000 nodes built in ${Date.now() - built} ms`);
  server = await startServer(bank);
  browser = await launch();
  const page = await browser.context.newPage();
  const times = { overview: [], 'tree/task': [] };
  for (let run = 0; run < RUNS; run++) {
    for (const route of Object.keys(times)) times[route].push(await timeView(page, server.url, route));
  }
  const drawn = await page.locator('.tree-canvas .node').count();
  for (const [route, ms] of Object.entries(times)) {
    console.log(`${route}: median ${median(ms)} ms over ${RUNS} runs (${ms.join(', ')})`);
  }
  console.log(`tree/task drew ${drawn} node elements`);
} finally {
  if (browser) await browser.close();
  if (server) await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
}
