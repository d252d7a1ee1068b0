/** The model: history then live records, markers, edits and their refusals, the job list. */
jest.mock('@jupyterlab/services', () => ({ ServerConnection: {} }));
jest.mock('@jupyterlab/coreutils', () => ({ URLExt: {} }));

import { IJobsApi } from '../src/api';
import {
  JobModel,
  JobsModel,
  MAX_POINTS,
  markerOf,
  parseInput,
  thin
} from '../src/model';
import { ApiError } from '../src/request';
import { IHParamSpec, IJobDetail, IJobSummary, StreamMessage } from '../src/types';

const spec = (
  kind: IHParamSpec['kind'],
  extra: Partial<IHParamSpec> = {}
): IHParamSpec => ({
  kind,
  default: null,
  low: null,
  high: null,
  choices: null,
  log: false,
  doc: '',
  ...extra
});

const summary = (id: string, state: IJobSummary['state'] = 'running'): IJobSummary => ({
  id,
  state,
  script: 'train.py',
  nproc: 2,
  created: 0,
  step: 10,
  epoch: 0,
  epochs: 5,
  progress: 0.1,
  loss: 0.5,
  updated: 0,
  error: null
});

const detail = (): IJobDetail => ({
  ...summary('j1'),
  hparams: { lr: 0.1, batch_size: 32, mode: 'a' },
  specs: {
    lr: spec('float', { low: 0, log: true }),
    batch_size: spec('int'),
    mode: spec('str', { choices: ['a', 'b'] })
  },
  system: [],
  last_changed: {},
  latest: { loss: 0.5 },
  events: [],
  checkpoints: []
});

class FakeApi implements IJobsApi {
  listed: IJobSummary[] = [];
  sent: Array<Record<string, unknown>> = [];
  onMessage: ((m: StreamMessage) => void) | null = null;
  closed = 0;
  opened: string[] = [];
  list = async () => this.listed;
  detail = async () => detail();
  set = async (_id: string, values: Record<string, unknown>) => {
    this.sent.push(values);
    if (typeof values.lr === 'number' && values.lr < 0) {
      throw new ApiError(
        400,
        `lr=${values.lr} is below the minimum 0.0`,
        'InvalidHParam',
        'lr'
      );
    }
    return { change_id: 'c1', applied_at_step: 42, values };
  };
  command = async () => ({ change_id: 'c2', applied_at_step: 43, state: 'pause' });
  stream(id: string, onMessage: (m: StreamMessage) => void) {
    this.opened.push(id);
    this.onMessage = onMessage;
    return { close: () => (this.closed += 1) };
  }
}

test('thin keeps the first, the last and every spike', () => {
  const n = 10000;
  const x = Array.from({ length: n }, (_, i) => i);
  const y: (number | null)[] = x.map(i => 1 / (1 + i));
  y[5000] = 99;
  y[7000] = null;
  const t = thin({ x, y }, 200);
  expect(t.x.length).toBeLessThanOrEqual(202);
  expect(t.x[0]).toBe(0);
  expect(t.x[t.x.length - 1]).toBe(n - 1);
  expect(t.x).toContain(5000);
  expect(t.x).toContain(7000);
});

test('typed input follows the spec; what does not parse is sent for the job to refuse', () => {
  expect(parseInput(spec('float'), ' 0.01 ')).toBe(0.01);
  expect(parseInput(spec('int'), 'abc')).toBe('abc');
  expect(parseInput(spec('bool'), 'true')).toBe(true);
  expect(parseInput(spec('int', { choices: [16, 32] }), '32')).toBe(32);
  expect(parseInput(spec('str'), 'x y')).toBe('x y');
});

test('only applied changes are markers', () => {
  expect(
    markerOf({
      seq: 1,
      kind: 'change',
      status: 'applied',
      applied_at_step: 9,
      values: { lr: 0.2 },
      source: 'lab'
    })
  ).toEqual({ step: 9, label: 'lr=0.2', source: 'lab' });
  expect(
    markerOf({ seq: 2, kind: 'change', status: 'rejected', values: { lr: -1 } })
  ).toBeNull();
  expect(markerOf({ seq: 3, kind: 'state', state: 'paused' })).toBeNull();
});

