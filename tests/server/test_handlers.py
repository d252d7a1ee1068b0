"""The REST handlers and the websocket in a real Jupyter server, against a real 2-rank job:
authentication on every route, the job's own errors as 4xx, history before live records."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClosedError

API = ("hpinteract", "api")
NO_TOKEN = {"Authorization": "token not-the-token"}


async def call(jp_fetch, *parts, method="GET", body=None, headers=None):
    kwargs = {"method": method, "raise_error": False, "headers": headers}
    if method == "POST":
        kwargs["body"] = json.dumps(body if body is not None else {})
    r = await jp_fetch(*API, *parts, **kwargs)
    json_reply = "json" in r.headers.get("Content-Type", "")
    return r.code, (json.loads(r.body) if json_reply and r.body else None)


def routes(job_id):
    return [("GET", ("jobs",)), ("GET", ("jobs", job_id)),
            ("POST", ("jobs", job_id, "hparams")), ("POST", ("jobs", job_id, "pause")),
            ("POST", ("jobs", job_id, "checkpoint"))]


async def test_every_route_refuses_a_request_without_the_token(jp_fetch, jp_ws_fetch, job):
    before = job.hparams
    for method, parts in routes(job.id):
        code, _ = await call(jp_fetch, *parts, method=method, body={"values": {"lr": 0.5}},
                             headers=NO_TOKEN)
        assert code == 403, (method, parts, code)
    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch(*API, "jobs", job.id, "stream", headers=NO_TOKEN)
    assert err.value.code == 403
    assert job.hparams == before and job.status()["state"] == "running"


async def login_cookie(jp_fetch) -> str:
    """A browser's session: the server's login cookie, got once with the token."""
    r = await jp_fetch("api", "status")
    cookies = r.headers.get_list("Set-Cookie")
    return "; ".join(c.split(";", 1)[0] for c in cookies)


async def test_origins_follow_the_servers_rules(jp_fetch, jp_ws_fetch, jp_http_port, job):
    # A browser session (cookie, no token) from another origin is refused, as the server
    # refuses its own kernel websockets; from the server's own origin it is let in.
    # (Token-authenticated requests skip the check, by the server's rule: not a browser.)
    cookie = await login_cookie(jp_fetch)
    assert cookie, "the server set no login cookie"
    # The cookie is named after the host it was set for: the websocket names the same one.
    session = {"Authorization": "", "Cookie": cookie, "Host": f"127.0.0.1:{jp_http_port}"}
    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch(*API, "jobs", job.id, "stream",
                          headers={**session, "Origin": "http://evil.example"})
    assert err.value.code == 403
    code, _ = await call(jp_fetch, "jobs", job.id, "pause", method="POST",
                         headers={**session, "Origin": "http://evil.example"})
    # The server answers a blocked cross-origin API request with 404 (its rule, not ours).
    assert code == 404 and job.status()["state"] == "running"
    ws = await jp_ws_fetch(*API, "jobs", job.id, "stream", headers=session)
    assert json.loads(await ws.read_message())["type"] == "history"
    ws.close()
    r = await jp_fetch(*API, "jobs", raise_error=False, headers={**session,
                                                               "Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in r.headers  # no CORS wildcard, ever


async def test_jobs_list_and_detail(jp_fetch, job):
    code, jobs = await call(jp_fetch, "jobs")
    assert code == 200
    mine = next(j for j in jobs if j["id"] == job.id)
    assert mine["state"] == "running" and mine["nproc"] == 2 and mine["step"] > 0
    code, detail = await call(jp_fetch, "jobs", job.id)
    assert code == 200
    assert detail["hparams"]["batch_size"] == 16 and detail["specs"]["lr"]["log"] is True
    assert {"monitor_gns", "checkpoint_every", "sync", "workers"} <= set(detail["system"])
    assert not {"lr", "batch_size"} & set(detail["system"])
    assert detail["events"] and detail["events"][0]["kind"] == "state"
    code, body = await call(jp_fetch, "jobs", "20000101-000000-abcdef")
    assert code == 404 and "no job" in body["error"]["message"]


async def test_set_is_acknowledged_and_invalid_input_gets_the_jobs_message(jp_fetch, job):
    code, ack = await call(jp_fetch, "jobs", job.id, "hparams", method="POST",
                           body={"values": {"lr": 0.02}})
    assert code == 200 and ack["values"] == {"lr": 0.02} and ack["applied_at_step"] > 0
    assert job.hparams["lr"] == 0.02
    events = job.events()
    assert events[events.id == ack["change_id"]].iloc[0]["source"] == "lab"
    for values, field, words in [({"lr": -1.0}, "lr", "below the minimum"),
                                 ({"nope": 1}, "nope", "unknown"),
                                 ({"batch_size": "big"}, "batch_size", "must be int")]:
        code, body = await call(jp_fetch, "jobs", job.id, "hparams", method="POST",
                                body={"values": values})
        assert code == 400, body
        assert body["error"]["type"] == "InvalidHParam" and body["error"]["field"] == field
        assert words in body["error"]["message"]
    code, body = await call(jp_fetch, "jobs", job.id, "hparams", method="POST",
                            body={"lr": 0.1})
    assert code == 400 and '{"values"' in body["error"]["message"]
    r = await jp_fetch(*API, "jobs", job.id, "hparams", method="POST", body="{not json",
                       raise_error=False)
    assert r.code == 400
    assert job.hparams["lr"] == 0.02  # nothing of the above applied


async def test_commands_follow_the_jobs_state(jp_fetch, job):
    code, ack = await call(jp_fetch, "jobs", job.id, "pause", method="POST")
    assert code == 200 and ack["state"] == "pause"
    code, body = await call(jp_fetch, "jobs", job.id, "pause", method="POST")
    assert code == 409 and "cannot pause" in body["error"]["message"]
    code, ack = await call(jp_fetch, "jobs", job.id, "checkpoint", method="POST")
    assert code == 200 and ack["path"].endswith(".pt")
    code, _ = await call(jp_fetch, "jobs", job.id, "resume", method="POST")
    assert code == 200 and job.status()["state"] == "running"
    code, _ = await call(jp_fetch, "jobs", job.id, "explode", method="POST")
    assert code == 404  # no such route


async def test_the_websocket_sends_the_history_then_live_records(jp_fetch, jp_ws_fetch, job):
    ws = await jp_ws_fetch(*API, "jobs", job.id, "stream")
    try:
        first = json.loads(await ws.read_message())
        assert first["type"] == "history"
        loss = first["metrics"]["loss"]
        assert len(loss["x"]) == len(loss["y"]) > 0 and "lr" in first["metrics"]
        last_step = loss["x"][-1]
        await call(jp_fetch, "jobs", job.id, "hparams", method="POST",
                   body={"values": {"lr": 0.015}})
        steps, changes = [], []
        # The history ends at the job's columnar copy (written once a second), so an
        # earlier test's change may come live before this one's: wait for this one.
        while {"lr": 0.015} not in changes or len(steps) < 20:
            msg = json.loads(await ws.read_message())
            assert msg["type"] == "records", msg
            steps += [r["step"] for r in msg["metrics"]]
            changes += [e["values"] for e in msg["events"] if e["kind"] == "change"]
        # Live records continue where the history stopped: none twice, none missed.
        assert steps[0] == last_step + 1 and steps == list(range(steps[0], steps[-1] + 1))
        assert changes[-1] == {"lr": 0.015}
    finally:
        ws.close()


async def test_a_finished_job_streams_its_history_and_then_the_end(jp_fetch, jp_ws_fetch, job):
    job.stop()
    job.wait(60)
    ws = await jp_ws_fetch(*API, "jobs", job.id, "stream")
    kinds = []
    try:
        while "end" not in kinds:
            msg = await ws.read_message()
            if msg is None:
                break
            kinds.append(json.loads(msg)["type"])
    except WebSocketClosedError:
        pass
    assert kinds[0] == "history" and kinds[-1] == "end"
    code, body = await call(jp_fetch, "jobs", job.id, "hparams", method="POST",
                            body={"values": {"lr": 0.1}})
    assert code == 409 and "finished" in body["error"]["message"]
