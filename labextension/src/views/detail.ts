/**
 * The selected job: state, progress, commands, the chart, the hyper-parameter table and the
 * newest events. Redrawn from its `JobModel` a few times a second at most.
 */
import { Widget } from '@lumino/widgets';

import { JobModel } from '../model';
import { Command, IJobEvent, TERMINAL } from '../types';
import { Chart } from './chart';
import { HParamTable } from './hparams';

const COMMANDS: Command[] = ['pause', 'resume', 'stop', 'checkpoint'];
const REDRAW_MS = 250;

export function eventLine(e: IJobEvent): string {
  const src = e.source ? ` (${e.source})` : '';
  if (e.kind === 'change') {
    const values = Object.entries(e.values ?? {})
      .map(([k, v]) => `${k}=${String(v)}`)
      .join(', ');
    return e.status === 'applied'
      ? `set ${values} at step ${e.applied_at_step}${src}`
      : `set ${values} ${e.status}${src}: ${e.error ?? ''}`;
  }
  if (e.kind === 'state') {
    return `${e.state} at step ${e.step ?? '?'}${src}`;
  }
  if (e.kind === 'checkpoint') {
    return `checkpoint ${e.status} at step ${e.step}${src}`;
  }
  const rest = e.reason ?? e.status ?? '';
  return `${e.kind}${rest ? ': ' + rest : ''}${src}`;
}

export class JobDetail extends Widget {
  constructor(
    readonly model: JobModel,
    private readonly insertAttach: (id: string) => void
  ) {
    super();
    this.addClass('hpi-detail');
    this.head.className = 'hpi-detail-head';
    this.buttons.className = 'hpi-buttons';
    for (const op of COMMANDS) {
      const b = document.createElement('button');
      b.className = `jp-Button hpi-button hpi-${op}`;
      b.textContent = op;
      b.dataset.command = op;
      b.addEventListener('click', () => void this.model.command(op));
      this.buttons.append(b);
    }
    const attach = document.createElement('button');
    attach.className = 'jp-Button hpi-button hpi-insert';
    attach.textContent = 'insert attach';
    attach.title = 'Insert job = hpi.attach("…") into the active notebook';
    attach.addEventListener('click', () => this.insertAttach(this.model.id));
    this.buttons.append(attach);
    this.message.className = 'hpi-message';
    this.eventsNode.className = 'hpi-events';
    this.node.append(this.head, this.buttons, this.message);
    this.chart = new Chart();
    this.table = new HParamTable(model);
    this.node.append(this.chart.node, this.table.node, this.eventsNode);
    model.changed.connect(this.schedule, this);
  }

  readonly chart: Chart;
  readonly table: HParamTable;

  private schedule(): void {
    if (this.timer === null) {
      this.timer = setTimeout(() => {
        this.timer = null;
        this.redraw();
      }, REDRAW_MS);
    }
  }

  redraw(): void {
    const m = this.model;
    const d = m.detail;
    const state = m.state;
    this.node.dataset.state = state;
    this.head.textContent = d
      ? `${m.id} · ${state} · step ${d.step ?? 0}` +
        (d.latest.loss != null ? ` · loss ${Number(d.latest.loss).toPrecision(4)}` : '')
      : `${m.id} · loading…`;
    const ended = TERMINAL.has(state);
    for (const b of Array.from(this.buttons.querySelectorAll('button'))) {
      const op = b.dataset.command;
      (b as HTMLButtonElement).disabled =
        op !== undefined &&
        (ended ||
          (op === 'pause' && state === 'paused') ||
          (op === 'resume' && state !== 'paused') ||
          (op !== 'checkpoint' && state === 'stopping'));
    }
    const error = d?.error ? `rank ${d.error.rank ?? '?'}: ${d.error.message}` : '';
    this.message.textContent = [m.message, error].filter(Boolean).join(' — ');
    this.chart.draw(m.series, m.markers);
    this.table.update();
    this.eventsNode.replaceChildren(
      ...m.events
        .slice(-12)
        .reverse()
        .map(e => {
          const li = document.createElement('li');
          li.textContent = eventLine(e);
          li.dataset.kind = e.kind;
          return li;
        })
    );
  }

  dispose(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
    }
    this.model.changed.disconnect(this.schedule, this);
    super.dispose();
  }

  private head = document.createElement('div');
  private buttons = document.createElement('div');
  private message = document.createElement('div');
  private eventsNode = document.createElement('ul');
  private timer: ReturnType<typeof setTimeout> | null = null;
}
