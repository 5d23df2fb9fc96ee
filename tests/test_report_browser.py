"""The HTML report in a real headless Chromium: it loads without console errors or network requests,
and every plot is drawn. A screenshot is kept as a test artifact (SFTPROF_TEST_ARTIFACTS, else tmp_path).

The browser is driven through the Chrome DevTools Protocol over `--remote-debugging-pipe`:
NUL-terminated JSON messages on file descriptors 3 (to the browser) and 4 (from it). Unlike
`--dump-dom` with `--enable-logging` (whose CONSOLE lines carry no level, and which misses failed
loads), it reports exceptions, console calls with their type, failed resource loads and every
request; and it needs no websocket client, chromedriver or selenium.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from sftprof.cli import main as sftprof_main

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")

FIXTURES = Path(__file__).parent / "fixtures"
NSYS_FIXTURE = FIXTURES / "h200_tiny_llama_bf16.sqlite"
METRICS = FIXTURES / "h200_tiny_llama_bf16.metrics.jsonl"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]
WINDOW = {"width": 1280, "height": 4000}
TIMEOUT_S = 30
LOCAL_SCHEMES = ("file:", "data:", "about:")
ERROR_CONSOLE_TYPES = {"error", "assert"}

# Runs in the page: per plot, its drawn size and how many of its shapes have a non-empty box.
PLOT_PROBE = """JSON.stringify([...document.querySelectorAll('div.plot svg')].map(svg => {
  const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll('path, rect, line, polygon, use')].filter(shape => {
    const b = shape.getBBox(); return b.width > 0 || b.height > 0; }).length;
  return {width: box.width, height: box.height, drawn: drawn};
}))"""


class DevToolsPipe:
    """A headless Chromium and its DevTools Protocol connection; events are kept until read."""

    def __init__(self, profile_dir: Path):
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def wire_pipes():  # in the child: the protocol wants exactly fds 3 and 4
            inbound, outbound = os.dup(to_browser_read), os.dup(from_browser_write)
            os.dup2(inbound, 3)
            os.dup2(outbound, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}"],
            preexec_fn=wire_pipes,
            close_fds=False,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer, self._messages, self._next_id = b"", [], 0

    def _receive(self, deadline: float) -> None:
        ready, _, _ = select.select([self._from_browser], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        chunk = os.read(self._from_browser, 1 << 20)
        if not chunk:
            raise RuntimeError(f"Chromium closed the DevTools pipe (exit code {self.process.poll()})")
        *complete, self._buffer = (self._buffer + chunk).split(b"\0")
        self._messages += [json.loads(message) for message in complete]

    def _take(self, matches, timeout: float = TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for index, message in enumerate(self._messages):
                if matches(message):
                    return self._messages.pop(index)
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            self._receive(deadline)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        answer = self._take(lambda m, wanted=self._next_id: m.get("id") == wanted)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def wait_for(self, event: str, session: str) -> dict:
        return self._take(lambda m: m.get("method") == event and m.get("sessionId") == session)

    def events(self, session: str) -> list[dict]:
        """Every event of this page so far (after draining what is already in the pipe)."""
        self._receive(time.monotonic())
        mine = [m for m in self._messages if m.get("sessionId") == session and "method" in m]
        self._messages = [m for m in self._messages if m not in mine]
        return mine

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass  # it may close the pipe before it answers
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # the browser and its helpers: the process group it leads
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)


class PageVisit:
    """What loading one page produced: protocol events, the plot probe and a screenshot."""

    def __init__(self, events: list[dict], plots: list[dict], screenshot: bytes):
        self.events, self.plots, self.screenshot = events, plots, screenshot

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, failed loads and requests that leave the machine."""
        found = []
        for event in self.events:
            method, params = event["method"], event["params"]
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"exception: {details.get('exception', {}).get('description', details['text'])}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in ERROR_CONSOLE_TYPES:
                found.append(f"console.{params['type']}: {[arg.get('value') for arg in params['args']]}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
            elif method == "Network.requestWillBeSent" and not params["request"]["url"].startswith(LOCAL_SCHEMES):
                found.append(f"network request: {params['request']['url']}")
        return found


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    devtools = DevToolsPipe(tmp_path_factory.mktemp("chromium-profile"))
    yield devtools
    devtools.close()


def visit(browser: DevToolsPipe, page: Path) -> PageVisit:
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        for domain in ("Runtime", "Log", "Network", "Page"):
            browser.call(f"{domain}.enable", session=session)
        browser.call("Emulation.setDeviceMetricsOverride", {**WINDOW, "deviceScaleFactor": 1, "mobile": False}, session)
        browser.call("Page.navigate", {"url": page.resolve().as_uri()}, session)
        browser.wait_for("Page.loadEventFired", session)
        probe = browser.call("Runtime.evaluate", {"expression": PLOT_PROBE, "returnByValue": True}, session)
        shot = browser.call("Page.captureScreenshot", {"format": "png"}, session)
        return PageVisit(browser.events(session), json.loads(probe["result"]["value"]), base64.b64decode(shot["data"]))
    finally:
        browser.call("Target.closeTarget", {"targetId": target})


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert sftprof_main(["analyze", str(NSYS_FIXTURE), "-o", str(out), "--metrics", str(METRICS)]) == 0
    return out / "report.html"


@pytest.fixture
def artifacts(tmp_path) -> Path:
    folder = Path(os.environ.get("SFTPROF_TEST_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_report_loads_clean_and_draws_every_plot(browser, report, artifacts):
    result = visit(browser, report)
    assert result.problems() == []
    expected_plots = report.read_text().count('<div class="plot">')
    assert expected_plots >= 5  # kernels, memory ops, step phases, timeline, OS calls, training curve
    assert len(result.plots) == expected_plots
    for plot in result.plots:
        assert plot["width"] > 100 and plot["height"] > 50 and plot["drawn"] > 0, plot

    screenshot = artifacts / "report.png"
    screenshot.write_bytes(result.screenshot)
    pixels = matplotlib.image.imread(screenshot)[..., :3]
    assert pixels.shape[:2] == (WINDOW["height"], WINDOW["width"])
    not_white = (pixels < 0.95).any(axis=2).mean()
    rgb = (pixels * 255).astype(np.uint32)
    colours = len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]))
    assert 0.02 < not_white < 0.9 and colours > 50 and pixels.std() > 0.05


def test_comparison_page_loads_clean(browser, report, tmp_path, artifacts):
    analysis = report.parent / "analysis"
    assert (
        sftprof_main(["compare", str(analysis), str(FIXTURES / "cpu_tiny_llama.pt.trace.json.gz"), "-o", str(tmp_path)])
        == 0
    )
    result = visit(browser, tmp_path / "compare.html")
    (artifacts / "compare.png").write_bytes(result.screenshot)
    assert result.problems() == []


def test_the_checks_catch_a_broken_page(browser, tmp_path):
    """Negative control: each kind of problem the checks look for is reported."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<html><body><div class="plot"><svg width="200" height="100"><g></g></svg></div>'
        '<script>console.error("plot data missing"); undefined_function();</script>'
        '<img src="http://example.invalid/logo.png"></body></html>'
    )
    result = visit(browser, page)
    problems = "\n".join(result.problems())
    assert "console.error: ['plot data missing']" in problems
    assert "undefined_function is not defined" in problems
    assert "network request: http://example.invalid/logo.png" in problems
    assert result.plots == [{"width": 200, "height": 100, "drawn": 0}]
