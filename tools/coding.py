"""The coding tools (docs/agents.md, "Tools"): view, create, edit and search workspace
files; run a shell command or the tests.

The file tools read ``ctx.files``, the workspace snapshot the log records
(:mod:`kernelflow.tools.workspace`), never the real disk, so no path reaches outside the
workspace; ``create_file`` and ``edit_file`` declare their change as a pure ``effect``
that the workspace projection replays. ``execute_bash`` and ``run_tests`` materialise the
snapshot into a fresh directory and run the command there in the sandbox
(:mod:`kernelflow.tools.sandboxed`): the files a command creates or changes are NOT kept. The
workspace changes only through the file tools, so it stays a projection of the log; a
command is for looking (running the tests, a script, ``ls``), not for editing.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping
from typing import Any

from kernelflow.tools.base import TEXT, Tool, ToolContext, ToolError, ToolLimits, arguments
from kernelflow.tools.registry import register_tool
from kernelflow.tools.sandboxed import run_sandboxed
from kernelflow.tools.workspace import check_content, check_path

__all__ = [
    "DEFAULT_TEST_COMMAND",
    "CreateFile",
    "EditFile",
    "ExecuteBash",
    "RunTests",
    "SearchCode",
    "SearchFiles",
    "ViewFile",
]

DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"
MAX_LISTED = 500  # files named by search_files
MAX_MATCHES = 200  # lines shown by search_code
MAX_LINE_CHARS = 300

_PATH = {"type": "string", "description": "relative to the workspace, e.g. 'src/main.py'"}


def _missing(files: Mapping[str, str], path: str) -> ToolError:
    inside = sorted(p for p in files if p.startswith(path + "/"))
    if inside:
        return ToolError(f"{path} is a directory; its files: {', '.join(inside[:20])}")
    known = sorted(files)
    listed = ", ".join(known[:20]) + (f" ... ({len(known)} files)" if len(known) > 20 else "")
    return ToolError(f"no file {path!r} in the workspace; files: {listed or 'none'}")


def _read(files: Mapping[str, str], raw_path: str) -> tuple[str, str]:
    path = check_path(raw_path)
    if path not in files:
        raise _missing(files, path)
    return path, files[path]


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(lines, first))


def _glob_match(path: str, pattern: str) -> bool:
    """fnmatch on the whole path: ``*`` also matches ``/``, and a leading ``**/`` may match
    no directory at all (``**/*.py`` finds ``a.py`` too)."""
    return fnmatch.fnmatchcase(path, pattern) or (
        pattern.startswith("**/") and fnmatch.fnmatchcase(path, pattern[3:])
    )


@register_tool
class ViewFile(Tool):
    name = "view_file"
    description = (
        "Show a workspace file with line numbers; start_line/end_line (1-based, inclusive) "
        "show only part of it."
    )
    parameters = arguments(
        {"path": _PATH},
        {
            "start_line": {"type": "integer", "minimum": 1},
            "end_line": {"type": "integer", "minimum": 1},
        },
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path, content = _read(ctx.files, args["path"])
        lines = content.splitlines()
        if not lines:
            return f"{path} is empty"
        start = args.get("start_line", 1)
        end = min(args.get("end_line", len(lines)), len(lines))
        if start > len(lines):
            raise ToolError(f"start_line {start} is past the end of {path} ({len(lines)} lines)")
        if start > end:
            raise ToolError(f"start_line {start} is after end_line {end}")
        header = f"{path} (lines {start}-{end} of {len(lines)})"
        return f"{header}\n{_numbered(lines[start - 1 : end], start)}"


@register_tool
class CreateFile(Tool):
    name = "create_file"
    description = (
        "Create a new workspace file with the given content. Fails if the file exists "
        "(change an existing file with edit_file)."
    )
    parameters = arguments({"path": _PATH, "content": {"type": "string"}})

    def effect(self, files: Mapping[str, str], args: dict[str, Any]) -> dict[str, str]:
        path = check_path(args["path"])
        if path in files:
            raise ToolError(f"{path} already exists; change it with edit_file")
        for existing in files:
            if path.startswith(existing + "/"):
                raise ToolError(f"{existing} is a file, so {path} cannot be created inside it")
            if existing.startswith(path + "/"):
                raise ToolError(f"{path} is a directory (it holds {existing})")
        check_content(path, args["content"])
        return {**files, path: args["content"]}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args["path"])
        lines = len(self.effect(ctx.files, args)[path].splitlines())
        return f"created {path} ({_count(lines, 'line')})"


def _edited(files: Mapping[str, str], args: dict[str, Any]) -> tuple[str, str, int]:
    """The edited file's path, its new content and the line where the change starts."""
    path, content = _read(files, args["path"])
    old, new = args["old_str"], args["new_str"]
    count = content.count(old)
    if count == 0:
        raise ToolError(
            f"old_str was not found in {path}; it must match exactly, whitespace and "
            "indentation included (view_file shows the current text)"
        )
    if count > 1:
        starts, at = [], content.find(old)
        while at != -1:
            starts.append(str(content.count("\n", 0, at) + 1))
            at = content.find(old, at + 1)
        raise ToolError(
            f"old_str occurs {count} times in {path} (at lines {', '.join(starts[:10])}); "
            "include more surrounding lines so that it matches exactly once"
        )
    at = content.index(old)
    updated = content[:at] + new + content[at + len(old) :]
    check_content(path, updated)
    return path, updated, content.count("\n", 0, at) + 1


