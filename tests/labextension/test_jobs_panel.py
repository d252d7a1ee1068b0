"""The JupyterLab side panel end to end: JupyterLab on loopback with the extension as
installed, a 2-rank job, and headless Chromium clicking through the panel like a person.
It sees the job and its loss updating, edits lr (a refused value shows the job's message;
a valid one its step), notices a job launched after it opened, inserts the attach code
into a notebook; the test reads the new lr back through ``hpi.attach``. Screenshots go to
build/test-output/labextension/. (Chromium: see tests/lab.py.)
"""

from __future__ import annotations

import json
import math

import pytest
from helpers import TOY, wait_for_step
from lab import ARGS, CHROMIUM, OUTPUT, browser_test, jupyterlab, require_chromium

import hpinteract as hpi

OUTPUT = OUTPUT / "labextension"
pytestmark = browser_test

EMPTY_NOTEBOOK = {"cells": [{"cell_type": "code", "metadata": {}, "source": "",
                             "outputs": [], "execution_count": None}],
                  "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                              "language": "python"}},
                  "nbformat": 4, "nbformat_minor": 5}


def points(page) -> int:
    return int(page.locator(".hpi-line-loss").first.get_attribute("data-points") or 0)


@pytest.mark.timeout(300)
def test_the_panel_watches_and_tunes_a_running_job(tmp_path, hpi_home):
    from playwright.sync_api import expect, sync_playwright

    require_chromium()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    job = hpi.launch(TOY, nproc=2, hparams={"sleep": 0.01}, args=["--n", "2048"])
    later = None
    work = tmp_path / "lab"
    work.mkdir()
    (work / "scratch.ipynb").write_text(json.dumps(EMPTY_NOTEBOOK))
    try:
        wait_for_step(job, 3)
        with jupyterlab(work, hpi_home, tmp_path / "lab.log") as (base, token), \
                sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            try:
                page.goto(f"{base}/lab/tree/scratch.ipynb?token={token}")
                page.locator(".jp-Notebook").first.wait_for(timeout=90_000)
                # The status bar counts the running job; the side panel's tab opens it.
                expect(page.locator(".hpi-status")).to_have_text("1 training job",
                                                                 timeout=30_000)
                page.locator('.jp-SideBar [data-id="hpinteract-jobs"]').click()
                item = page.locator(f'.hpi-job[data-job-id="{job.id}"]')
                expect(item).to_be_visible(timeout=30_000)
                expect(item.locator(".hpi-badge")).to_have_text("running")
                # While the job streams, a poll updates the row in place: the element under
                # the pointer is the same one (a replaced element loses the click).
                row_js = f'document.querySelector(\'.hpi-job[data-job-id="{job.id}"]\')'
                page.evaluate(f"() => {{ {row_js}.hpiMark = 1; }}")
                info = item.locator(".hpi-job-info")
                expect(info).not_to_have_text(info.inner_text(), timeout=30_000)
                assert page.evaluate(f"() => {row_js}.hpiMark") == 1
                item.click()  # not forced: Playwright waits for a stable element
                chart = page.locator(".hpi-line-loss").first
                expect(chart).to_be_attached(timeout=30_000)
                page.wait_for_function(
                    "() => +document.querySelector('.hpi-line-loss')"
                    "?.getAttribute('data-points') > 0", timeout=30_000)
                n0 = points(page)
                page.wait_for_function(
                    f"() => +document.querySelector('.hpi-line-loss')"
                    f".getAttribute('data-points') > {n0 + 10}", timeout=30_000)
                expect(page.locator(".hpi-detail-head")).to_contain_text("loss")

                # The script's hyper-parameters first; hpinteract's knobs folded apart.
                system = page.locator('tr[data-hparam="checkpoint_every"]')
                expect(system).to_be_hidden()
                expect(page.locator('tr[data-hparam="sleep"]')).to_be_visible()
                page.locator(".hpi-hparams .hpi-group th").click()
                expect(system).to_be_visible()
                page.locator(".hpi-hparams .hpi-group th").click()
                expect(system).to_be_hidden()
                lr = page.locator('tr[data-hparam="lr"] input[type=text]')
                lr.fill("-1")
                lr.press("Enter")
                expect(page.locator('tr[data-hparam="lr"] .hpi-error')).to_contain_text(
                    "below the minimum", timeout=30_000)
                assert job.hparams["lr"] == 0.05
                lr.fill("0.02")
                lr.press("Enter")
                expect(page.locator('tr[data-hparam="lr"] .hpi-since')).to_contain_text(
                    "applied at step", timeout=30_000)
                expect(page.locator('tr[data-hparam="lr"] .hpi-error')).to_have_text("")
                assert hpi.attach(job.id).hparams["lr"] == 0.02
                step = int(page.locator('tr[data-hparam="lr"] .hpi-since')
                           .inner_text().split()[-1])
                ev = job.events()
                mine = ev[(ev.kind == "change") & (ev.source == "lab")]
                assert mine.status.tolist()[:2] == ["rejected", "applied"], mine
                assert "below the minimum" in mine.error.iloc[0]  # refused, logged, not applied
                assert mine.applied_at_step.iloc[1] == step
                # lr also has a slider on a log scale: dragged left, it goes down by the
                # factor the text box shows, and is applied on release.
                slider = page.locator('tr[data-hparam="lr"] input.hpi-log')
                lo, hi, at = slider.evaluate("(el) => [+el.min, +el.max, +el.value]")
                assert at == pytest.approx(math.log10(0.02))  # follows the value in force
                box = slider.bounding_box()
                assert box is not None
                x, y = box["x"] + box["width"] * (at - lo) / (hi - lo), box["y"] + box["height"] / 2
                page.mouse.move(x, y)  # on the thumb
                page.mouse.down()
                page.mouse.move(x - box["width"] / (hi - lo), y, steps=6)  # a decade to the left
                page.mouse.up()
                shown = float(lr.input_value())
                assert 0.001 < shown < 0.006, shown  # about 0.002
                expect(page.locator('tr[data-hparam="lr"] .hpi-since')).not_to_have_text(
                    f"applied at step {step}", timeout=30_000)
                assert hpi.attach(job.id).hparams["lr"] == pytest.approx(shown, rel=1e-9)
                # The change shows as a marker on the chart, and in the events list.
                expect(page.locator(".hpi-marker").first).to_be_attached(timeout=30_000)
                expect(page.locator(".hpi-events")).to_contain_text("set lr=0.02")

                # A job launched now appears without a reload.
                later = hpi.launch(TOY, nproc=1, hparams={"sleep": 0.01}, args=["--n", "256"])
                expect(page.locator(f'.hpi-job[data-job-id="{later.id}"]')).to_be_visible(
                    timeout=30_000)
                expect(page.locator(".hpi-status")).to_have_text("2 training jobs",
                                                                 timeout=30_000)

                page.locator(".hpi-button.hpi-pause").click()
                expect(page.locator(".hpi-detail")).to_have_attribute("data-state", "paused",
                                                                      timeout=30_000)
                page.locator(".hpi-button.hpi-checkpoint").click()
                expect(page.locator(".hpi-message")).to_contain_text("checkpoint at step",
                                                                     timeout=30_000)
                assert len(job.checkpoints()) == 1
                page.locator(".hpi-button.hpi-resume").click()
                expect(page.locator(".hpi-detail")).to_have_attribute("data-state", "running",
                                                                      timeout=30_000)

                page.locator(".jp-Notebook .jp-Cell").first.click()
                page.locator(".hpi-button.hpi-insert").click()
                expect(page.locator(".jp-Notebook")).to_contain_text(
                    f'job = hpi.attach("{job.id}")', timeout=10_000)
                page.screenshot(path=str(OUTPUT / "panel.png"))
                page.locator(".hpi-button.hpi-stop").click()
                expect(item.locator(".hpi-badge")).to_have_text("finished", timeout=60_000)
            finally:
                page.screenshot(path=str(OUTPUT / "last.png"))
                browser.close()
        assert not errors, errors
    finally:
        for j in (job, later):
            if j is not None and not j.state.terminal:
                j.stop()
                j.wait(60)
