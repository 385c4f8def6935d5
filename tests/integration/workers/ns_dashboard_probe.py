"""Run inside a private network namespace (`unshare -n`): give its loopback device a
non-loopback address, start `gpufleet dashboard` bound to it, and report what an HTTP client
gets with and without the token. Prints one JSON object; starts and ends its own processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

HOST = "10.77.0.1"


def get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:  # not listening yet
        return 0


def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{HOST}/32", "dev", "lo"], check=True)
    dash = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "dashboard", "--host", HOST,
                             "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        assert dash.stderr is not None
        first = dash.stderr.readline()
        second = dash.stderr.readline()
        url = first.split(" on ", 1)[1].split()[0]  # http://HOST:PORT/?token=...
        base, _, token = url.partition("?token=")
        deadline = time.monotonic() + 20
        while get(base + "api/jobs") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        bearer = {"Authorization": f"Bearer {token}"}
        out = {
            "first_line": first.strip(), "second_line": second.strip(), "token": token,
            "no_token": {p: get(base + p) for p in ("", "api/jobs", "metrics", "static/app.js")},
            "wrong_token": get(base + "api/jobs", {"Authorization": "Bearer nope"}),
            "bearer": {p: get(base + p, bearer) for p in ("", "api/jobs", "metrics")},
            "query": get(base + "?token=" + token),
        }
        print(json.dumps(out))
    finally:
        dash.terminate()
        dash.wait(timeout=10)


if __name__ == "__main__":
    main()
