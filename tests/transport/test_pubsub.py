"""The clone pattern on real sockets: history, then live, each record once, gaps filled."""

import time

import zmq

from hpinteract.transport.pubsub import CatchUp, Publisher, Subscriber

KEY = b"p" * 32


def test_history_then_live_without_duplicates_or_gaps():
    ctx = zmq.Context.instance()
    pub = Publisher(ctx, KEY)
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{pub.port}", KEY)
    log = [{"seq": i, "step": i} for i in range(1, 51)]

    def fetch(since):
        page = [r for r in log if r["seq"] > since][:20]  # paged, as the coordinator does
        return page, bool(page) and page[-1]["seq"] < log[-1]["seq"]

    time.sleep(0.3)  # let the subscription reach the publisher
    for i in range(40, 56):  # overlaps the history (40..50) and goes beyond it
        if i in (53,):  # a lost live message: must be filled from the log
            log.append({"seq": i, "step": i})
            continue
        if i > 50:
            log.append({"seq": i, "step": i})
        pub.publish([{"seq": i, "step": i}])
    got = [r["seq"] for r in CatchUp(sub, fetch)(timeout_s=0.5)]
    assert got == list(range(1, 56))
    sub.close()
    pub.close()


def test_forged_publications_are_dropped():
    ctx = zmq.Context.instance()
    pub = Publisher(ctx, b"z" * 32)  # someone else's key
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{pub.port}", KEY)
    time.sleep(0.3)
    pub.publish([{"seq": 1}])
    assert sub.recv(0.5) is None
    sub.close()
    pub.close()
