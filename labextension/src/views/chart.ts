/**
 * A small SVG chart of the selected job: loss (with val_loss) above, lr below, one x axis
 * of steps, and a dashed line at every hyper-parameter change (its tooltip says what, from
 * where). No charting library: a few hundred lines of SVG redrawn a few times a second.
 */
import { Widget } from '@lumino/widgets';

import { IMarker } from '../model';
import { ISeries } from '../types';

const SVG = 'http://www.w3.org/2000/svg';
const PANES: Array<{ title: string; names: string[]; log: boolean }> = [
  { title: 'loss', names: ['loss', 'val_loss'], log: false },
  { title: 'lr', names: ['lr'], log: true }
];
const HEIGHT = 120;
const PAD = { left: 46, right: 8, top: 14, bottom: 16 };

function el<K extends keyof SVGElementTagNameMap>(
  name: K,
  attrs: Record<string, string | number>
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  return node;
}

function fmt(v: number): string {
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e4) ? v.toExponential(1) : v.toPrecision(3);
}

export class Chart extends Widget {
  constructor() {
    super();
    this.addClass('hpi-chart');
  }

  /** Redraw from the model's series and markers. */
  draw(series: Map<string, ISeries>, markers: IMarker[]): void {
    this.node.replaceChildren();
    const width = Math.max(200, this.node.clientWidth || 300);
    const all = [...series.values()].flatMap(s => s.x);
    const x0 = all.length ? all.reduce((a, b) => Math.min(a, b)) : 0;
    const x1 = all.length ? all.reduce((a, b) => Math.max(a, b)) : 1;
    const sx = (x: number) =>
      PAD.left + ((x - x0) / Math.max(1, x1 - x0)) * (width - PAD.left - PAD.right);
    for (const pane of PANES) {
      const svg = el('svg', {
        width,
        height: HEIGHT,
        class: `hpi-pane hpi-pane-${pane.title}`
      });
      svg.append(el('text', { x: 4, y: 11, class: 'hpi-pane-title' }));
      svg.lastChild!.textContent = pane.title;
      const lines = pane.names
        .map(name => ({ name, s: series.get(name) }))
        .filter((l): l is { name: string; s: ISeries } => !!l.s && l.s.x.length > 0);
      const ys = lines.flatMap(l =>
        l.s.y.filter((v): v is number => v !== null && (!pane.log || v > 0))
      );
      if (ys.length > 0) {
        const tf = (v: number) => (pane.log ? Math.log10(v) : v);
        let lo = tf(ys.reduce((a, b) => Math.min(a, b)));
        let hi = tf(ys.reduce((a, b) => Math.max(a, b)));
        if (hi - lo < 1e-12) {
          lo -= 0.5;
          hi += 0.5;
        }
        const sy = (v: number) =>
          PAD.top + (1 - (tf(v) - lo) / (hi - lo)) * (HEIGHT - PAD.top - PAD.bottom);
        for (const [y, v] of [
          [PAD.top, hi],
          [HEIGHT - PAD.bottom, lo]
        ]) {
          const t = el('text', { x: 2, y: y + 4, class: 'hpi-tick' });
          t.textContent = fmt(pane.log ? 10 ** v : v);
          svg.append(t);
        }
        for (const marker of markers) {
          if (marker.step < x0 || marker.step > x1) {
            continue;
          }
          const line = el('line', {
            x1: sx(marker.step),
            x2: sx(marker.step),
            y1: PAD.top,
            y2: HEIGHT - PAD.bottom,
            class: 'hpi-marker'
          });
          const tip = el('title', {});
          tip.textContent = `${marker.label} at step ${marker.step} (${marker.source})`;
          line.append(tip);
          svg.append(line);
        }
        for (const { name, s } of lines) {
          const pts: string[] = [];
          for (let i = 0; i < s.x.length; i++) {
            const v = s.y[i];
            if (v !== null && (!pane.log || v > 0)) {
              pts.push(`${sx(s.x[i]).toFixed(1)},${sy(v).toFixed(1)}`);
            }
          }
          svg.append(
            el('polyline', {
              points: pts.join(' '),
              class: `hpi-line hpi-line-${name}`,
              'data-metric': name,
              'data-points': pts.length
            })
          );
        }
      }
      const axis = el('text', {
        x: width - PAD.right,
        y: HEIGHT - 3,
        class: 'hpi-tick hpi-x'
      });
      axis.textContent = all.length ? `step ${x1}` : 'no steps yet';
      svg.append(axis);
      this.node.append(svg);
    }
  }
}
