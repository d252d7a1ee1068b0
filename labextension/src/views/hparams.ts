/**
 * The selected job's hyper-parameters as an editable table: one input per spec (a select
 * for choices and booleans), applied on Enter or when the input loses focus; the job's
 * refusal is shown on the row (until the next edit), the acknowledged step on success.
 * The script's hyper-parameters first; hpinteract's own knobs (monitors, checkpoints,
 * sync, workers) in a group of their own, folded until opened, as in the dashboard.
 */
import { Widget } from '@lumino/widgets';

import { JobModel } from '../model';
import { IHParamSpec } from '../types';

function inputFor(
  spec: IHParamSpec,
  value: unknown
): HTMLInputElement | HTMLSelectElement {
  const options = spec.choices ?? (spec.kind === 'bool' ? [true, false] : null);
  if (options) {
    const select = document.createElement('select');
    for (const c of options) {
      const option = document.createElement('option');
      option.value = option.textContent = String(c);
      select.append(option);
    }
    select.value = String(value);
    return select;
  }
  const input = document.createElement('input');
  input.type = 'text';
  input.value = String(value);
  input.spellcheck = false;
  const range = [spec.low, spec.high].some(v => v !== null)
    ? ` [${spec.low ?? '-∞'}, ${spec.high ?? '∞'}]`
    : '';
  input.title = `${spec.kind}${range}${spec.doc ? ': ' + spec.doc : ''}`;
  return input;
}

/**
 * A slider on a log scale for a positive float spec marked ``log`` (lr): a factor of ten
 * is the same distance wherever it is. Its ends are the spec's bounds where they are
 * positive, else two decades either side of the value the row opened with.
 */
function logSlider(
  name: string,
  spec: IHParamSpec,
  value: unknown
): HTMLInputElement | null {
  if (!spec.log || spec.kind !== 'float' || typeof value !== 'number' || !(value > 0)) {
    return null;
  }
  const at = Math.log10(value);
  const range = document.createElement('input');
  range.type = 'range';
  range.className = 'hpi-log';
  range.min = String(spec.low && spec.low > 0 ? Math.log10(spec.low) : at - 2);
  range.max = String(spec.high && spec.high > 0 ? Math.log10(spec.high) : at + 2);
  range.step = 'any';
  range.value = String(at);
  range.setAttribute('aria-label', `${name}, log scale`);
  return range;
}

export class HParamTable extends Widget {
  constructor(private readonly model: JobModel) {
    super({ node: document.createElement('table') });
    this.addClass('hpi-hparams');
    this.system.className = 'hpi-system';
    const head = document.createElement('tr');
    head.className = 'hpi-group';
    const cell = document.createElement('th');
    cell.colSpan = 2;
    cell.tabIndex = 0;
    cell.textContent = 'system: monitors, checkpoints, sync, workers';
    const toggle = () => {
      const open = this.system.classList.toggle('hpi-open');
      cell.setAttribute('aria-expanded', String(open));
    };
    cell.setAttribute('aria-expanded', 'false');
    cell.addEventListener('click', toggle);
    cell.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        toggle();
      }
    });
    head.append(cell);
    this.system.append(head);
    this.node.append(this.main, this.system);
  }

  /** Rebuild the rows, except one the user is typing in (so a redraw never eats input). */
  update(): void {
    const detail = this.model.detail;
    if (!detail) {
      return;
    }
    const focused = document.activeElement;
    const system = new Set(detail.system ?? []);
    this.system.hidden = !Object.keys(detail.specs).some(n => system.has(n));
    for (const [name, spec] of Object.entries(detail.specs)) {
      let row = this.rows.get(name);
      if (!row) {
        row = this.makeRow(name, spec, detail.hparams[name]);
        this.rows.set(name, row);
        (system.has(name) ? this.system : this.main).append(row);
      }
      const input = row.querySelector('input, select') as
        HTMLInputElement | HTMLSelectElement;
      const value = String(detail.hparams[name]);
      if (input !== focused && input.dataset.sent !== 'pending') {
        input.value = value;
      }
      // The slider shows the value in force unless it is in the user's hand.
      const range = row.querySelector('input.hpi-log') as HTMLInputElement | null;
      const v = Number(detail.hparams[name]);
      if (range && range !== focused && input.dataset.sent !== 'pending' && v > 0) {
        range.value = String(Math.log10(v));
      }
      const acked = this.model.acked.get(name);
      const since = detail.last_changed[name];
      row.querySelector('.hpi-since')!.textContent =
        acked !== undefined && acked === since
          ? `applied at step ${acked}`
          : since !== undefined
            ? `since step ${since}`
            : '';
      const error = this.model.errors.get(name) ?? '';
      const cell = row.querySelector('.hpi-error') as HTMLElement;
      cell.textContent = error;
      row.classList.toggle('hpi-invalid', error !== '');
    }
  }

  private makeRow(
    name: string,
    spec: IHParamSpec,
    value: unknown
  ): HTMLTableRowElement {
    const row = document.createElement('tr');
    row.dataset.hparam = name;
    const label = document.createElement('td');
    label.className = 'hpi-name';
    label.textContent = name;
    label.title = spec.doc;
    const cell = document.createElement('td');
    const input = inputFor(spec, value);
    input.setAttribute('aria-label', name);
    cell.append(input);
    const range = logSlider(name, spec, value);
    if (range) {
      cell.append(range);
    }
    // Under the input, not beside it: the side panel is narrow.
    const since = document.createElement('div');
    since.className = 'hpi-since';
    const error = document.createElement('div');
    error.className = 'hpi-error';
    error.setAttribute('role', 'alert');
    cell.append(since, error);
    row.append(label, cell);
    const send = async () => {
      const current = String(this.model.detail?.hparams[name]);
      if (input.value === current || input.dataset.sent === 'pending') {
        return;
      }
      input.dataset.sent = 'pending';
      try {
        await this.model.setValue(name, input.value);
      } finally {
        delete input.dataset.sent;
      }
      if (this.model.errors.has(name)) {
        input.value = String(this.model.detail?.hparams[name]);
      }
      this.update();
    };
    if (range) {
      // Dragging shows the value in the text box (3 significant digits, as sent); the
      // release sends it.
      range.addEventListener('input', () => {
        input.value = String(Number((10 ** Number(range.value)).toPrecision(3)));
      });
      range.addEventListener('change', () => void send());
    }
    if (input instanceof HTMLSelectElement) {
      input.addEventListener('change', () => void send());
    } else {
      input.addEventListener('keydown', event => {
        if (event.key === 'Enter') {
          void send();
        } else if (event.key === 'Escape') {
          input.value = String(this.model.detail?.hparams[name]);
          input.blur();
        }
      });
      input.addEventListener('blur', () => void send());
    }
    return row;
  }

  private rows = new Map<string, HTMLTableRowElement>();
  private readonly main = document.createElement('tbody');
  private readonly system = document.createElement('tbody');
}
