/**
 * The panel's state, separate from its views: the list of jobs (polled), and the selected
 * job (its detail, its stream of metrics and events, the outcome of the user's edits).
 * Views listen to `changed` and redraw; nothing here touches the DOM.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { IJobsApi, IStreamHandle, serverApi } from './api';
import { ApiError } from './request';
import {
  Command,
  IHParamSpec,
  IJobDetail,
  IJobEvent,
  IJobSummary,
  ISeries,
  StreamMessage,
  TERMINAL
} from './types';

/** Points per series before the chart's data is thinned (first, last and extremes kept). */
export const MAX_POINTS = 4000;
const EVENTS_KEPT = 50;

/** A marker on the chart: a hyper-parameter change, where it took effect. */
export interface IMarker {
  step: number;
  label: string;
  source: string;
}

/**
 * Keep `budget` points at most: per bucket its smallest and largest value, plus the first
 * and the last point, so that spikes survive thinning (a NaN counts as an extreme).
 */
export function thin(series: ISeries, budget: number): ISeries {
  const n = series.x.length;
  if (n <= budget) {
    return series;
  }
  const buckets = Math.max(1, Math.floor((budget - 2) / 2));
  const size = Math.ceil(n / buckets);
  const keep = new Set<number>([0, n - 1]);
  for (let start = 0; start < n; start += size) {
    let lo = start;
    let hi = start;
    for (let i = start; i < Math.min(n, start + size); i++) {
      const v = series.y[i];
      const vlo = series.y[lo];
      const vhi = series.y[hi];
      if (v === null || (vlo !== null && v < vlo)) {
        lo = i;
      }
      if (v !== null && (vhi === null || v > vhi)) {
        hi = i;
      }
    }
    keep.add(lo).add(hi);
  }
  const idx = [...keep].sort((a, b) => a - b);
  return { x: idx.map(i => series.x[i]), y: idx.map(i => series.y[i]) };
}

/** A typed value from what the user typed, by the spec's kind. What does not parse is sent
 * as typed, so that the job refuses it with its own message. */
export function parseInput(spec: IHParamSpec | undefined, text: string): unknown {
  const t = text.trim();
  if (spec?.choices) {
    const match = spec.choices.find(c => String(c) === t);
    return match === undefined ? t : match;
  }
  switch (spec?.kind) {
    case 'bool':
      return t === 'true' ? true : t === 'false' ? false : t;
    case 'int':
    case 'float': {
      const v = Number(t);
      return t !== '' && Number.isFinite(v) ? v : t;
    }
    default:
      return text;
  }
}

export function markerOf(event: IJobEvent): IMarker | null {
  if (event.kind !== 'change' || event.status !== 'applied') {
    return null;
  }
  const step = event.applied_at_step;
  if (typeof step !== 'number') {
    return null;
  }
  const values = Object.entries(event.values ?? {})
    .map(([k, v]) => `${k}=${String(v)}`)
    .join(', ');
  return { step, label: values, source: event.source ?? '?' };
}

/** One job: detail, chart series, markers, events and the outcome of edits. */
export class JobModel {
  constructor(
    readonly id: string,
    private readonly api: IJobsApi = serverApi
  ) {}

  detail: IJobDetail | null = null;
  readonly series = new Map<string, ISeries>();
  markers: IMarker[] = [];
  events: IJobEvent[] = [];
  /** Per hyper-parameter: the job's refusal of the last edit, shown next to it. */
  readonly errors = new Map<string, string>();
  /** Per hyper-parameter: the step at which the last edit from here took effect. */
  readonly acked = new Map<string, number>();
  message = '';
  ended = false;
  loaded = false;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get state(): string {
    return this.detail?.state ?? 'starting';
  }

  /** Fetch the detail and follow the stream. */
  async load(): Promise<void> {
    try {
      this.detail = await this.api.detail(this.id);
    } catch (error) {
      this.message = error instanceof Error ? error.message : String(error);
      this._changed.emit();
      return;
    }
    this.events = this.detail.events.slice(-EVENTS_KEPT);
    this.ended = TERMINAL.has(this.detail.state);
    this._changed.emit();
    if (!this._disposed) {
      this._stream = this.api.stream(
        this.id,
        m => this.handle(m),
        () => {
          this._stream = null;
        }
      );
    }
  }

  /** Apply one message of the job's stream. */
  handle(message: StreamMessage): void {
    switch (message.type) {
      case 'history':
        this.series.clear();
        for (const [name, s] of Object.entries(message.metrics)) {
          this.series.set(name, { x: [...s.x], y: [...s.y] });
        }
        this.markers = message.events.map(markerOf).filter((m): m is IMarker => !!m);
        this.loaded = true;
        break;
      case 'records':
        for (const rec of message.metrics) {
          this.addRecord(rec);
        }
        for (const event of message.events) {
          this.addEvent(event);
        }
        break;
      case 'end':
        this.ended = true;
        if (this.detail) {
          this.detail = { ...this.detail, state: message.state };
        }
        break;
      case 'error':
        this.message = message.message;
        break;
    }
    this._changed.emit();
  }

