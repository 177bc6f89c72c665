"""The run viewer in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
which install.sh installs when run as root) driven through selenium, over real runs of tiny_grpo and
tiny_vlm_grpo (images), and a synthetic store of multi-turn episodes (transcripts).

Every page must render without a console error; the Rollouts filters, a sample's tokens, a
multi-turn transcript and an image must appear; the Metrics page must pick up a step appended to
a live run. ``HETRL_VIEWER_SCREENSHOTS=docs/img`` writes each page's screenshot there (the README's).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from real_rig import ROOT
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from hetrl.monitor.rollout_store import RolloutReader

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 90  # a page's data on a busy 2-core machine (a step's first view imports torch for the advantages)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("the viewer's browser tests need Debian's chromium and chromium-driver (./install.sh as root)")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


@contextmanager
def serving(browser: webdriver.Chrome, run: Path) -> Iterator[str]:
    """``python -m hetrl.view RUN --port 0`` for the block; its URL. The browser leaves the viewer's
    pages before the server stops (a page's next poll would log a refused connection) and its console
    log is drained, so each test sees its own errors only."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetrl.view", str(run), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the server prints it or exits (closing the pipe); pytest-timeout bounds both
        url = re.search(r"http://\S+/", line)
        assert url, f"no URL from the viewer: {line!r}"
        browser.get_log("browser")
        yield url.group(0)
    finally:
        browser.get("about:blank")
        browser.get_log("browser")
        proc.terminate()
        proc.wait(timeout=30)


def _wait(browser: webdriver.Chrome, css: str, count: int = 1) -> list:
    WebDriverWait(browser, WAIT_S).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, css)) >= count)
    return browser.find_elements(By.CSS_SELECTOR, css)


def _click(browser: webdriver.Chrome, css: str) -> str:
    """Click the first element matching ``css`` once it stays put; its ``data-sample``."""

    def attempt(b: webdriver.Chrome) -> str | None:
        element = b.find_elements(By.CSS_SELECTOR, css)
        if not element:
            return None
        sample_id = element[0].get_attribute("data-sample")
        element[0].click()
        return sample_id

    return WebDriverWait(browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)).until(attempt)


def _no_errors(browser: webdriver.Chrome, page: str) -> None:
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, f"{page}: console errors {errors}"
    banner = browser.find_element(By.ID, "missing")
    assert not banner.is_displayed(), f"{page}: {banner.text}"


def _screenshot(browser: webdriver.Chrome, name: str, scroll_to: str | None = None) -> None:
    where = os.environ.get("HETRL_VIEWER_SCREENSHOTS")
    if where:
        if scroll_to:
            browser.execute_script(f"document.getElementById('{scroll_to}').scrollIntoView()")
        browser.save_screenshot(str(Path(where) / f"viewer_{name}.png"))


def test_every_page_renders_without_console_errors(browser, grpo_run):
    pages = {
        "": "#config",  # Overview: the resolved recipe is drawn last
        "metrics": ".chart[data-metric='reward/mean']",
        "rollouts": ".member",
        "timeline": "#gantt svg rect.span",
    }
    with serving(browser, grpo_run) as url:
        for page, ready in pages.items():
            browser.get(url + page)
            try:
                _wait(browser, ready)
            except TimeoutException:
                pytest.fail(f"{page or 'overview'}: no {ready} after {WAIT_S} s; console: {browser.get_log('browser')}")
            _no_errors(browser, page or "overview")
            _screenshot(browser, page or "overview")
        browser.get(url)
        _wait(browser, "#config")
        text = browser.find_element(By.ID, "main").text
        assert "eval_after" in text and "orchestrator_0" in text and "Role health" in text


