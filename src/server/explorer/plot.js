// Small SVG charts: a bar chart and a step chart with event marks. Hand
// written because they are a few dozen lines; the tree uses d3.
import { svg } from './dom.js';

const PAD = { left: 48, right: 12, top: 12, bottom: 34 };

function axisLabel(x, y, text, anchor = 'middle') {
  return svg('text', { x, y, 'text-anchor': anchor, class: 'axis' }, text);
}

// bars: [{label, value, title?, href?}]
export function barChart(bars, { width = 360, height = 160, xTitle = '', className = '' } = {}) {
  const innerW = width - PAD.left - PAD.right;
  const innerH = height - PAD.top - PAD.bottom;
  const max = Math.max(1, ...bars.map((b) => b.value));
  // At most 48 px per bar, so a chart of one or two bars stays readable.
  const step = Math.min(48, innerW / Math.max(1, bars.length));
  const root = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, class: `chart ${className}` });
  root.append(axisLabel(PAD.left - 6, PAD.top + 4, String(max), 'end'));
  root.append(axisLabel(PAD.left - 6, PAD.top + innerH, '0', 'end'));
  root.append(svg('line', { x1: PAD.left, y1: PAD.top + innerH, x2: PAD.left + innerW, y2: PAD.top + innerH, class: 'baseline' }));
  const labelEvery = Math.ceil(bars.length / 24);
  bars.forEach((bar, i) => {
    const barH = (bar.value / max) * innerH;
    const x = PAD.left + i * step + step * 0.1;
    const rect = svg('rect', { x, y: PAD.top + innerH - barH, width: Math.max(1, step * 0.8), height: barH, class: 'bar' },
      svg('title', {}, bar.title ?? `${bar.label}: ${bar.value}`));
    if (bar.href) {
      const link = svg('a', { href: bar.href });
      link.append(rect);
      root.append(link);
    } else {
      root.append(rect);
    }
    if (i % labelEvery === 0) root.append(axisLabel(x + step * 0.4, PAD.top + innerH + 14, bar.label));
  });
  if (xTitle) root.append(axisLabel(PAD.left + innerW / 2, height - 4, xTitle));
  return root;
}

// A cumulative count over time: points [{t, n}] sorted by t; events
// [{t, title, href}] drawn as gold marks on the time axis.
export function stepChart(points, events, { width = 560, height = 200, className = '' } = {}) {
  const innerW = width - PAD.left - PAD.right;
  const innerH = height - PAD.top - PAD.bottom;
  const root = svg('svg', { width, height, viewBox: `0 0 ${width} ${height}`, class: `chart ${className}` });
  if (points.length === 0) {
    root.append(axisLabel(width / 2, height / 2, 'no creation times recorded'));
    return root;
  }
  const t0 = points[0].t;
  const t1 = Math.max(t0 + 1, points[points.length - 1].t, ...events.map((e) => e.t));
  const maxN = Math.max(1, points[points.length - 1].n);
  const x = (t) => PAD.left + ((t - t0) / (t1 - t0)) * innerW;
  const y = (n) => PAD.top + innerH - (n / maxN) * innerH;
  let d = `M${x(t0)},${y(0)}`;
  for (const p of points) d += `H${x(p.t).toFixed(1)}V${y(p.n).toFixed(1)}`;
  d += `H${x(t1)}`;
  root.append(svg('line', { x1: PAD.left, y1: PAD.top + innerH, x2: PAD.left + innerW, y2: PAD.top + innerH, class: 'baseline' }));
  root.append(svg('path', { d, class: 'step' }));
  root.append(axisLabel(PAD.left - 6, PAD.top + 4, String(maxN), 'end'));
  root.append(axisLabel(PAD.left - 6, PAD.top + innerH, '0', 'end'));
  const day = (t) => new Date(t).toISOString().slice(0, 16).replace('T', ' ');
  root.append(axisLabel(PAD.left, PAD.top + innerH + 14, day(t0), 'start'));
  root.append(axisLabel(PAD.left + innerW, PAD.top + innerH + 14, day(t1), 'end'));
  for (const e of events) {
    const mark = svg('a', { href: e.href || null, class: 'event' },
      svg('line', { x1: x(e.t), x2: x(e.t), y1: PAD.top, y2: PAD.top + innerH, class: 'event-line' }),
      svg('circle', { cx: x(e.t), cy: PAD.top + innerH, r: 4, class: 'event-dot' }),
      svg('title', {}, e.title));
    root.append(mark);
  }
  return root;
}
