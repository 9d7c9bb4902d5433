"""``python -m routing.demo.hints``: once the web server answers, say what to try first.

Run by `make run` beside web, worker and beat (see the Procfile). Standard library only, so it
costs a few megabytes; after printing it waits quietly until the stack stops (config.stack stops
every process when one exits, so it must not exit).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

WAIT_SECONDS = 180


def _logins(var_dir: Path) -> dict[str, str]:
    """username -> password, from seed_demo's login file ("user / password  (role)" lines)."""
    logins: dict[str, str] = {}
    try:
        lines = (var_dir / "demo-login.txt").read_text().splitlines()
    except OSError:
        return logins
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "/":
            logins[parts[0]] = parts[2]
    return logins


def hints_text(base: str, logins: dict[str, str]) -> str:
    port = urlsplit(base).port
    spike = "make spike" + (f" PORT={port}" if port not in (None, 8000) else "")

    def login(user: str) -> str:
        return f"  (login {user} / {logins[user]})" if user in logins else ""

    manager = "manager" if "manager" in logins else "admin"
    revops = "revops" if "revops" in logins else "admin"
    return "\n".join(
        (
            "",
            "LeadRouter is up. Three things to try:",
            f"  1. Open the dashboard: {base}/dashboard/{login(manager)}",
            "  2. Send a webinar spike of 400 leads, and watch the dashboard and /history/:",
            f"       {spike}     (or: .venv/bin/python manage.py simulate_traffic --spike 400"
            f" --url {base})",
            f"  3. Try a lead on the rules in the admin: {base}/admin/routing/ruleset/simulate/"
            f"{login(revops)}",
            "",
        )
    )


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310  # our own http URL
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    # The web's address as `make run` announces it (HOST may be 0.0.0.0: not an address to ask).
    base = os.environ.get("LEADROUTER_URL", "http://127.0.0.1:8000").rstrip("/")
    var_dir = Path(os.environ.get("LEADROUTER_VAR_DIR") or Path(__file__).parents[2] / "var")
    deadline = time.monotonic() + WAIT_SECONDS
    while not _ready(f"{base}/readyz"):
        if time.monotonic() > deadline:
            print(f"{base}/readyz did not answer within {WAIT_SECONDS}s; see the web log above.")
            break
        time.sleep(1)
    else:
        print(hints_text(base, _logins(var_dir)), flush=True)
    sys.stdout.flush()
    while True:  # config.stack stops everything when one process exits: wait to be stopped
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
