"""``python -m config.stack``: `make run`'s supervisor; no process it starts outlives it.

It runs the Procfile's processes (web, worker, beat, hints) with their output prefixed by name,
as honcho did. honcho started each one in a session of its own behind a helper process that
ignores SIGTERM, so when `make run` was ended with SIGTERM and then SIGKILL a few seconds later
(a closed terminal, ``kill``, a process manager), a celery worker survived as an orphan. Here:

- each process gets ``PR_SET_PDEATHSIG`` = SIGKILL (Linux): however this supervisor ends, even
  by SIGKILL, the kernel kills them. Their own children follow them: gunicorn's workers watch
  their parent, celery's pool processes have the same setting;
- this supervisor gets SIGTERM when its own parent (make) dies;
- each process runs in a process group of its own (a Ctrl-C in the terminal reaches only this
  supervisor, which stops them all the same way). On SIGINT, SIGTERM or SIGHUP, or when any
  process exits, every group gets SIGTERM, and SIGKILL once ``STACK_STOP_SECONDS`` (10) passed.

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

PR_SET_PDEATHSIG = 1
_EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; else no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def read_procfile(path: Path) -> list[tuple[str, str]]:
    """(name, command) of each ``name: command`` line; blank lines and ``#`` comments skipped."""
    entries = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, command = line.partition(":")
        if not command.strip():
            raise ValueError(f"{path}: not a 'name: command' line: {line!r}")
        entries.append((name.strip(), command.strip()))
    return entries


@dataclass
class Child:
    """One Procfile process (the leader of its own process group)."""

    name: str
    popen: subprocess.Popen[bytes]

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # in the child, between fork and exec
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:  # the supervisor died before the line above
            os._exit(1)

    return setup


class Stack:
    """The running processes, their output, and how they are stopped."""

    def __init__(self, entries: list[tuple[str, str]], stop_seconds: float) -> None:
        self.entries = entries
        self.stop_seconds = stop_seconds
        self.children: list[Child] = []
        self.width = max([len(name) for name, _ in entries] + [6])
        self.write_lock = threading.Lock()
        self.stop_reason: str | None = None
        self.exit_code: int | None = None

    def say(self, name: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self.write_lock:
            sys.stdout.write(f"{stamp} {name:<{self.width}} | {text.rstrip()}\n")
            sys.stdout.flush()

    def start(self) -> None:
        # Every child is started before any thread runs: a fork with a setup function is only
        # safe in a process with one thread.
        me = os.getpid()
        for name, command in self.entries:
            popen = subprocess.Popen(  # noqa: S602 - the Procfile is the project's own
                f"exec {command}",
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_child_setup(me),  # safe: no thread runs yet
            )
            self.children.append(Child(name, popen))
        for child in self.children:
            self.say("system", f"{child.name} started (pid={child.popen.pid})")
            threading.Thread(target=self._pump, args=(child,), daemon=True).start()

    def _pump(self, child: Child) -> None:
        stdout = child.popen.stdout
        if stdout is None:
            return
        for raw in iter(stdout.readline, b""):
            self.say(child.name, raw.decode(errors="replace"))

    def request_stop(self, reason: str, exit_code: int | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.exit_code = exit_code

    def run(self) -> int:
        self.start()
        while self.stop_reason is None:
            for child in self.children:
                code = child.popen.poll()
                if code is not None:
                    self.say("system", f"{child.name} stopped (rc={code})")
                    self.request_stop(f"{child.name} stopped", code)
                    break
            time.sleep(0.1)
        self.stop()
        return self.exit_code if self.exit_code is not None else 0

    def stop(self) -> None:
        self.say("system", f"{self.stop_reason}: stopping every process")
        live = [child for child in self.children if child.popen.poll() is None]
        for child in live:
            self.say("system", f"sending SIGTERM to {child.name} (pid {child.popen.pid})")
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_seconds
        while time.monotonic() < deadline and any(c.popen.poll() is None for c in live):
            time.sleep(0.1)
        for child in self.children:
            if child.popen.poll() is None:
                self.say("system", f"sending SIGKILL to {child.name} (pid {child.popen.pid})")
            # Also to a group whose leader is gone: a child of it may be left.
            child.signal_group(signal.SIGKILL)
        for child in live:
            self.say("system", f"{child.name} stopped (rc={child.popen.wait()})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--procfile", type=Path, default=Path("Procfile"))
    args = parser.parse_args(argv)
    parent = os.getppid()
    set_parent_death_signal(signal.SIGTERM)  # make died: stop the stack as for a SIGTERM
    stack = Stack(read_procfile(args.procfile), float(os.environ.get("STACK_STOP_SECONDS", "10")))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stack.request_stop(f"{signal.Signals(signum).name} received", _EXIT_CODES[signum])

    for sig in _EXIT_CODES:
        signal.signal(sig, on_signal)
    if os.getppid() != parent:  # make died before the parent-death signal was set
        return 143
    return stack.run()


if __name__ == "__main__":
    sys.exit(main())
