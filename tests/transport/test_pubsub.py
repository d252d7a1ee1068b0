"""The clone pattern on real sockets: history, then live, each record once, gaps filled."""

import time

import zmq

from hpinteract.protocol.codec import Codec
from hpinteract.transport.pubsub import CatchUp, Publisher, Subscriber

KEY = b"p" * 32


def test_history_then_live_without_duplicates_or_gaps():
    ctx = zmq.Context.instance()
    pub = Publisher(ctx, KEY)
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{pub.port}", KEY)
    log = [{"seq": i, "step": i} for i in range(1, 51)]
    served: list[int] = []  # what came from the log, not over the socket

    def fetch(since):
        page = [r for r in log if r["seq"] > since][:20]  # paged, as the coordinator does
        served.extend(r["seq"] for r in page)
        more = bool(page) and page[-1]["seq"] < log[-1]["seq"]
        if not more and len(log) == 50:
            # The history is read: the job goes on, publishing 40..55 (overlapping the
            # history) and logging 51..55; 53 is lost on the way.
            for i in range(40, 56):
                if i > 50:
                    log.append({"seq": i, "step": i})
                if i != 53:
                    pub.publish([{"seq": i, "step": i}])
        return page, more, 0

    time.sleep(0.3)  # let the subscription reach the publisher
    got = [r["seq"] for r in CatchUp(sub, fetch)(timeout_s=0.5)]
    assert got == list(range(1, 56))  # each once, in order
    # 1..50 from the history, 51 and 52 live (the overlap 40..50 dropped), 53 lost and
    # filled from the log, with 54 and 55 in the same page (their live copies dropped).
    assert served == [*range(1, 51), 53, 54, 55]
    sub.close()
    pub.close()


def test_lasting_holes_are_skipped_once_the_log_is_known_complete_past_them():
    """A resumed job's log lacks the seqs of the steps it set aside; nothing after such a
    hole may be lost, and a hole the log may still fill (not yet flushed) is waited on."""
    ctx = zmq.Context.instance()
    pub = Publisher(ctx, KEY)
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{pub.port}", KEY)
    log = [{"seq": i} for i in (*range(1, 11), *range(16, 21))]  # 11..15 set aside
    durable = {"to": 0}

    def fetch(since):
        return [r for r in log if r["seq"] > since], False, durable["to"]

    time.sleep(0.3)
    catch = CatchUp(sub, fetch)
    assert [r["seq"] for r in catch(timeout_s=0.2)] == list(range(1, 11))  # may be unflushed
    durable["to"] = 20  # the coordinator's answer: its log is complete up to its head
    assert [r["seq"] for r in catch(timeout_s=0.2)] == list(range(16, 21))

    # Without that knowledge, a live record beyond the hole proves it: the job writes the
    # logs before publishing, so the history's records between hole and live one all come.
    durable["to"] = 0
    catch = CatchUp(sub, fetch)
    assert [r["seq"] for r in catch(timeout_s=0.2)] == list(range(1, 11))
    log.append({"seq": 21})
    pub.publish([{"seq": 21}])
    assert [r["seq"] for r in catch(timeout_s=0.5)] == list(range(16, 22))
    sub.close()
    pub.close()


def test_forged_publications_are_dropped(caplog):
    ctx = zmq.Context.instance()
    pub = Publisher(ctx, KEY)
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{pub.port}", KEY)
    deadline = time.monotonic() + 10
    while (got := sub.recv(0.1)) is None:  # until the subscription is live
        assert time.monotonic() < deadline
        pub.publish([{"seq": 1}])
    assert got == [{"seq": 1}]
    while sub.recv(0.1) is not None:  # the extra copies sent while waiting
        pass
    genuine = pub.codec
    pub.codec = Codec(b"z" * 32)  # someone else's key, on the same live socket
    pub.publish([{"seq": 2}])
    pub.codec = genuine
    pub.publish([{"seq": 3}])
    assert sub.recv(2.0) == [{"seq": 3}]  # the forged one, sent before it, never surfaced
    assert sub.recv(0.2) is None
    assert [r for r in caplog.records if "failed verification" in r.getMessage()]
    sub.close()
    pub.close()
