// What the browser tests share: the deltamem command, a bank built from
// the reference ScienceWorld trees, and a `deltamem serve` process on a
// random port of 127.0.0.1 that is stopped when the tests end.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const DELTAMEM = process.env.DELTAMEM_BIN || path.join(REPO, 'target/release/deltamem');
export const ARTIFACTS = path.join(REPO, 'target/browser-artifacts');
const REFERENCE = path.join(REPO, 'tests/fixtures/reference');
const SERVER_START_MS = 30000;
const SERVER_STOP_MS = 10000;

// Run from the repository root, where the agent looks for ./assets.
export function cli(args, input) {
  return execFileSync(DELTAMEM, ['--quiet', ...args], { input, maxBuffer: 1 << 30, cwd: REPO }).toString();
}

export function jsonLines(text) {
  return text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
}

// The two ScienceWorld trees, plus one consolidation so that every kind
// of node the page draws is present: node 10 (a SUCCESS residual at
// depth 3 of `task`) gets three success hits and is distilled into a
// new gold root.
export const CONSOLIDATED = 10;
export function buildBank() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'deltamem-explorer-'));
  const bank = path.join(dir, 'bank');
  cli(['init', bank, '--dim', '768']);
  for (const tree of ['task', 'env']) {
    cli(['import', bank, '--tree', tree, '--reference-json', path.join(REFERENCE, `sciworld_qwen3-8b_dev_${tree}.json`)]);
  }
  for (let i = 0; i < 3; i++) cli(['hit', bank, String(CONSOLIDATED)]);
  const chain = JSON.parse(cli(['chain', bank, String(CONSOLIDATED)]));
  const payload = {
    activation_condition: 'Distilled for the browser test: handling living things in ScienceWorld tasks',
    execution_procedure: '1. Find the organism. 2. Focus on it. 3. Move it as the task says.',
    provenance: JSON.stringify({ prompt: 'distill', extractor: 'browser-test', source: CONSOLIDATED, chain: chain.chain ?? chain, unix_ms: Date.now() }),
  };
  const ack = JSON.parse(cli(['consolidate', bank, String(CONSOLIDATED), '--payload', JSON.stringify(payload)]));
  return { dir, bank, consolidation: ack };
}

// A small bank for the agent's `retrieve` (feature `agent`): nodes whose
// vectors are the MiniLM embeddings of their scenarios (`deltamem embed`),
// in the default trees `task` and `env`.
export const AGENT_TASKS = ['boil water on the stove', 'grow a cherry plant from a seed', 'measure the temperature of unknown substance B'];
export const AGENT_ENVS = ['a kitchen with a stove, a sink and a pot', 'a greenhouse with flower pots and a shovel'];
export function buildAgentBank() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'deltamem-explorer-agent-'));
  const bank = path.join(dir, 'bank');
  const embed = (text) => JSON.parse(cli(['embed', '--text', text])).vector;
  const first = embed(AGENT_TASKS[0]);
  cli(['init', bank, '--dim', String(first.length)]);
  const node = (tree, scenario, attach, procedure) => JSON.stringify({
    tree, attach, label: 'SUCCESS', scenario, embedding: embed(scenario),
    payload: { activation_condition: `when the task is to ${scenario}`, execution_procedure: procedure },
  });
  const lines = [
    ...AGENT_TASKS.map((t) => node('task', t, 'root', `steps that worked for: ${t}`)),
    node('task', `${AGENT_TASKS[0]} quickly`, { parent: 0 }, 'use the large pot and keep the lid on'),
    ...AGENT_ENVS.map((e) => node('env', e, 'root', `where things are in ${e}`)),
  ];
  cli(['insert', bank], `${lines.join('\n')}\n`);
  return { dir, bank };
}

// Starts `deltamem serve` and resolves with its base URL once /healthz
// answers. The server prints the address it listens on (port 0 asks
// the system for a free one).
export async function startServer(bank, extra = []) {
  const child = spawn(DELTAMEM, ['serve', bank, '--listen', '127.0.0.1:0', ...extra], { stdio: ['ignore', 'pipe', 'pipe'], cwd: REPO });
  let output = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`deltamem serve printed no URL in ${SERVER_START_MS} ms:\n${output}`)), SERVER_START_MS);
    const look = (chunk) => {
      output += chunk;
      const found = output.match(/127\.0\.0\.1:(\d+)/);
      if (found) {
        clearTimeout(timer);
        resolve(`http://127.0.0.1:${found[1]}/`);
      }
    };
    child.stdout.on('data', look);
    child.stderr.on('data', look);
    child.on('exit', (code) => reject(new Error(`deltamem serve exited with ${code}:\n${output}`)));
  });
  for (let attempt = 0; attempt < 100; attempt++) {
    try {
      if ((await fetch(`${url}healthz`)).ok) break;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  // SIGTERM must stop the server even while a page holds its event
  // stream open; if it has not exited in time it is killed and the test
  // that stopped it fails.
  const stop = () => new Promise((resolve, reject) => {
    if (child.exitCode !== null) return resolve();
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`deltamem serve was still running ${SERVER_STOP_MS} ms after SIGTERM`));
    }, SERVER_STOP_MS);
    child.on('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
  return { url, stop, child };
}

export function screenshotPath(name) {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  return path.join(ARTIFACTS, `${name}.png`);
}
