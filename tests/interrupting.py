"""Ctrl-C in a process that has forked workers: start a Python script in a subprocess, send it
SIGINT as soon as it has a child, and report how it ended and what it left behind."""

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: the parent
            found.append(int(entry))
    return found


def _running(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a forked child keeps its parent's)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@dataclass
class Ending:
    returncode: int
    stderr: str
    forked: list  # the children the script had when it was interrupted
    left: list  # processes of the script still there after it exited (forked ones or by command line)
    seconds: float  # from the SIGINT to the script's exit

    @property
    def last_exception(self) -> str:
        """The last line of the traceback (e.g. "KeyboardInterrupt")."""
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def interrupt_once_forked(script: str, env: dict | None = None, timeout: float = 300, group: bool = False) -> Ending:
    """Run `script`, SIGINT it once it has a child process (polled every 2 ms), and wait for its
    end. group: the script runs as a process group of its own, and the whole group gets the
    signal, as Ctrl-C in a terminal sends it. AssertionError when it ends (or times out) without
    ever forking."""
    marker = f"interrupting-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", f"# {marker}\n{script}"], env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=group)
    start, forked = time.monotonic(), []
    try:
        while not forked and proc.poll() is None and time.monotonic() - start < timeout:
            forked = children(proc.pid)
            time.sleep(0.002)
        assert forked, f"the script never forked (exit code {proc.returncode})"
        os.killpg(proc.pid, signal.SIGINT) if group else proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=timeout)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    time.sleep(0.2)  # a killed child's exit to settle
    left = sorted({p for p in forked if os.path.exists(f"/proc/{p}")} | set(_running(marker)))
    for p in left:  # leave nothing behind for the next test
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Ending(proc.returncode, err, forked, left, seconds)
