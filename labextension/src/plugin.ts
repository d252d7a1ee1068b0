/** The plugin: the side panel, its commands and the status-bar item, over one model. */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { addCommands, CommandIDs, insertAttach } from './commands';
import { JobsModel } from './model';
import { RunningJobs } from './statusbar';
import { JobsPanel } from './views/panel';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24">
<path class="jp-icon3" fill="#616161" d="M3 19h18v2H3zM5 17l4-6 4 3 6-9 1.6 1.2-7.1 10.6-4-3-3 4.4z"/>
</svg>`;
export const jobsIcon = new LabIcon({ name: 'hpinteract:jobs', svgstr: ICON_SVG });

export const jobsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'hpinteract:jobs',
  description: 'A side panel to watch and tune hpinteract training jobs.',
  autoStart: true,
  optional: [ICommandPalette, INotebookTracker, IStatusBar, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    tracker: INotebookTracker | null,
    statusBar: IStatusBar | null,
    restorer: ILayoutRestorer | null
  ) => {
    const model = new JobsModel();
    const panel = new JobsPanel(model, id => insertAttach(tracker, id));
    panel.title.icon = jobsIcon;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);
    addCommands(app, model, panel.id, tracker, palette);
    statusBar?.registerStatusItem('hpinteract:running', {
      item: new RunningJobs(model, () => void app.commands.execute(CommandIDs.open)),
      align: 'left',
      rank: 100
    });
    model.start();
  }
};