test('history then live records build the series; events update state and values', async () => {
  const api = new FakeApi();
  const job = new JobModel('j1', api);
  await job.load();
  expect(api.onMessage).not.toBeNull();
  api.onMessage!({
    type: 'history',
    metrics: { loss: { x: [0, 1], y: [1, 0.9] } },
    events: [
      {
        seq: 2,
        kind: 'change',
        status: 'applied',
        applied_at_step: 1,
        values: { lr: 0.1 }
      }
    ],
    count: 2,
    seq: 3
  });
  api.onMessage!({
    type: 'records',
    metrics: [
      { step: 2, loss: 0.8, lr: 0.05 },
      { step: 3, loss: 0.7, lr: 0.05 }
    ],
    events: [
      {
        seq: 6,
        kind: 'change',
        status: 'applied',
        applied_at_step: 2,
        values: { lr: 0.05 },
        source: 'api'
      },
      { seq: 7, kind: 'state', state: 'paused', step: 3 }
    ]
  });
  expect(job.series.get('loss')).toEqual({ x: [0, 1, 2, 3], y: [1, 0.9, 0.8, 0.7] });
  expect(job.series.get('lr')!.x).toEqual([2, 3]);
  expect(job.markers.map(m => m.step)).toEqual([1, 2]);
  expect(job.detail!.hparams.lr).toBe(0.05);
  expect(job.detail!.last_changed.lr).toBe(2);
  expect(job.state).toBe('paused');
  expect(job.detail!.step).toBe(4);
  api.onMessage!({ type: 'end', state: 'finished' });
  expect(job.ended).toBe(true);
  job.dispose();
  expect(api.closed).toBe(1);
});

test('long live series stay bounded', async () => {
  const api = new FakeApi();
  const job = new JobModel('j1', api);
  await job.load();
  api.onMessage!({ type: 'history', metrics: {}, events: [], count: 0, seq: 0 });
  const metrics = Array.from({ length: MAX_POINTS * 3 }, (_, i) => ({
    step: i,
    loss: Math.sin(i)
  }));
  api.onMessage!({ type: 'records', metrics, events: [] });
  const loss = job.series.get('loss')!;
  expect(loss.x.length).toBeLessThanOrEqual(MAX_POINTS + 1);
  expect(loss.x[0]).toBe(0);
  expect(loss.x[loss.x.length - 1]).toBe(MAX_POINTS * 3 - 1);
});

test('an accepted edit records the step; a refused one its message, and nothing changes', async () => {
  const api = new FakeApi();
  const job = new JobModel('j1', api);
  await job.load();
  expect(await job.setValue('lr', '0.02')).toBe(true);
  expect(api.sent).toEqual([{ lr: 0.02 }]);
  expect(job.acked.get('lr')).toBe(42);
  expect(job.detail!.hparams.lr).toBe(0.02);
  expect(await job.setValue('lr', '-1')).toBe(false);
  expect(job.errors.get('lr')).toBe('lr=-1 is below the minimum 0.0');
  expect(job.detail!.hparams.lr).toBe(0.02);
  expect(await job.setValue('lr', '0.03')).toBe(true);
  expect(job.errors.has('lr')).toBe(false);
});

test('commands report their step', async () => {
  const api = new FakeApi();
  const job = new JobModel('j1', api);
  await job.load();
  await job.command('pause');
  expect(job.message).toBe('pause at step 43');
  expect(job.state).toBe('paused');
});

test('the job list notices new jobs, counts running ones, and selects one at a time', async () => {
  const api = new FakeApi();
  const jobs = new JobsModel(api, 1000);
  let changes = 0;
  jobs.changed.connect(() => (changes += 1));
  api.listed = [summary('j1')];
  await jobs.refresh();
  await jobs.refresh(); // unchanged: no signal
  expect(changes).toBe(1);
  api.listed = [summary('j2'), summary('j1', 'finished')];
  await jobs.refresh();
  expect(jobs.jobs.map(j => j.id)).toEqual(['j2', 'j1']);
  expect(jobs.running).toBe(1);
  const first = jobs.select('j1');
  expect(jobs.select('j1')).toBe(first);
  jobs.select('j2');
  await new Promise(resolve => setTimeout(resolve, 0));
  // j1 was replaced before its detail arrived: it never opened a stream; j2 did.
  expect(api.opened).toEqual(['j2']);
  jobs.dispose();
  expect(api.closed).toBe(1);
});

test('a list that cannot be fetched is reported, not thrown', async () => {
  const api = new FakeApi();
  api.list = async () => {
    throw new ApiError(0, 'cannot reach the Jupyter server', 'NetworkError');
  };
  const jobs = new JobsModel(api);
  await jobs.refresh();
  expect(jobs.error).toBe('cannot reach the Jupyter server');
});