def test_rollout_filters_and_a_samples_tokens(browser, grpo_run):
    rows = RolloutReader(grpo_run).rows(2)
    with serving(browser, grpo_run) as url:
        browser.get(url + "rollouts")
        _wait(browser, ".steps div[data-step='2']")[0].click()
        WebDriverWait(browser, WAIT_S).until(
            lambda b: (
                len(b.find_elements(By.CSS_SELECTOR, ".member")) == len(rows)
                and b.find_element(By.ID, "counts").text.startswith("step 2:")
            )
        )
        browser.find_element(By.NAME, "worst").send_keys("3")
        browser.find_element(By.CSS_SELECTOR, "#filters button").click()
        worst = sorted(rows, key=lambda r: r.reward)[:3]
        WebDriverWait(browser, WAIT_S).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".member")) == 3)
        shown = {m.get_attribute("data-sample") for m in browser.find_elements(By.CSS_SELECTOR, ".member")}
        assert shown == {r.sample_id for r in worst}

        browser.find_element(By.NAME, "worst").clear()
        rarest = min({r.finish_reason for r in rows}, key=lambda f: sum(r.finish_reason == f for r in rows))
        Select(browser.find_element(By.NAME, "finish")).select_by_value(rarest)
        browser.find_element(By.CSS_SELECTOR, "#filters button").click()
        finished = [r for r in rows if r.finish_reason == rarest]
        WebDriverWait(browser, WAIT_S).until(
            lambda b: len(b.find_elements(By.CSS_SELECTOR, ".member")) == len(finished)
        )

        Select(browser.find_element(By.NAME, "finish")).select_by_value("")
        browser.find_element(By.CSS_SELECTOR, "#filters button").click()
        _wait(browser, ".member", len(rows))
        sample_id = _click(browser, ".member")  # the list may be drawn again under us: retried until it holds
        tokens = _wait(browser, "#turns .tok")
        (record,) = RolloutReader(grpo_run).load([r for r in rows if r.sample_id == sample_id])
        assert len(tokens) == len(record.sample.completion_ids)
        assert "".join(t.text for t in tokens).replace("\n", "") == record.sample.completion_text.replace("\n", "")
        _screenshot(browser, "sample", scroll_to="sample")
        gap_style = tokens[0].get_attribute("style")
        Select(browser.find_element(By.ID, "colour")).select_by_value("entropy")
        WebDriverWait(browser, WAIT_S).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, "#turns .tok")[0].get_attribute("style") != gap_style
        )
        _no_errors(browser, "rollouts")


def _multi_turn(run: Path) -> tuple[int, str]:
    for row in RolloutReader(run).rows():
        (record,) = RolloutReader(run).load([row])
        mask = record.sample.loss_mask
        if 0 in mask and 1 in mask[mask.index(0) :]:  # a policy turn after an observation
            return row.step, row.sample_id
    raise AssertionError(f"no multi-turn episode with an observation in {run}")


def _open_sample(browser: webdriver.Chrome, url: str, step: int, sample_id: str) -> None:
    browser.get(url + "rollouts")
    _wait(browser, f".steps div[data-step='{step}']")[0].click()
    WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.ID, "counts").text.startswith(f"step {step}:"))
    _click(browser, f".member[data-sample='{sample_id}']")


def test_a_multi_turn_episode_shows_turn_by_turn(browser, synthetic_run):
    # The synthetic store (monitor_synth, written through the real Monitor) holds episodes whose loss
    # mask alternates between policy turns and observations. tiny_tool_grpo's policy never calls a
    # tool within a test's few steps (random init; a 24-step warm start on tool-call demonstrations
    # did not teach it the call format either), so its runs have no transcript to show.
    step, sample_id = _multi_turn(synthetic_run)
    with serving(browser, synthetic_run) as url:
        _open_sample(browser, url, step, sample_id)
        _wait(browser, "#turns .turn.environment")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#turns .turn.policy")) >= 2
        assert "loss mask 0" in browser.find_element(By.CSS_SELECTOR, "#turns .turn.environment .who").text
        _no_errors(browser, "rollouts (multi-turn)")
        _screenshot(browser, "transcript", scroll_to="sample")


def test_an_episode_image_appears(browser, vlm_run):
    row = RolloutReader(vlm_run).rows()[0]
    with serving(browser, vlm_run) as url:
        _open_sample(browser, url, row.step, row.sample_id)
        image = _wait(browser, ".images img")[0]
        WebDriverWait(browser, WAIT_S).until(lambda b: b.execute_script("return arguments[0].naturalWidth", image) > 0)
        _no_errors(browser, "rollouts (vlm)")
        _screenshot(browser, "image", scroll_to="sample")


def test_the_metrics_page_follows_a_live_run(browser, grpo_run, tmp_path):
    run = tmp_path / "live"
    shutil.copytree(grpo_run, run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    with serving(browser, run) as url:
        browser.get(url + "metrics")
        WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.ID, "num-steps").text == str(len(lines)))
        last = json.loads(lines[-1])
        with (run / "metrics.jsonl").open("a") as fh:  # what the run's JSONL sink does at its next step
            fh.write(json.dumps({**last, "step": last["step"] + 1, "reward/mean": 0.5}) + "\n")
        WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.ID, "num-steps").text == str(len(lines) + 1))
        _no_errors(browser, "metrics")
