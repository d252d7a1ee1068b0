"""Reading a job's changes back from its events: what a replay applies and what a
resumed job makes again after its checkpoint."""

from __future__ import annotations

from hpinteract.protocol.changes import recorded_changes, to_redo


def change(seq, step, values, id_, source="api"):
    return {"seq": seq, "kind": "change", "status": "applied", "applied_at_step": step,
            "values": values, "id": id_, "source": source}


EVENTS = [
    change(1, 5, {"lr": 0.1}, "a"),
    change(2, 9, {"lr": 0.2, "dropout": 0.3}, "b"),
    {"seq": 3, "kind": "rollback", "id": "c", "step": 12},
    change(4, 12, {"lr": 0.05}, "c", "policy:divergence_guard"),
    {"seq": 5, "kind": "resume", "step": 8},  # went back to step 8: "b" was undone
    change(6, 10, {"lr": 0.3}, "d"),
    {"seq": 7, "kind": "state", "state": "stopping", "step": 20},
]


def test_changes_undone_by_a_resume_or_taken_back_by_a_rollback_are_left_out():
    got = recorded_changes(EVENTS)
    assert [c["id"] for c in got["changes"]] == ["a", "d"]
    assert got["stop_at"] == 20 and got["rollbacks_skipped"] == []  # "c" was undone too
    assert recorded_changes(EVENTS[:4])["rollbacks_skipped"] == [12]


def test_a_resume_redoes_what_came_after_its_checkpoint_but_not_what_it_holds():
    events = [*EVENTS[:3], change(8, 15, {"lr": 0.4, "mode": "b"}, "e")]
    redo = to_redo(events, step=9, saved_ids={"b"}, overridden=("lr",))
    assert redo == [{"step": 15, "values": {"mode": "b"}, "source": "api", "id": "e"}]
    assert to_redo(events, step=9, saved_ids=set())[0]["id"] == "b"  # at the step itself
