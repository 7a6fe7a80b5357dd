// The explorer: a hash router over five read-only views, plus live
// updates from the server's event stream (polling when it is absent).
import { api } from './api.js';
import { errorBox, h } from './dom.js';
import * as overview from './views/overview.js';
import * as tree from './views/tree.js';
import * as node from './views/node.js';
import * as ask from './views/ask.js';
import * as history from './views/history.js';

const VIEWS = { overview, tree, node, ask, history };
const REFRESH_DEBOUNCE_MS = 400;
const POLL_INTERVAL_MS = 2000;

const state = { bank: null, view: null, route: '', refreshTimer: null, lastCount: null };

function parseRoute() {
  const hash = decodeURIComponent(location.hash.replace(/^#\/?/, ''));
  const [page, ...rest] = hash.split('/');
  return { page: VIEWS[page] ? page : 'overview', args: rest };
}

async function show() {
  const { page, args } = parseRoute();
  if (state.view && state.view.dispose) state.view.dispose();
  state.view = null;
  for (const a of document.querySelectorAll('nav a')) {
    a.classList.toggle('active', a.dataset.page === page || (page === 'node' && a.dataset.page === 'tree'));
  }
  const container = document.getElementById('view');
  container.replaceChildren(h('p.muted', {}, 'Loading…'));
  container.dataset.page = page;
  delete container.dataset.ready;
  try {
    state.view = (await VIEWS[page].render(container, args, state)) || {};
  } catch (error) {
    container.replaceChildren(errorBox(error));
  }
  container.dataset.ready = 'true';
}

function bankLine(bank) {
  const line = document.getElementById('bank-line');
  line.textContent = `${bank.node_count} nodes · dim ${bank.dim} ${bank.precision}` +
    (bank.read_only ? ' · read-only' : '') + (bank.agent ? ' · agent' : '');
  line.dataset.nodeCount = bank.node_count;
}

// A change in the bank: refresh the header now and the open view soon
// (debounced, so a burst of inserts costs one refresh).
async function onChange() {
  try {
    state.bank = await api.bank();
  } catch {
    return;
  }
  bankLine(state.bank);
  if (state.lastCount === state.bank.node_count && state.polling) return;
  state.lastCount = state.bank.node_count;
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(async () => {
    if (state.view && state.view.refresh) await state.view.refresh(state.bank);
  }, REFRESH_DEBOUNCE_MS);
}

function listen() {
  const live = document.getElementById('live');
  if (!window.EventSource) return poll(live);
  const events = new EventSource('/v1/events');
  events.addEventListener('open', () => live.classList.add('on'));
  events.addEventListener('change', onChange);
  events.addEventListener('error', () => {
    if (events.readyState === EventSource.CLOSED) {
      live.classList.remove('on');
      poll(live);
    }
  });
}

function poll(live) {
  state.polling = true;
  live.classList.add('on', 'polling');
  live.title = 'live updates (polling)';
  setInterval(onChange, POLL_INTERVAL_MS);
}

async function start() {
  try {
    state.bank = await api.bank();
    state.lastCount = state.bank.node_count;
    bankLine(state.bank);
  } catch (error) {
    document.getElementById('view').replaceChildren(errorBox(error));
    return;
  }
  window.addEventListener('hashchange', show);
  listen();
  await show();
}

start();
