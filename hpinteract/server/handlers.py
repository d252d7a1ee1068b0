"""Authenticated REST handlers over ``service``: list, inspect, set, pause/resume/stop/checkpoint.

Runs in: the Jupyter server process. Every method is ``@web.authenticated`` and
``@authorized`` against the resource ``hpinteract`` (the server's own identity provider
and authorizer decide; no CORS header is ever set here, so origins follow the server's
rules). Calls to jobs block (a command waits for a step boundary), so they run in a thread,
never on the server's event loop. A job's typed error becomes a 4xx reply carrying the
job's own message and the field it names.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..protocol.errors import (
    AuthError,
    CheckpointError,
    HpiError,
    HpiTimeout,
    InvalidState,
    JobFailed,
    JobNotFound,
)
from . import service

AUTH_RESOURCE = "hpinteract"
# The HTTP status of each typed error; any other HpiError is the request's fault (400).
STATUS: dict[type[HpiError], int] = {
    JobNotFound: 404, InvalidState: 409, JobFailed: 409, HpiTimeout: 504,
    AuthError: 502, CheckpointError: 500,
}


def status_of(exc: HpiError) -> int:
    return next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400)


def jsonable(obj: Any) -> Any:
    """JSON without NaN/inf (the browser's parser refuses them): they become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), allow_nan=False, default=str)


class Base(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def jobs(self) -> service.Jobs:
        return self.settings["hpinteract_jobs"]  # type: ignore[no-any-return]

    async def reply(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            result = await asyncio.to_thread(fn, *args)
        except HpiError as exc:
            self.set_status(status_of(exc))
            self.finish(dumps({"error": exc.to_wire()}))
            return
        self.finish(dumps(result))

    def body(self) -> Any:
        try:
            return json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "the request body is not JSON") from None


class JobsHandler(Base):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.reply(self.jobs.summaries)


class JobHandler(Base):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        await self.reply(lambda: service.detail(self.jobs.get(job_id)))


class HParamsHandler(Base):
    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        body = self.body()
        await self.reply(lambda: service.set_hparams(self.jobs.get(job_id), body))


class CommandHandler(Base):
    @web.authenticated
    @authorized
    async def post(self, job_id: str, op: str) -> None:
        await self.reply(lambda: service.command(self.jobs.get(job_id), op))
