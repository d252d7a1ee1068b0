/** Command ids and the commands of the panel (also in the command palette). */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { JobsModel } from './model';
import { Command } from './types';

export const CommandIDs = {
  open: 'hpinteract:open',
  refresh: 'hpinteract:refresh',
  insertAttach: 'hpinteract:insert-attach',
  pause: 'hpinteract:pause',
  resume: 'hpinteract:resume',
  stop: 'hpinteract:stop',
  checkpoint: 'hpinteract:checkpoint'
} as const;

const CATEGORY = 'Training Jobs';

/** The code a notebook needs to take over the job from the panel. */
export function attachCode(id: string): string {
  return `import hpinteract as hpi\njob = hpi.attach(${JSON.stringify(id)})`;
}

/** Put `job = hpi.attach(id)` in a new cell below the active one; false if no notebook. */
export function insertAttach(tracker: INotebookTracker | null, id: string): boolean {
  const panel = tracker?.currentWidget;
  if (!panel) {
    return false;
  }
  const notebook = panel.content;
  NotebookActions.insertBelow(notebook);
  notebook.activeCell?.model.sharedModel.setSource(attachCode(id));
  return true;
}

export function addCommands(
  app: JupyterFrontEnd,
  model: JobsModel,
  panelId: string,
  tracker: INotebookTracker | null,
  palette: ICommandPalette | null
): void {
  const { commands } = app;
  commands.addCommand(CommandIDs.open, {
    label: 'Show Training Jobs',
    execute: () => app.shell.activateById(panelId)
  });
  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh Training Jobs',
    execute: () => model.refresh()
  });
  commands.addCommand(CommandIDs.insertAttach, {
    label: 'Insert hpi.attach() for the Selected Job',
    isEnabled: () => model.selected !== null && !!tracker?.currentWidget,
    execute: () => {
      if (model.selected) {
        insertAttach(tracker, model.selected.id);
      }
    }
  });
  const ops: Command[] = ['pause', 'resume', 'stop', 'checkpoint'];
  for (const op of ops) {
    commands.addCommand(CommandIDs[op], {
      label: `${op[0].toUpperCase()}${op.slice(1)} the Selected Training Job`,
      isEnabled: () => model.selected !== null,
      execute: () => model.selected?.command(op)
    });
  }
  for (const command of Object.values(CommandIDs)) {
    palette?.addItem({ command, category: CATEGORY });
  }
}