@register_tool
class EditFile(Tool):
    name = "edit_file"
    description = (
        "Replace old_str by new_str in a workspace file. old_str must occur exactly once "
        "(copy it from view_file, with enough lines to make it unique)."
    )
    parameters = arguments({"path": _PATH, "old_str": TEXT, "new_str": {"type": "string"}})

    def effect(self, files: Mapping[str, str], args: dict[str, Any]) -> dict[str, str]:
        path, updated, _ = _edited(files, args)
        return {**files, path: updated}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path, updated, line = _edited(ctx.files, args)
        lines = updated.splitlines()
        first = max(1, line - 2)
        last = min(len(lines), line + args["new_str"].count("\n") + 2)
        return f"edited {path}; it now reads:\n{_numbered(lines[first - 1 : last], first)}"


@register_tool
class SearchFiles(Tool):
    name = "search_files"
    description = (
        "List the workspace files whose path matches a glob ('*' also matches '/': "
        "'*.py' finds every Python file, 'tests/*' everything under tests/)."
    )
    parameters = arguments({"glob": TEXT})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        found = sorted(p for p in ctx.files if _glob_match(p, args["glob"]))
        if not found:
            files = _count(len(ctx.files), "file")
            return f"no file matches {args['glob']!r} ({files} in the workspace)"
        shown = [
            f"{p} ({_count(len(ctx.files[p].splitlines()), 'line')})" for p in found[:MAX_LISTED]
        ]
        if len(found) > MAX_LISTED:
            shown.append(f"[... {len(found) - MAX_LISTED} more files]")
        return "\n".join(shown)


# Runs in the sandbox: a pathological regular expression then only costs its own time
# limit (Python's `re` backtracks, holds the GIL and cannot be interrupted in-process).
_SEARCH = f"""
import os, re, sys
try:
    pattern = re.compile(sys.argv[1])
except (re.error, ValueError, OverflowError, RecursionError) as exc:
    sys.exit(f"invalid regular expression {{sys.argv[1]!r}}: {{exc}}")
found = 0
for root, dirs, names in os.walk("."):
    dirs.sort()
    for name in sorted(names):
        path = os.path.join(root, name)[2:]
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if pattern.search(line):
                    found += 1
                    if found <= {MAX_MATCHES}:
                        print(f"{{path}}:{{number}}: {{line.rstrip()[:{MAX_LINE_CHARS}]}}")
if found > {MAX_MATCHES}:
    print(f"[... {{found - {MAX_MATCHES}}} more matching lines]")
elif not found:
    print("no matches")
"""


@register_tool
class SearchCode(Tool):
    name = "search_code"
    description = (
        "Search the workspace files for a Python regular expression; prints 'file:line: text' "
        "for each matching line. glob (as in search_files) restricts the files searched."
    )
    parameters = arguments({"pattern": TEXT}, {"glob": TEXT})

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return ToolLimits(timeout_s=20.0, max_output_chars=8000, memory_mb=1024)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        glob = args.get("glob")
        files = {p: c for p, c in ctx.files.items() if glob is None or _glob_match(p, glob)}
        if not files:
            return f"no file matches {glob!r}"
        result = await run_sandboxed(
            [sys.executable, "-I", "-c", _SEARCH, args["pattern"]],
            self.limits,
            files=files,
            scratch_dir=ctx.scratch_dir,
        )
        if result.returncode is None:
            raise ToolError(f"search {result.status} (a regular expression that backtracks?)")
        if result.returncode != 0:
            raise ToolError(result.output.strip() or result.status)
        return result.output.rstrip("\n")


class _Command(Tool):
    """A shell command over a throwaway copy of the workspace (see the module docstring)."""

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return ToolLimits(timeout_s=60.0, max_output_chars=8000, memory_mb=2048)

    async def shell(self, command: str, ctx: ToolContext) -> str:
        result = await run_sandboxed(
            ["bash", "-c", command], self.limits, files=ctx.files, scratch_dir=ctx.scratch_dir
        )
        return result.observation()


@register_tool
class ExecuteBash(_Command):
    name = "execute_bash"
    description = (
        "Run a bash command in a copy of the workspace (no network; cwd is the workspace). "
        "Changes it makes to files are discarded: edit files with create_file/edit_file. "
        "A non-zero exit status is reported as a failure."
    )
    parameters = arguments({"command": TEXT})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self.shell(args["command"], ctx)


@register_tool
class RunTests(_Command):
    name = "run_tests"
    description = (
        f"Run the tests in a copy of the workspace; command defaults to "
        f"'{DEFAULT_TEST_COMMAND}'. Failing tests are reported as a failure with the output."
    )
    parameters = arguments({}, {"command": TEXT})

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return ToolLimits(timeout_s=180.0, max_output_chars=8000, memory_mb=2048)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return await self.shell(args.get("command", DEFAULT_TEST_COMMAND), ctx)
