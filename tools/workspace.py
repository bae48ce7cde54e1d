"""An agent's workspace: a projection of the task's log, never a directory on disk.

The workspace is a snapshot ``path -> text``. It starts from the files the task was
submitted with (for a kernel task also ``reference.py``, the task source, and
``candidate.py``, the code to start from); then every successful call of a file tool
changes it through that tool's pure ``effect``, replayed from its ``ToolCalled`` event,
and every parsed output with a ``code`` field becomes ``candidate.py``, so that file
always holds the latest code the workflow produced. Rebuilding it from the log therefore
gives the same files on any daemon, at any later time.

Paths follow one rule set (:func:`check_path`): relative POSIX paths, normalised, inside
the workspace. The workspace holds text only, so it can hold no symlink and no device:
:func:`materialise` writes it into a fresh directory for a command to run in.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Mapping
from pathlib import Path

from kernelflow.events.model import OutputParsed
from kernelflow.projections.task_state import TaskState
from kernelflow.tools.base import Tool, ToolError
from kernelflow.tools.registry import UnknownTool, make_tool

__all__ = [
    "CANDIDATE_FILE",
    "MAX_FILE_CHARS",
    "MAX_PATH_CHARS",
    "REFERENCE_FILE",
    "check_content",
    "check_path",
    "materialise",
    "workspace_files",
]

REFERENCE_FILE = "reference.py"
CANDIDATE_FILE = "candidate.py"
MAX_PATH_CHARS = 255
MAX_FILE_CHARS = 1_000_000


def check_path(path: str) -> str:
    """``path`` normalised (``./src//a.py`` -> ``src/a.py``), or a ToolError saying which
    rule it breaks."""
    if not path:
        raise ToolError("empty path: name a file relative to the workspace, e.g. 'src/main.py'")
    if "\0" in path:
        raise ToolError(f"path {path!r} contains a NUL character")
    if any(ord(c) < 32 for c in path):
        raise ToolError(f"path {path!r} contains a control character")
    if len(path) > MAX_PATH_CHARS:
        raise ToolError(f"path is {len(path)} characters long; the limit is {MAX_PATH_CHARS}")
    if "\\" in path:
        raise ToolError(f"path {path!r} contains a backslash; separate directories with '/'")
    if path.startswith("/"):
        raise ToolError(
            f"absolute path {path!r}: workspace paths are relative (e.g. 'src/main.py')"
        )
    norm = posixpath.normpath(path)
    if norm == "..":
        raise ToolError(f"path {path!r} is outside the workspace")
    if norm.startswith("../"):
        raise ToolError(f"path {path!r} is outside the workspace ('..' leaves it)")
    if norm == ".":
        raise ToolError(f"path {path!r} names the workspace itself, not a file")
    return norm


def check_content(path: str, content: str) -> None:
    if len(content) > MAX_FILE_CHARS:
        raise ToolError(
            f"{path}: {len(content)} characters is over the {MAX_FILE_CHARS} limit of a "
            "workspace file"
        )


@functools.cache
def _replayer(name: str) -> Tool | None:
    try:
        return make_tool(name)
    except UnknownTool:
        # A plugin tool missing on this machine: its calls cannot be replayed here.
        return None


def workspace_files(state: TaskState) -> dict[str, str]:
    """The workspace of ``state``'s task after everything its log records (see above)."""
    submitted = state.submitted
    if submitted is None:
        return {}
    files: dict[str, str] = {}
    if submitted.task_source:
        files[REFERENCE_FILE] = submitted.task_source
        if submitted.candidate_code:
            files[CANDIDATE_FILE] = submitted.candidate_code
    for path, content in submitted.files.items():
        try:
            files[check_path(path)] = content
        except ToolError:
            continue  # a path the rules refuse: a projection never fails on recorded events
    for dispatch in state.dispatches:
        for call in dispatch.tool_calls:
            tool = _replayer(call.tool) if call.ok else None
            if tool is None:
                continue
            try:
                changed = tool.effect(files, call.args)
            except ToolError:
                continue  # recorded by another version of the tool: skip, never fail
            if changed is not None:
                files = changed
        result = dispatch.result
        if isinstance(result, OutputParsed) and isinstance(result.fields.get("code"), str):
            files[CANDIDATE_FILE] = result.fields["code"]
    return files


def materialise(files: Mapping[str, str], directory: Path) -> None:
    """Write the snapshot ``files`` into ``directory`` (fresh and empty: nothing in it is
    followed, so no path can lead outside it)."""
    for path, content in files.items():
        target = directory / check_path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise ToolError(f"cannot write {path} for the command: {exc.strerror}") from exc
