/**
 * The one typed helper for the server extension's REST API (under `hpinteract/api/`).
 *
 * Errors come back as `ApiError`, carrying the job's own message and the field it names
 * (the server turns a job's typed error into a 4xx reply with that content).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const API_NAMESPACE = 'hpinteract/api';

/** What the server says when it refuses: the job's typed error. */
export interface IErrorBody {
  type: string;
  message: string;
  field?: string | null;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = 'HpiError',
    readonly field: string | null = null
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** The URL of an endpoint under the extension's namespace, on the server's base URL. */
export function apiUrl(
  endPoint: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  return URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
}

/** The websocket URL of an endpoint; the token (if any) rides along, as Lab's own do. */
export function wsUrl(
  endPoint: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): string {
  const url = URLExt.join(settings.wsUrl, API_NAMESPACE, endPoint);
  return settings.token ? `${url}?token=${encodeURIComponent(settings.token)}` : url;
}

/**
 * Call the server extension and return its JSON reply.
 *
 * @param endPoint - path under `hpinteract/api/`, e.g. `jobs/<id>/hparams`
 * @param init - fetch options (method, body)
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      apiUrl(endPoint, settings),
      init,
      settings
    );
  } catch (error) {
    throw new ApiError(
      0,
      `cannot reach the Jupyter server: ${String(error)}`,
      'NetworkError'
    );
  }
  const text = await response.text();
  let data: unknown = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const body = (data as { error?: IErrorBody; message?: string } | null) ?? {};
    const error = body.error;
    if (error && typeof error.message === 'string') {
      throw new ApiError(
        response.status,
        error.message,
        error.type,
        error.field ?? null
      );
    }
    throw new ApiError(
      response.status,
      body.message ?? (response.statusText || `HTTP ${response.status}`)
    );
  }
  return data as T;
}

/** POST a JSON body. */
export function postAPI<T>(endPoint: string, body: unknown = {}): Promise<T> {
  return requestAPI<T>(endPoint, { method: 'POST', body: JSON.stringify(body) });
}