  private addRecord(rec: { step: number; [name: string]: number | null }): void {
    for (const [name, value] of Object.entries(rec)) {
      if (name === 'step') {
        continue;
      }
      let s = this.series.get(name);
      if (!s) {
        s = { x: [], y: [] };
        this.series.set(name, s);
      }
      s.x.push(rec.step);
      s.y.push(value);
      if (s.x.length > MAX_POINTS) {
        this.series.set(name, thin(s, MAX_POINTS / 2));
      }
    }
    if (this.detail) {
      const latest = { ...this.detail.latest, ...rec };
      this.detail = {
        ...this.detail,
        step: rec.step + 1,
        latest,
        loss: latest.loss ?? null
      };
    }
  }

  private addEvent(event: IJobEvent): void {
    this.events = [...this.events, event].slice(-EVENTS_KEPT);
    const marker = markerOf(event);
    if (marker) {
      this.markers = [...this.markers, marker];
    }
    if (!this.detail) {
      return;
    }
    if (event.kind === 'state' && typeof event.state === 'string') {
      this.detail = { ...this.detail, state: event.state as IJobDetail['state'] };
    }
    if (marker && event.values) {
      const hparams = { ...this.detail.hparams, ...event.values };
      const last_changed = { ...this.detail.last_changed };
      for (const name of Object.keys(event.values)) {
        last_changed[name] = marker.step;
      }
      this.detail = { ...this.detail, hparams, last_changed };
    }
  }

  /** Send an edit; the job's refusal is kept by name, nothing is applied then. */
  async setValue(name: string, text: string): Promise<boolean> {
    const value = parseInput(this.detail?.specs[name], text);
    try {
      const ack = await this.api.set(this.id, { [name]: value });
      this.errors.delete(name);
      this.acked.set(name, ack.applied_at_step);
      if (this.detail) {
        const hparams = {
          ...this.detail.hparams,
          ...(ack.values ?? { [name]: value })
        };
        const last_changed = {
          ...this.detail.last_changed,
          [name]: ack.applied_at_step
        };
        this.detail = { ...this.detail, hparams, last_changed };
      }
      return true;
    } catch (error) {
      const field = error instanceof ApiError && error.field ? error.field : name;
      this.errors.set(field, error instanceof Error ? error.message : String(error));
      return false;
    } finally {
      this._changed.emit();
    }
  }

  async command(op: Command): Promise<void> {
    try {
      const ack = await this.api.command(this.id, op);
      this.message =
        op === 'checkpoint'
          ? `checkpoint at step ${ack.applied_at_step}: ${ack.path ?? ''}`
          : `${op} at step ${ack.applied_at_step}`;
      if (this.detail && ack.state && op !== 'checkpoint') {
        const state = { pause: 'paused', resume: 'running', stop: 'stopping' }[op];
        this.detail = { ...this.detail, state: state as IJobDetail['state'] };
      }
    } catch (error) {
      this.message = `${op}: ${error instanceof Error ? error.message : String(error)}`;
    }
    this._changed.emit();
  }

  dispose(): void {
    this._disposed = true;
    this._stream?.close();
    this._stream = null;
    Signal.clearData(this);
  }

  private _changed = new Signal<this, void>(this);
  private _stream: IStreamHandle | null = null;
  private _disposed = false;
}

/** Every job (polled from the run directories) and which one is selected. */
export class JobsModel {
  constructor(
    private readonly api: IJobsApi = serverApi,
    readonly pollMs = 2000
  ) {}

  jobs: IJobSummary[] = [];
  error = '';
  selected: JobModel | null = null;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Jobs not yet finished or failed. */
  get running(): number {
    return this.jobs.filter(j => !TERMINAL.has(j.state)).length;
  }

  async refresh(): Promise<void> {
    let jobs: IJobSummary[];
    try {
      jobs = await this.api.list();
      this.error = '';
    } catch (error) {
      this.error = error instanceof Error ? error.message : String(error);
      this._changed.emit();
      return;
    }
    if (JSON.stringify(jobs) !== JSON.stringify(this.jobs)) {
      this.jobs = jobs;
      this._changed.emit();
    }
  }

  /** Poll for new jobs and their progress until disposed. */
  start(): void {
    if (this._timer === null) {
      void this.refresh();
      this._timer = setInterval(() => void this.refresh(), this.pollMs);
    }
  }

  select(id: string | null): JobModel | null {
    if (this.selected?.id === id) {
      return this.selected;
    }
    this.selected?.dispose();
    this.selected = id === null ? null : new JobModel(id, this.api);
    void this.selected?.load();
    this._changed.emit();
    return this.selected;
  }

  dispose(): void {
    if (this._timer !== null) {
      clearInterval(this._timer);
      this._timer = null;
    }
    this.selected?.dispose();
    Signal.clearData(this);
  }

  private _changed = new Signal<this, void>(this);
  private _timer: ReturnType<typeof setInterval> | null = null;
}
