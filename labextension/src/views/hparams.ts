/**
 * The selected job's hyper-parameters as an editable table: one input per spec (a select
 * for choices and booleans), applied on Enter or when the input loses focus; the job's
 * refusal is shown on the row, the acknowledged step on success.
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

export class HParamTable extends Widget {
  constructor(private readonly model: JobModel) {
    super({ node: document.createElement('table') });
    this.addClass('hpi-hparams');
  }

  /** Rebuild the rows, except one the user is typing in (so a redraw never eats input). */
  update(): void {
    const detail = this.model.detail;
    if (!detail) {
      return;
    }
    const focused = document.activeElement;
    for (const [name, spec] of Object.entries(detail.specs)) {
      let row = this.rows.get(name);
      if (!row) {
        row = this.makeRow(name, spec, detail.hparams[name]);
        this.rows.set(name, row);
        this.node.append(row);
      }
      const input = row.querySelector('input, select') as
        HTMLInputElement | HTMLSelectElement;
      const value = String(detail.hparams[name]);
      if (input !== focused && input.dataset.sent !== 'pending') {
        input.value = value;
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
}
