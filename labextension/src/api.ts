/** The server extension's endpoints, as one interface the models use (and tests replace). */
import { postAPI, requestAPI, wsUrl } from './request';
import { Command, IAck, IJobDetail, IJobSummary, StreamMessage } from './types';

export interface IStreamHandle {
  close(): void;
}

export interface IJobsApi {
  list(): Promise<IJobSummary[]>;
  detail(id: string): Promise<IJobDetail>;
  set(id: string, values: Record<string, unknown>): Promise<IAck>;
  command(id: string, op: Command): Promise<IAck>;
  /** Open the job's stream: history first, then live records, then `end`. */
  stream(
    id: string,
    onMessage: (message: StreamMessage) => void,
    onClose: () => void
  ): IStreamHandle;
}

const job = (id: string, rest = ''): string =>
  `jobs/${encodeURIComponent(id)}${rest ? '/' + rest : ''}`;

export const serverApi: IJobsApi = {
  list: () => requestAPI<IJobSummary[]>('jobs'),
  detail: id => requestAPI<IJobDetail>(job(id)),
  set: (id, values) => postAPI<IAck>(job(id, 'hparams'), { values }),
  command: (id, op) => postAPI<IAck>(job(id, op)),
  stream(id, onMessage, onClose) {
    const socket = new WebSocket(wsUrl(job(id, 'stream')));
    socket.onmessage = event => {
      onMessage(JSON.parse(String(event.data)) as StreamMessage);
    };
    socket.onclose = () => onClose();
    return { close: () => socket.close() };
  }
};
