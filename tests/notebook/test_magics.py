"""``%hp`` in a real kernel: misuse explained, and a function defined in a cell launched on
2 ranks, tuned and stopped through the magics."""

from __future__ import annotations

import pytest

MISUSE = [
    ("", "a subcommand is needed"),
    ("frobnicate", "unknown subcommand 'frobnicate'"),
    ("get", "no current job"),
    ("launch", "the following arguments are required: target"),
    ("launch nosuch_thing", "neither a file nor a function"),
    ("launch train_fn --nproc two", "invalid int value"),
    ("launch train_fn --set lr", "expected name=value"),
    ("policy explode", "invalid choice"),
    ("resize two", "invalid int value"),
]


def test_misuse_raises_usage_errors_that_say_what_is_wrong(kernel):
    kernel.run("%load_ext hpinteract")
    kernel.run("def train_fn(run):\n    pass")
    for line, expected in MISUSE:
        out = kernel.run(f"""
            from IPython.core.error import UsageError
            try:
                get_ipython().run_line_magic("hp", {line!r})
            except UsageError as e:
                print("UsageError:", e)
            else:
                print("no error")
        """)
        assert out.startswith("UsageError:") and expected in out, (line, out)


CELL = '''
def train(run):
    """A training function defined in a notebook cell (pickled by value)."""
    import json, os, time
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    model = DDP(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run.watch(model, opt)
    seen = []
    for _ in run.epochs(1000):
        for xb, yb in run.dataloader(data):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            seen.append([run.step_index, opt.param_groups[0]["lr"]])
            time.sleep(0.005)
            run.step(loss=loss)
    with open(os.path.join(run.run_dir.path, f"seen_{run.rank}.json"), "w") as f:
        json.dump(seen, f)
'''


@pytest.mark.timeout(240)
def test_a_cell_function_launches_on_two_ranks_and_obeys_the_magics(kernel):
    kernel.run("%load_ext hpinteract")
    kernel.run(CELL)
    kernel.run("""
        import asyncio, json, os
        job = %hp launch train --nproc 2 --set lr=0.05 batch_size=32
        for _ in range(600):
            if (job.status().get("latest") or {}).get("step", -1) >= 5:
                break
            await asyncio.sleep(0.1)
        before = %hp get
        assert before["lr"] == 0.05 and before["batch_size"] == 32, before
        ack = %hp set lr=0.02 --reason "from a magic"
        after = %hp get
        assert after["lr"] == 0.02
        name = %hp policy add warmup steps=5
        listed = %hp policy list
        assert name in listed.name.tolist(), listed
        jobs = %hp jobs
        assert job.id in jobs.id.tolist()
        status = %hp status
        assert status["world_size"] == 2
        saved = %hp checkpoint
        assert os.path.isfile(saved.path) and saved.applied_at_step >= ack.applied_at_step
        %hp stop
        assert job.wait(90).value == "finished", job.logs()
        ev = job.events()
        mine = ev[(ev.kind == "change") & (ev.source == "magic")]
        row = mine.iloc[0]
        assert row["reason"] == "from a magic", mine.to_dict("records")
        assert row["applied_at_step"] == ack.applied_at_step, (ack, mine.to_dict("records"))
        seen = [json.load(open(job.run_dir.path / f"seen_{r}.json")) for r in (0, 1)]
        assert seen[0] == seen[1]  # both ranks used the same lr at every step
        at = dict((s, lr) for s, lr in seen[0])
        assert at[ack.applied_at_step - 1] != 0.02 and at[ack.applied_at_step] == 0.02
        assert job.spec["script"].endswith("train") and (job.run_dir.path /
            "function.pkl").stat().st_mode & 0o777 == 0o600
    """, timeout=200)


@pytest.mark.timeout(240)
def test_a_cell_function_job_is_resized_by_the_magic(kernel):
    kernel.run("%load_ext hpinteract")
    kernel.run(CELL)
    kernel.run("""
        import asyncio
        job = %hp launch train --nproc 2 --set batch_size=32
        for _ in range(600):
            if (job.status().get("latest") or {}).get("step", -1) >= 3:
                break
            await asyncio.sleep(0.1)
        ack = %hp resize 1
        status = %hp status
        assert status["world_size"] == 1 and job.hparams["workers"] == 1, status
        assert job.spec["nproc"] == 1
        %hp stop
        assert job.wait(90).value == "finished", job.logs()
        ev = job.events()
        done = ev[(ev.kind == "resize") & (ev.status == "done")]
        assert done["to"].tolist() == [1] and done["source"].tolist() == ["magic"], done
        assert int(done["step"].iloc[0]) == ack.applied_at_step
    """, timeout=200)
