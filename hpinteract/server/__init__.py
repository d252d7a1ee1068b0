"""The Jupyter server extension: the JupyterLab panel's authenticated bridge to jobs.

Runs in: the Jupyter server process. A browser cannot speak ZeroMQ, so these routes (under
the server's base_url) use the project's client for it. This module only registers them;
the logic is in ``service`` (plain data), ``handlers`` (REST) and ``socket`` (websocket).
"""

from __future__ import annotations

from typing import Any

JOB = r"(?P<job_id>[0-9A-Za-z_-]+)"


def _load_jupyter_server_extension(server_app: Any) -> None:
    from jupyter_server.utils import url_path_join

    from .handlers import CommandHandler, HParamsHandler, JobHandler, JobsHandler
    from .service import COMMANDS, Jobs
    from .socket import JobSocket

    web_app = server_app.web_app
    web_app.settings["hpinteract_jobs"] = Jobs()
    base = url_path_join(web_app.settings["base_url"], "hpinteract", "api")
    ops = "|".join(COMMANDS)
    web_app.add_handlers(".*$", [
        (url_path_join(base, "jobs"), JobsHandler),
        (url_path_join(base, "jobs", JOB), JobHandler),
        (url_path_join(base, "jobs", JOB, "hparams"), HParamsHandler),
        (url_path_join(base, "jobs", JOB, f"(?P<op>{ops})"), CommandHandler),
        (url_path_join(base, "jobs", JOB, "stream"), JobSocket),
    ])
    server_app.log.info("hpinteract: server extension loaded at %s", base)
