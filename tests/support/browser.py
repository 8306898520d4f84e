"""A real headless browser for the tests: Debian's chromium driven through its chromedriver with selenium (nothing
downloaded: the driver is the one on PATH, never Selenium Manager's). Missing, a test skips, or fails where
TINYGPT_REQUIRE_SLURM=1 says the machine must have everything (CI installs both: .ci/run)."""

from __future__ import annotations

import os
import shutil

import pytest

BINARY, DRIVER = "chromium", "chromedriver"


def missing() -> str | None:
    absent = [name for name in (BINARY, DRIVER) if shutil.which(name) is None]
    return f"{' and '.join(absent)} not on PATH (apt-get install chromium chromium-driver)" if absent else None


@pytest.fixture
def browser():
    """A headless Chromium (as root: --no-sandbox), closed after the test."""
    why = missing()
    if why is not None:
        (pytest.fail if os.environ.get("TINYGPT_REQUIRE_SLURM") == "1" else pytest.skip)(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(BINARY)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,1000",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
