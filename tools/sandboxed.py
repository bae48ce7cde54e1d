"""Run a tool's command in the verifier's sandbox; the ``python`` tool.

The command runs in a fresh private directory holding only the files it is given, with
a minimal environment, confined as a verifier's candidate is
(:func:`kernelflow.sandbox.run_confined`: no network, its own PID namespace where
the machine allows one, a read-only file system in which homes, secrets, the daemon's data
and the other sandboxes are hidden, the user ``nobody`` without capabilities, an
address-space limit, no core dumps, bounded file size, death with its parent), under a
wall-clock timeout that kills its whole process group, with a bounded output tail. The
directory is deleted afterwards. Where the machine cannot isolate it (and
``KF_SANDBOX_ALLOW_NETWORK`` does not opt in), the call fails, saying why. Commands run on
the CPU: the GPU belongs to the verifier, so it is hidden from them and Triton runs
interpreted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.sandbox import SandboxUnavailable, device_env, run_confined
from kernelflow.sandbox.workdirs import TOOL_PREFIX, locked_workdir
from kernelflow.tools.base import TEXT, Tool, ToolContext, ToolError, ToolLimits, arguments
from kernelflow.tools.registry import register_tool
from kernelflow.tools.workspace import materialise

__all__ = ["CommandResult", "PythonTool", "run_sandboxed"]

# Room in the output limit for the status line and the "bytes dropped" marker, so that
# the end of the output (where errors are) is never what gets cut.
_RESERVED_CHARS = 128


@dataclass(frozen=True)
class CommandResult:
    returncode: int | None  # None: killed on timeout; negative: killed by that signal
    output: str  # the tail of stdout and stderr together, paths relative to the workdir
    timeout_s: float

    @property
    def status(self) -> str:
        if self.returncode is None:
            return (
                f"timed out after {self.timeout_s:g} s: the command and all it started were killed"
            )
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"

    def observation(self) -> str:
        """What the agent is shown: the status line first (so no truncation hides it),
        then the output. Anything but exit status 0 is a failed call (ToolError)."""
        text = f"[{self.status}]\n{self.output}".rstrip("\n")
        if self.returncode != 0:
            raise ToolError(text)
        return text


def _environment(workdir: str) -> dict[str, str]:
    env = device_env(workdir, "cpu", gpu="")  # no GPU visible: it is the verifier's
    # `python`, `pytest`... in a command are this interpreter's (a venv's bin dir first).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def _run(
    argv: Sequence[str], limits: ToolLimits, files: Mapping[str, str], scratch_dir: Path | None
) -> CommandResult:
    with locked_workdir(TOOL_PREFIX, scratch_dir) as workdir:
        materialise(files, Path(workdir))
        tail_bytes = max(0, limits.max_output_chars - _RESERVED_CHARS)
        try:
            outcome = run_confined(
                argv,
                workdir,
                _environment(workdir),
                limits.work_timeout_s,
                tail_bytes,
                memory_mb=limits.memory_mb or 0,
            )
        except SandboxUnavailable as exc:
            raise ToolError(f"unsupported: {exc.reason}") from None
    output = outcome.output.replace(workdir.rstrip("/") + "/", "")
    return CommandResult(outcome.returncode, output, limits.timeout_s)


async def run_sandboxed(
    argv: Sequence[str],
    limits: ToolLimits,
    *,
    files: Mapping[str, str] | None = None,
    scratch_dir: Path | None = None,
) -> CommandResult:
    """Run ``argv`` in a fresh directory (under ``scratch_dir``, else the system's temp
    dir) holding ``files``, within ``limits``: time, memory (``memory_mb``, None: no
    limit) and output (its tail, within ``max_output_chars``). Whatever the command writes is
    discarded with the directory; nothing it started is left running. Raises ToolError
    where the machine cannot isolate the command."""
    return await asyncio.to_thread(_run, argv, limits, files or {}, scratch_dir)


@register_tool
class PythonTool(Tool):
    name = "python"
    description = (
        "Run Python code in a fresh sandbox (CPU only, no network, nothing kept) and show "
        "its exit status and output: print what you want to see."
    )
    parameters = arguments({"code": TEXT})

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return ToolLimits(timeout_s=30.0, max_output_chars=8000, memory_mb=2048)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        result = await run_sandboxed(
            [sys.executable, "-I", "main.py"],
            self.limits,
            files={"main.py": args["code"]},
            scratch_dir=ctx.scratch_dir,
        )
        return result.observation()
