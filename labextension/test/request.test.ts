/** The request helper: URLs under the base URL, JSON replies, the job's errors typed. */
const makeRequest = jest.fn();

jest.mock('@jupyterlab/services', () => ({
  ServerConnection: {
    makeSettings: () => ({
      baseUrl: 'http://h/base/',
      wsUrl: 'ws://h/base/',
      token: 'tk'
    }),
    makeRequest: (...args: unknown[]) => makeRequest(...args)
  }
}));
jest.mock('@jupyterlab/coreutils', () => ({
  URLExt: {
    join: (...parts: string[]) =>
      parts
        .map((p, i) => (i === 0 ? p.replace(/\/+$/, '') : p.replace(/^\/+|\/+$/g, '')))
        .join('/')
  }
}));

import { ApiError, apiUrl, postAPI, requestAPI, wsUrl } from '../src/request';

function reply(status: number, body: string, statusText = ''): Response {
  return {
    ok: status >= 200 && status < 300,
    status,
    statusText,
    text: async () => body
  } as Response;
}

beforeEach(() => makeRequest.mockReset());

test('URLs are under the server base URL and the token rides on websockets', () => {
  expect(apiUrl('jobs')).toBe('http://h/base/hpinteract/api/jobs');
  expect(wsUrl('jobs/a/stream')).toBe(
    'ws://h/base/hpinteract/api/jobs/a/stream?token=tk'
  );
});

test('a JSON reply is parsed', async () => {
  makeRequest.mockResolvedValue(reply(200, '[{"id": "j1"}]'));
  await expect(requestAPI<{ id: string }[]>('jobs')).resolves.toEqual([{ id: 'j1' }]);
  expect(makeRequest.mock.calls[0][0]).toBe('http://h/base/hpinteract/api/jobs');
});

test('postAPI sends JSON with POST', async () => {
  makeRequest.mockResolvedValue(reply(200, '{"applied_at_step": 7}'));
  await postAPI('jobs/j1/hparams', { values: { lr: 0.1 } });
  const init = makeRequest.mock.calls[0][1] as RequestInit;
  expect(init.method).toBe('POST');
  expect(JSON.parse(String(init.body))).toEqual({ values: { lr: 0.1 } });
});

test("the job's refusal becomes an ApiError with its message and field", async () => {
  const body = {
    error: {
      type: 'InvalidHParam',
      message: 'lr=-1 is below the minimum 0.0',
      field: 'lr'
    }
  };
  makeRequest.mockResolvedValue(reply(400, JSON.stringify(body)));
  const error = await requestAPI('jobs/j1/hparams').catch(e => e);
  expect(error).toBeInstanceOf(ApiError);
  expect(error).toMatchObject({
    status: 400,
    type: 'InvalidHParam',
    field: 'lr',
    message: 'lr=-1 is below the minimum 0.0'
  });
});

test('a reply that is not JSON still gives a useful error', async () => {
  makeRequest.mockResolvedValue(reply(404, '<html>Not Found</html>', 'Not Found'));
  await expect(requestAPI('jobs/nope')).rejects.toMatchObject({
    status: 404,
    message: 'Not Found'
  });
});

test('a server that cannot be reached is an ApiError too', async () => {
  makeRequest.mockRejectedValue(new TypeError('Failed to fetch'));
  await expect(requestAPI('jobs')).rejects.toMatchObject({
    status: 0,
    type: 'NetworkError'
  });
});
