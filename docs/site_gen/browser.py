"""A headless Chromium driven over the DevTools protocol (websockets), enough to open the built site, read its
rendered DOM and save screenshots: `find_chromium()`, `serve(site_dir)` (loopback HTTP) and `Browser`.

Chromium is Debian's chromium-headless-shell, unpacked into the venv by docs/site_gen/get_chromium.sh; $CHROMIUM,
or a `chromium-headless-shell` / `chromium` on PATH, is used instead where set or present."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNPACKED = ROOT / ".venv" / "debian" / "chromium"


def find_chromium() -> tuple[list[str], dict[str, str]] | str:
    """(command, environment) of a usable Chromium, or the reason there is none (for a test's skip)."""
    env = dict(os.environ)
    candidates = [os.environ.get("CHROMIUM"), str(UNPACKED / "usr/lib/chromium/chromium-headless-shell"),
                  shutil.which("chromium-headless-shell"), shutil.which("chromium")]
    for binary in filter(None, candidates):
        if not os.access(binary, os.X_OK):
            continue
        if binary.startswith(str(UNPACKED)):
            libs = UNPACKED / "usr/lib/x86_64-linux-gnu"
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), str(libs / "pulseaudio"),
                                                                   os.environ.get("LD_LIBRARY_PATH")]))
        return [binary], env
    return ("no Chromium: run `sh docs/site_gen/get_chromium.sh` (Debian's chromium-headless-shell, unpacked into "
            ".venv/debian/chromium), or set $CHROMIUM")


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """The folder over HTTP on 127.0.0.1 (a free port), as the base URL, for as long as the context lasts."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output is its assertions, not an access log
        pass


class Browser:
    """One headless page. `goto(url)` waits for the load event; `js(expr)` returns the expression's value (JSON);
    `screenshot(path)` writes a PNG of the viewport."""

    def __init__(self, command: list[str], env: dict[str, str], width: int = 1280, height: int = 900,
                 timeout: float = 30.0) -> None:
        from websockets.sync.client import connect

        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="rankwise-chromium-")
        # --no-sandbox: the sandbox needs a setuid helper or user namespaces, which a container run as root lacks
        self._process = subprocess.Popen(
            [*command, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={self._profile}",
             "about:blank"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._port()
            pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
            url = next(p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page")
            self._ws = connect(url, max_size=None, open_timeout=timeout)
        except BaseException:
            self.close()
            raise
        self._next = 0
        self._events: list[dict] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _port(self) -> int:
        """Chromium writes the port it chose into DevToolsActivePort in its profile."""
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode} before it listened")
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict:
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=self.timeout))
            if message.get("id") == self._next:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _wait_event(self, name: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == name for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} within {self.timeout} s")
            self._events.append(json.loads(self._ws.recv(timeout=self.timeout)))

    def goto(self, url: str) -> None:
        self._events.clear()
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise RuntimeError(f"{url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired")

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails'].get('exception', result['exceptionDetails'])}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ws.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
