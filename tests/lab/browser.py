"""Headless Chromium for the web view's lab tests, driven through Debian's chromedriver over the
W3C WebDriver protocol (plain HTTP and JSON: no driver library, nothing fetched at run time).

    with Browser.start(tmp_path) as browser:
        browser.open(url)
        browser.wait_for("document.body.dataset.ready === '1'")
        browser.click("g.link[data-id='l1-s1']")
        browser.screenshot(path)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

from fabriclab.system.procs import end_group

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
# Debian's package installs the browser binary here (/usr/bin/chromium is a wrapper script);
# Ubuntu's transitional package puts a snap wrapper on PATH.
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def find(candidates, name):
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def missing():
    """Why a browser cannot be driven here (None: it can)."""
    if not find(CHROMIUM, "chromium"):
        return "no Chromium (the chromium package; `fabriclab provision` installs it)"
    if not find(CHROMEDRIVER, "chromedriver"):
        return "no chromedriver (the chromium-driver package; `fabriclab provision` installs it)"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriverError(RuntimeError):
    pass


class Browser:
    def __init__(self, driver, port, session_id):
        self.driver, self.base, self.session = driver, f"http://127.0.0.1:{port}", session_id

    @classmethod
    def start(cls, profile_dir, width=1400, height=900):
        port = _free_port()
        # its own process group: quit() ends the driver and every browser process it started
        driver = subprocess.Popen([find(CHROMEDRIVER, "chromedriver"), f"--port={port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2).read()
                    break
                except (urllib.error.URLError, ConnectionError):
                    if time.monotonic() > deadline or driver.poll() is not None:
                        raise WebDriverError("chromedriver did not start") from None
                    time.sleep(0.1)
            args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--disable-background-networking",
                    f"--user-data-dir={profile_dir}", f"--window-size={width},{height}"]
            caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
                "binary": find(CHROMIUM, "chromium"), "args": args}}}}
            answer = _call("POST", f"http://127.0.0.1:{port}/session", caps, timeout=60)
            return cls(driver, port, answer["sessionId"])
        except BaseException:
            end_group(driver)
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.quit()

    def _do(self, method, path, body=None, timeout=30):
        return _call(method, f"{self.base}/session/{self.session}{path}", body, timeout)

    def open(self, url):
        self._do("POST", "/url", {"url": url})

    def run(self, script, *args):
        """The value of a JavaScript function body (`return ...`) run in the page."""
        return self._do("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, expression, *args, timeout=20.0, what=None):
        """Wait until a JavaScript expression (reading `arguments`) is truthy in the page; returns
        its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(f"return ({expression});", *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed {what or expression} within {timeout:g} s")
            time.sleep(0.2)

    def find(self, css):
        return self._do("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css):
        """A real click (the driver moves the pointer to the element's centre and presses)."""
        self._do("POST", f"/element/{self.find(css)}/click", {})

    def screenshot(self, path):
        data = base64.b64decode(self._do("GET", "/screenshot"))
        with open(path, "wb") as fh:
            fh.write(data)
        return path

    def quit(self):
        try:
            self._do("DELETE", "", timeout=10)
        except (WebDriverError, OSError):
            pass
        finally:
            end_group(self.driver)


def _call(method, url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())["value"]
    except urllib.error.HTTPError as exc:
        try:
            value = json.loads(exc.read())["value"]
            message = f"{value.get('error')}: {str(value.get('message', ''))[:300]}"
        except (ValueError, KeyError, AttributeError):
            message = f"HTTP {exc.code}"
        raise WebDriverError(f"{method} {url.split('/session')[-1] or '/session'}: {message}") from None
