// Debian's Chromium, headless, driven by playwright-core (no downloaded
// browser). The flags keep it from reaching for the network: without them
// its background connections fail on a machine with no outside access.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

export const CHROMIUM = process.env.DELTAMEM_CHROMIUM || '/usr/bin/chromium';
const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export async function launch() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'deltamem-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, args: ARGS, headless: true, viewport: { width: 1280, height: 800 },
  });
  const close = async () => {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  };
  return { context, close };
}

// Waits for the explorer's current view to finish drawing.
export async function ready(page) {
  await page.waitForSelector('#view[data-ready="true"]', { timeout: 30000 });
}
