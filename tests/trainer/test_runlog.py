from hpinteract.trainer.runlog import RunLog, last_seq, merge_pages


def test_pages_after_a_seq_merge_both_logs_in_order(tmp_path):
    m, e = RunLog(tmp_path / "m.jsonl"), RunLog(tmp_path / "e.jsonl")
    for s in range(1, 101):
        (e if s % 10 == 0 else m).append({"seq": s})
    page, more = merge_pages([m, e], 0, 30)
    assert [r["seq"] for r in page] == list(range(1, 31)) and more
    page, more = merge_pages([m, e], 90, 30)
    assert [r["seq"] for r in page] == list(range(91, 101)) and not more
    m.close()
    e.close()
    assert last_seq(tmp_path / "m.jsonl") == 99


def test_reopening_indexes_existing_lines_and_skips_a_torn_one(tmp_path):
    p = tmp_path / "m.jsonl"
    lg = RunLog(p)
    for s in (1, 2, 3):
        lg.append({"seq": s})
    lg.close()
    with open(p, "a") as f:
        f.write('{"seq": 4, "lo')  # a crash mid-write
    again = RunLog(p)
    assert again.last_seq == 3
    assert [r["seq"] for r in again.read_since(1, 10)] == [2, 3]
