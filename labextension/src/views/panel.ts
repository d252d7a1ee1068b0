/**
 * The "Training jobs" side panel: every job (state, progress, latest loss), newest first,
 * and below it the selected job's detail.
 */
import { Panel, Widget } from '@lumino/widgets';

import { JobsModel } from '../model';
import { IJobSummary } from '../types';
import { JobDetail } from './detail';

function loss(j: IJobSummary): string {
  return j.loss === null ? '' : `loss ${j.loss.toPrecision(4)}`;
}

/** One job's row: made once, then only its changed parts are written. */
class JobRow {
  constructor(id: string, select: () => void) {
    this.node.className = 'hpi-job';
    this.node.dataset.jobId = id;
    this.name.className = 'hpi-job-id';
    this.name.textContent = id;
    this.info.className = 'hpi-job-info';
    this.bar.max = 1;
    this.node.append(this.badge, this.name, this.bar, this.info);
    this.node.addEventListener('click', select);
  }

  readonly node = document.createElement('li');
  private readonly badge = document.createElement('span');
  private readonly name = document.createElement('span');
  private readonly bar = document.createElement('progress');
  private readonly info = document.createElement('span');

  render(job: IJobSummary, selected: boolean): void {
    set(this.node, 'title', job.script ?? job.id);
    this.node.classList.toggle('hpi-selected', selected);
    if (this.node.dataset.state !== job.state) {
      this.node.dataset.state = job.state;
      this.badge.className = `hpi-badge hpi-state-${job.state}`;
      this.badge.textContent = job.state;
    }
    set(this.bar, 'value', job.progress ?? 0);
    set(
      this.info,
      'textContent',
      [`step ${job.step ?? 0}`, loss(job)].filter(Boolean).join(' · ')
    );
  }
}

/** Write a property only when it differs (a write would restyle, even when equal). */
function set<T extends object, K extends keyof T>(el: T, key: K, value: T[K]): void {
  if (el[key] !== value) {
    el[key] = value;
  }
}

/**
 * The jobs, newest first. Keyed by job id: a poll updates the rows in place and moves
 * or adds only what changed, so the row a user is about to click is never replaced
 * under the pointer (a replaced element loses the click).
 */
export class JobList extends Widget {
  constructor(private readonly model: JobsModel) {
    super({ node: document.createElement('ul') });
    this.addClass('hpi-jobs');
    this.empty.className = 'hpi-empty';
  }

  update(): void {
    const selected = this.model.selected?.id;
    const seen = new Set<string>();
    const wanted: HTMLElement[] = [];
    for (const job of this.model.jobs) {
      let row = this.rows.get(job.id);
      if (!row) {
        row = new JobRow(job.id, () => this.model.select(job.id));
        this.rows.set(job.id, row);
      }
      row.render(job, job.id === selected);
      seen.add(job.id);
      wanted.push(row.node);
    }
    for (const [id, row] of this.rows) {
      if (!seen.has(id)) {
        row.node.remove();
        this.rows.delete(id);
      }
    }
    if (wanted.length === 0) {
      this.empty.textContent =
        this.model.error || 'No jobs yet: hpi.launch(...) or %hp launch.';
      wanted.push(this.empty);
    } else {
      this.empty.remove();
    }
    // Move only the rows out of place (a new job goes first; the rest stay where they are).
    wanted.forEach((node, i) => {
      if (this.node.children[i] !== node) {
        this.node.insertBefore(node, this.node.children[i] ?? null);
      }
    });
  }

  private readonly rows = new Map<string, JobRow>();
  private readonly empty = document.createElement('li');
}

export class JobsPanel extends Panel {
  constructor(
    readonly model: JobsModel,
    private readonly insertAttach: (id: string) => void
  ) {
    super();
    this.id = 'hpinteract-jobs';
    this.addClass('hpi-panel');
    this.title.caption = 'Training jobs';
    this.list = new JobList(model);
    this.addWidget(this.list);
    model.changed.connect(this.onChanged, this);
    this.onChanged();
  }

  readonly list: JobList;
  detail: JobDetail | null = null;

  private onChanged(): void {
    this.list.update();
    const selected = this.model.selected;
    if (selected && this.detail?.model !== selected) {
      this.detail?.dispose();
      this.detail = new JobDetail(selected, this.insertAttach);
      this.addWidget(this.detail);
      this.detail.redraw();
    } else if (!selected && this.detail) {
      this.detail.dispose();
      this.detail = null;
    }
  }

  dispose(): void {
    this.model.changed.disconnect(this.onChanged, this);
    super.dispose();
  }
}
