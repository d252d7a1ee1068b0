/** The server extension's JSON shapes (hpinteract/server/service.py and socket.py). */

export type JobStateName =
  'starting' | 'running' | 'paused' | 'stopping' | 'failing' | 'finished' | 'failed';

export const TERMINAL: ReadonlySet<string> = new Set(['finished', 'failed']);

export interface IJobSummary {
  id: string;
  state: JobStateName;
  script: string | null;
  nproc: number | null;
  created: number | null;
  step: number | null;
  epoch: number | null;
  epochs: number | null;
  progress: number | null;
  loss: number | null;
  updated: number | null;
  error: { rank: number | null; message: string } | null;
}

export interface IHParamSpec {
  kind: 'int' | 'float' | 'bool' | 'str';
  default: unknown;
  low: number | null;
  high: number | null;
  choices: unknown[] | null;
  log: boolean;
  doc: string;
}

/** A record of the job's events log: a change, a state, a policy decision, ... */
export interface IJobEvent {
  seq: number;
  kind: string;
  source?: string;
  status?: string;
  step?: number;
  applied_at_step?: number;
  values?: Record<string, unknown>;
  state?: string;
  reason?: string;
  error?: string;
  [key: string]: unknown;
}

export interface ICheckpoint {
  step: number;
  file: string;
  path: string;
  periodic: boolean;
  time: number;
}

export interface IJobDetail extends IJobSummary {
  hparams: Record<string, unknown>;
  specs: Record<string, IHParamSpec>;
  /** The names of hpinteract's own knobs (monitors, checkpoints, sync, workers). */
  system: string[];
  last_changed: Record<string, number>;
  latest: Record<string, number | null>;
  events: IJobEvent[];
  checkpoints: ICheckpoint[];
}

export interface IAck {
  change_id: string;
  applied_at_step: number;
  values?: Record<string, unknown>;
  state?: string | null;
  path?: string | null;
}

export type Command = 'pause' | 'resume' | 'stop' | 'checkpoint';

/** One metric's points as the chart holds them. */
export interface ISeries {
  x: number[];
  y: (number | null)[];
}

export interface IHistoryMessage {
  type: 'history';
  metrics: Record<string, ISeries>;
  events: IJobEvent[];
  count: number;
  seq: number;
}

export interface IRecordsMessage {
  type: 'records';
  metrics: Array<{ step: number; [name: string]: number | null }>;
  events: IJobEvent[];
}

export interface IEndMessage {
  type: 'end';
  state: JobStateName;
}

export interface IErrorMessage {
  type: 'error';
  message: string;
}

export type StreamMessage =
  IHistoryMessage | IRecordsMessage | IEndMessage | IErrorMessage;
