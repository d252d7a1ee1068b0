/** The status-bar item: how many jobs are running; a click opens the panel. */
import { Widget } from '@lumino/widgets';

import { JobsModel } from './model';

export class RunningJobs extends Widget {
  constructor(
    private readonly model: JobsModel,
    onClick: () => void
  ) {
    super();
    this.addClass('hpi-status');
    this.node.title = 'hpinteract training jobs';
    this.node.addEventListener('click', onClick);
    model.changed.connect(this.update, this);
    this.update();
  }

  update(): void {
    const n = this.model.running;
    this.node.textContent = `${n} training job${n === 1 ? '' : 's'}`;
    this.node.dataset.running = String(n);
  }

  dispose(): void {
    this.model.changed.disconnect(this.update, this);
    super.dispose();
  }
}
