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

export class JobList extends Widget {
  constructor(private readonly model: JobsModel) {
    super({ node: document.createElement('ul') });
    this.addClass('hpi-jobs');
  }

  update(): void {
    const selected = this.model.selected?.id;
    const items = this.model.jobs.map(job => {
      const li = document.createElement('li');
      li.className = 'hpi-job';
      li.dataset.jobId = job.id;
      li.dataset.state = job.state;
      li.classList.toggle('hpi-selected', job.id === selected);
      li.title = job.script ?? job.id;
      const name = document.createElement('span');
      name.className = 'hpi-job-id';
      name.textContent = job.id;
      const badge = document.createElement('span');
      badge.className = `hpi-badge hpi-state-${job.state}`;
      badge.textContent = job.state;
      const bar = document.createElement('progress');
      bar.max = 1;
      bar.value = job.progress ?? 0;
      const info = document.createElement('span');
      info.className = 'hpi-job-info';
      info.textContent = [`step ${job.step ?? 0}`, loss(job)]
        .filter(Boolean)
        .join(' · ');
      li.append(badge, name, bar, info);
      li.addEventListener('click', () => this.model.select(job.id));
      return li;
    });
    if (items.length === 0) {
      const li = document.createElement('li');
      li.className = 'hpi-empty';
      li.textContent =
        this.model.error || 'No jobs yet: hpi.launch(...) or %hp launch.';
      items.push(li);
    }
    this.node.replaceChildren(...items);
  }
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
