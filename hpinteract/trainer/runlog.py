"""Append-only JSON-lines logs with a sequence index, for catch-up without rereading.

Runs in: rank 0's coordinator (writes and serves history pages). Each record has a
``seq``; the index keeps each record's byte offset, so a page "after seq N" seeks straight
to it. Writes are buffered and flushed once per coordinator loop: never an fsync per step.
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class RunLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seqs = array("q")
        self._offsets = array("q")
        self._index_existing()
        self._out: IO[str] = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - held open
        self._end = path.stat().st_size
        if self._end and not _ends_with_newline(path):
            self._out.write("\n")  # end a line torn by a crash, or the next record joins it
            self._end += 1
        self._dirty = False

    def _index_existing(self) -> None:
        if not self.path.exists():
            return
        offset = 0
        with open(self.path, "rb") as f:
            for line in f:
                try:
                    seq = int(json.loads(line)["seq"])
                except (ValueError, KeyError, TypeError):
                    seq = None  # a torn last line from a crash: skip it
                if seq is not None:
                    self._seqs.append(seq)
                    self._offsets.append(offset)
                offset += len(line)

    @property
    def last_seq(self) -> int:
        return self._seqs[-1] if self._seqs else 0

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        self._seqs.append(int(record["seq"]))
        self._offsets.append(self._end)
        self._out.write(line)
        self._end += len(line.encode())
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self._out.flush()
            self._dirty = False

    def read_since(self, since: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` records with seq > since, in order."""
        self.flush()
        i = bisect.bisect_right(self._seqs, since)
        if i >= len(self._seqs):
            return []
        out: list[dict[str, Any]] = []
        with open(self.path, "rb") as f:
            f.seek(self._offsets[i])
            for line in f:
                if len(out) >= limit:
                    break
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break  # a line being written right now
        return out

    def close(self) -> None:
        self.flush()
        self._out.close()


def merge_pages(
    logs: list[RunLog], since: int, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """One page of several logs merged by seq; ``more`` says whether a next page exists."""
    records: list[dict[str, Any]] = []
    for lg in logs:
        records.extend(lg.read_since(since, limit))
    records.sort(key=lambda r: int(r["seq"]))
    page = records[:limit]
    last = int(page[-1]["seq"]) if page else since
    return page, any(lg.last_seq > last for lg in logs)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def last_record(path: Path, want: Callable[[dict[str, Any]], bool] = lambda r: True
                ) -> dict[str, Any] | None:
    """The last complete record that ``want`` accepts, reading only the file's tail."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash, or cut by the seek
        if isinstance(rec, dict) and "seq" in rec and want(rec):
            return rec
    return None


def last_seq(path: Path) -> int:
    """The last complete record's seq, reading only the file's tail."""
    rec = last_record(path)
    try:
        return int(rec["seq"]) if rec is not None else 0
    except (TypeError, ValueError):
        return 0
