"""A sandbox dies with the process that forked it (sandbox/warm_server.py): a verifier
killed mid-check takes its judge and candidate with it, whenever it dies, so nothing runs
on past a time limit no one is left to enforce."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kernelflow.sandbox.warm_server import fork_sandbox


def _sleep_forever(workdir: Path, result_fd: int) -> None:
    (workdir / "started").write_text("")
    while True:  # a judge that has not confined itself yet, waiting on its candidate
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid and stat[0] != "Z":
                    found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_sandbox_dies_with_its_intermediate_before_it_confines_itself(tmp_path: Path) -> None:
    status_r, status_w = os.pipe()
    result_r, result_w = os.pipe()
    intermediate = fork_sandbox(
        {"workdir": str(tmp_path)}, status_w, result_w, _sleep_forever, probe=lambda _: 1
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.05)
        (sandbox,) = _children(intermediate)
        os.kill(intermediate, signal.SIGKILL)  # its worker, and so it, died mid-check
        os.waitpid(intermediate, 0)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{sandbox}").exists() and _children(1).count(sandbox):
            assert time.monotonic() < deadline, "the sandbox ran on without its parent"
            time.sleep(0.05)
    finally:
        for fd in (status_r, status_w, result_r, result_w):
            os.close(fd)
