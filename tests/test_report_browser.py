"""Every tiny run's ``report.html`` opened in a real browser: headless Chromium through Selenium.

The browser and its driver are Debian's (``apt-get install chromium chromium-driver``; ``.ci/run``
installs them), driven through ``/usr/bin/chromedriver`` without Selenium Manager, so nothing is
downloaded. Where they are missing the tests skip; CI sets ``SEQAPPS_REQUIRE_BROWSER=1``, which
makes that a failure. One browser session opens every report.
"""
import importlib.util
import io
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterator
from unittest import mock

import numpy as np
import pytest

from seqapps.pipeline import REGISTRY
from seqapps.report import run_folder
from tests.test_report import SHARED_ANCHORS

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

pytestmark = pytest.mark.large

#: Debian's package names, for the skip message and .ci/run
BROWSER_PACKAGES = "chromium chromium-driver"
#: the sections of each pipeline's own, by HTML id, after the shared ones (a tiny run: no backtest);
#: a pipeline not named here is checked for the shared sections alone
HRNN_ANCHORS = ["task-metric", "memory-bench"]
PIPELINE_ANCHORS: dict[str, list[str]] = {
    "copy_task": HRNN_ANCHORS,
    "hrnn_char_lm": HRNN_ANCHORS,
    "image_captioning": ["captions", "attention", "fact-accuracy"],
    "language_model": ["perplexity", "sentences"],
    "load_forecasting": ["forecast", "mae-by-lead"],
    "music_tagging": ["roc-curves", "taggram", "per-tag-auc"],
    "pixel_mnist": HRNN_ANCHORS,
    "speech_recognition": ["word-timings", "per-voice"],
    "text_generation": ["samples"],
    "translation": ["scores", "attention", "samples"],
    "weather_forecasting": ["forecast", "mae-by-lead"],
}
#: a page is blank below these: the grey levels' standard deviation and the share of pixels that are
#: not white (copy_task's tiny report, the plainest, measures 25 and 30% at 1200 x 2000; white: 0 and 0)
MIN_PIXEL_STD = 10.0
MIN_INKED_SHARE = 0.01


def _browser_or_skip() -> tuple[str, str]:
    """The paths of Chromium and its driver. CI (SEQAPPS_REQUIRE_BROWSER=1) installs them and must
    find them; elsewhere a machine without them skips, since they are optional there."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if importlib.util.find_spec("selenium") is None:  # the [test] extra
        driver = None
    if browser and driver:
        return browser, driver
    if os.environ.get("SEQAPPS_REQUIRE_BROWSER") == "1":
        pytest.fail(f"SEQAPPS_REQUIRE_BROWSER=1 but no browser: install {BROWSER_PACKAGES} (apt) and selenium")
    pytest.skip(f"no browser: install {BROWSER_PACKAGES} (apt) and selenium ([test] extra)")


@pytest.fixture(scope="module")
def browser() -> Iterator["Chrome"]:
    """One headless Chromium for the module, its console log kept (``goog:loggingPrefs``)."""
    binary, driver_path = _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,2000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The system driver: Selenium Manager, which may download one, must not run at all.
    with mock.patch.dict(os.environ, {"SE_OFFLINE": "true"}), \
            mock.patch.object(SeleniumManager, "binary_paths", side_effect=AssertionError("Selenium Manager ran")):
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _grey(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float)


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_report_opens_in_a_browser_with_its_sections_and_images_and_no_error(browser, tiny_exports, name):
    assert tiny_exports[name]["code"] == 0, tiny_exports[name]["err"]
    report = Path(tiny_exports[name]["run_folder"]) / run_folder.REPORT_FILE
    browser.get_log("browser")  # what earlier pages logged is not this one's
    browser.get(report.as_uri())  # returns once the page and its images have loaded
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    # Self-contained: the page fetched nothing (inline images are no resource entries).
    assert browser.execute_script("return performance.getEntriesByType('resource').map(r => r.name)") == []
    images = browser.execute_script(
        "return Array.from(document.images, i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert images and all(complete and width > 0 and height > 0 for _, complete, width, height in images), images
    sections = browser.execute_script("return Array.from(document.querySelectorAll('section[id]'), s => s.id)")
    expected = SHARED_ANCHORS + PIPELINE_ANCHORS.get(name, [])
    assert set(expected) <= set(sections), f"missing sections: {sorted(set(expected) - set(sections))}"
    assert browser.execute_script("return document.getElementById('headline-metrics').querySelectorAll('td').length")
    grey = _grey(browser.get_screenshot_as_png())
    assert grey.std() > MIN_PIXEL_STD and (grey < 250).mean() > MIN_INKED_SHARE, (grey.std(), (grey < 250).mean())


def test_a_blank_page_fails_the_screenshot_check(browser, tmp_path):
    """The threshold tells a blank page from a report: white and a single word both measure below it."""
    for body in ("", "<p>seqapps</p>"):
        page = tmp_path / "blank.html"
        page.write_text(f"<!DOCTYPE html><html><body>{body}</body></html>")
        browser.get(page.as_uri())
        grey = _grey(browser.get_screenshot_as_png())
        assert not (grey.std() > MIN_PIXEL_STD and (grey < 250).mean() > MIN_INKED_SHARE), body
