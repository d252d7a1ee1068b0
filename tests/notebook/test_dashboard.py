"""The dashboard in a real kernel against a real 2-rank job: plots that grow while the
kernel runs other cells, widgets bound to the job, errors shown and nothing applied, and
the whole history after a kernel restart."""

from __future__ import annotations

from helpers import TOY
from nb_kernel import Kernel

import hpinteract as hpi

WAIT = """
import asyncio

async def until(cond, timeout=60):
    for _ in range(int(timeout / 0.1)):
        if cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")
"""


def test_the_dashboard_follows_and_controls_a_job(kernel):
    kernel.run(WAIT)
    kernel.run(f"""
        import asyncio, time
        import hpinteract as hpi
        job = hpi.launch({str(TOY)!r}, nproc=2, args=["--epochs", "400"],
                         hparams={{"sleep": 0.01}})
        d = job.dashboard()
        d
    """)
    # Another cell runs while the plots fill: the kernel is free.
    kernel.run("""
        await until(lambda: d.point_counts().get("loss", 0) >= 20 and d.panel is not None)
        first = d.point_counts()["loss"]
        await until(lambda: d.point_counts()["loss"] > first + 20)
        assert d.live and set(d.plots.figures) >= {"loss", "accuracy", "learning rate"}
    """)
    # The lr slider: applied at a step on every rank, shown with that step.
    kernel.run("""
        row = d.panel.rows["lr"]
        assert type(row.control).__name__ == "FloatLogSlider"
        row.control.value = 0.01
        await until(lambda: "since step" in row.state.value)
        assert job.hparams["lr"] == 0.01, job.hparams
        step = int(row.state.value.split("since step ")[1].split(" ")[0])
        ev = job.events()
        applied = ev[(ev.kind == "change") & (ev.source == "widget")]
        assert applied.applied_at_step.tolist() == [step], (applied, step)
        # its marker says from what to what, when and by whom (on the loss plot too)
        for title in ("learning rate", "loss"):
            await until(lambda: any(s.startswith("<b>lr</b> 0.05 &rarr; 0.01<br>step ")
                                    and s.endswith(", by widget") for s in
                                    d.plots.figures[title].changes.data["label"]))
    """)
    # A value the job refuses: the error is shown next to the control, nothing applied.
    kernel.run("""
        row = d.panel.rows["dropout"]
        row.control.value = 0.9  # the slider's top: valid
        await until(lambda: "since step" in row.state.value)
        bs = d.panel.rows["batch_size"]
        assert all(b % 2 == 0 for b in bs.control.options), bs.control.options
        t = d.panel.rows["sleep"]
        assert type(t.control).__name__ == "Text"  # a float without bounds
        t.control.value = "abc"  # typed: not a number, which the job refuses
        t._submit()
        await until(lambda: t.error.value != "")
        assert "sleep must be float" in t.error.value, t.error.value
        assert job.hparams["sleep"] == 0.01 and t.control.value == "0.01"
    """)
    # A change from elsewhere (here the API) shows on its row, with its source.
    kernel.run("""
        ack = job.set(momentum=0.5)
        await until(lambda: "(api)" in d.panel.rows["momentum"].state.value)
        assert f"since step {ack.applied_at_step}" in d.panel.rows["momentum"].state.value
        d.panel.buttons["pause"].click()
        await until(lambda: job.state.value == "paused")
        d.panel.buttons["checkpoint"].click()
        await until(lambda: "checkpoint at step" in d.panel.acked.value or d.panel.errors.value)
        assert "checkpoint at step" in d.panel.acked.value, d.panel.errors.value
        assert len(job.checkpoints()) == 1
        d.panel.buttons["resume"].click()
        await until(lambda: job.state.value == "running")
        d.panel.buttons["stop"].click()
        await until(lambda: not d.live, timeout=90)
        assert job.state.value == "finished" and "finished" in d.panel.badge.value
        n = len(job.metrics())
        print(job.id, n)
    """)


def test_reopening_after_a_kernel_restart_shows_the_whole_history():
    # A job of its own, ended before the kernel starts (as after a restart of the kernel
    # that launched it): 3 epochs of 16 steps.
    ended = hpi.launch(TOY, nproc=2, args=["--n", "256", "--epochs", "3"])
    assert ended.wait(120) == hpi.JobState.FINISHED, ended.logs()[-3000:]
    k = Kernel()
    try:
        k.run(WAIT)
        out = k.run(f"""
            import hpinteract as hpi
            job = hpi.attach({ended.id!r})
            d = job.dashboard()
            n = len(job.metrics())
            # The history loads in the background, and then the dashboard sees that the
            # job has ended and stops following it.
            await until(lambda: d.records >= n and not d.live)
            print(d.records == n, d.point_counts()["loss"] == min(n, 2000), n,
                  job.state.value, d.live)
        """)
    finally:
        k.close()
    assert out.split() == ["True", "True", "48", "finished", "False"], out


def test_a_failed_job_shows_which_rank_failed_and_why(kernel):
    kernel.run(WAIT)
    out = kernel.run(f"""
        import hpinteract as hpi
        job = hpi.launch({str(TOY)!r}, nproc=2,
                         args=["--crash-rank", "1", "--crash-step", "15"])
        d = job.dashboard()
        await until(lambda: not d.live, timeout=120)
        print(job.state.value)
        print(d.panel.errors.value if d.panel else "no panel")
    """, timeout=150)
    assert out.startswith("failed"), out
    assert "rank 1 failed" in out and "boom on purpose at step 15" in out, out
