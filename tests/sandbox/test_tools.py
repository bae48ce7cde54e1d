"""Tools as an agent meets them: run_tool's limits, the calculator, the python sandbox and
the registry with its entry-point plugins. Everything runs for real (sandbox processes,
plugin discovery in a fresh interpreter)."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.sandbox import isolation_prefix, network_prefixes
from kernelflow.tools import (
    Tool,
    ToolContext,
    ToolLimits,
    ToolOutcome,
    UnknownTool,
    make_tool,
    register_tool,
    run_tool,
    tool_names,
)
from tests.conftest import marked, wait_until_unmarked
from tests.plugins import plugin_site

REPO = Path(__file__).resolve().parents[2]
CTX = ToolContext(task_id="t1", agent="tester")


def call(tool: Tool | str, args: Any, ctx: ToolContext = CTX) -> ToolOutcome:
    return asyncio.run(run_tool(make_tool(tool) if isinstance(tool, str) else tool, args, ctx))


def calc(expression: str) -> ToolOutcome:
    return call("calculator", {"expression": expression})


# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("2 ** 10", "1024"),
        ("-2 ** 2", "-4"),
        ("7 / 2", "3.5"),
        ("10 / 4 * 2", "5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("sqrt(16) + abs(-3)", "7"),
        ("log(8, 2)", "3"),
        ("log10(1000)", "3"),
        ("log(e)", "1"),
        ("exp(0) + sin(0) + cos(0) + tan(0)", "2"),
        ("asin(1) * 2 == pi", "True"),
        ("acos(1) + atan(0)", "0"),
        ("floor(-2.5) + ceil(2.1)", "0"),
        ("round(2.567, 2)", "2.57"),
        ("round(2.5)", "2"),
        ("factorial(20)", "2432902008176640000"),
        ("min(4, 2, 8) + max(1, 5)", "7"),
        ("1 < 2 <= 2", "True"),
        ("3 > 4", "False"),
        ("pi", repr(math.pi)),
        ("2 ** 0.5", repr(2**0.5)),
        ("2 ** -1", "0.5"),
        ("10 ** 20", "100000000000000000000"),
        ("1e20", "1e+20"),
    ],
)
def test_calculator_computes(expression: str, expected: str) -> None:
    outcome = calc(expression)
    assert outcome.ok, outcome.error
    assert outcome.output == expected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("9 ** 9 ** 9", "more than 1000 digits"),
        ("2 ** 100000", "more than 1000 digits"),
        ("(10 ** 600) * (10 ** 600)", "more than 1000 digits"),
        ("factorial(10 ** 6)", "at most 449"),
        ("factorial(2.5)", "non-negative integer"),
        ("exp(1000)", "exp(1000)"),
        ("1e308 * 10", "overflows"),
        ("(-8) ** 0.5", "not a real number"),
        ("10 ** 400 / 3", "overflows"),
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0.0", "division by zero"),
        ("log(0)", "math domain error"),
        ("sqrt(1, 2)", "takes 1 argument(s), got 2"),
        ("min()", "takes 1-64 argument(s), got 0"),
        ("round(x=1)", "positional arguments only"),
        ("__import__('os').system('id')", "unknown function"),
        ("().__class__", "unsupported syntax"),
        ("[1, 2][0]", "unsupported syntax"),
        ("not 1", "unsupported syntax"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 +", "not a valid expression"),
        ("-" * 995 + "1", "nested too deeply"),
        ("1" + " + 1" * 400, "limit is 1000"),
    ],
)
def test_calculator_refuses_with_a_reason(expression: str, problem: str) -> None:
    started = time.monotonic()
    outcome = calc(expression)
    # refused before any expensive work (which would run for minutes, not seconds)
    assert time.monotonic() - started < 5.0
    assert not outcome.ok
    assert problem in outcome.error
    assert outcome.output == f"error: {outcome.error}"


def _expressions(depth: int = 4) -> st.SearchStrategy[str]:
    """Random arithmetic shallow enough that no value leaves the calculator's bounds, so it
    must agree with Python exactly (or both fail on a division by zero)."""
    number = st.one_of(
        st.integers(0, 1000).map(str),
        st.integers(0, 10**6).map(lambda n: repr(n / 1000)),  # no tiny divisors
    )
    if depth == 0:
        return number
    inner = _expressions(depth - 1)
    binary = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner)
    return st.one_of(
        number,
        binary.map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, st.integers(0, 3)).map(lambda t: f"({t[0]}) ** {t[1]}"),
        st.tuples(st.sampled_from(["-", "+"]), inner).map(lambda t: f"{t[0]}{t[1]}"),
    )


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_calculator_agrees_with_python(expression: str) -> None:
    outcome = calc(expression)
    try:
        expected = eval(expression, {"__builtins__": {}})  # the oracle: trusted, generated text
    except ZeroDivisionError:
        assert not outcome.ok and "division by zero" in outcome.error
        return
    assert outcome.ok, (expression, outcome.error)
    if isinstance(expected, int):
        assert outcome.output == str(expected)
    else:
        assert float(outcome.output) == expected


# --------------------------------------------------------------------------- run_tool limits


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({}, "'expression' is a required property"),
        ({"expression": 5}, "expression: 5 is not of type 'string'"),
        ({"expression": "1", "precision": 3}, "'precision' was unexpected"),
        (["1 + 1"], "arguments must be a JSON object, got list"),
    ],
)
def test_invalid_arguments_are_an_observation_naming_the_problem(args: Any, problem: str) -> None:
    outcome = call("calculator", args)
    assert not outcome.ok
    assert outcome.error.startswith("invalid arguments for calculator: ")
    assert problem in outcome.error


class _Sleeper(Tool):
    """A test-only tool that takes longer than its limit."""

    name = "test_sleeper"
    description = "sleeps"
    parameters = {"type": "object"}

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.sleep(30)
        return "woke up"


def test_slow_tool_times_out() -> None:
    started = time.monotonic()
    outcome = call(_Sleeper(ToolLimits(timeout_s=0.2)), {})
    assert time.monotonic() - started < 10  # cut long before its 30 s sleep
    assert not outcome.ok
    assert outcome.error == "test_sleeper timed out after 0.2s"


def test_huge_output_is_truncated_with_a_marker() -> None:
    tool = make_tool("calculator", ToolLimits(max_output_chars=100))
    outcome = call(tool, {"expression": "factorial(449)"})
    assert outcome.ok and outcome.truncated
    digits = str(math.factorial(449))
    assert outcome.output.startswith(digits[:100])
    assert f"[... output truncated: {len(digits) - 100} more characters]" in outcome.output


def test_rate_limit_holds() -> None:
    tool = make_tool("calculator", ToolLimits(calls_per_minute=2))
    outcomes = [call(tool, {"expression": "1 + 1"}) for _ in range(3)]
    assert [o.ok for o in outcomes] == [True, True, False]
    assert outcomes[2].error == "rate limit: calculator allows 2 calls per minute"


# --------------------------------------------------------------------------- python sandbox


def test_python_tool_shows_output_and_exit_status() -> None:
    outcome = call(
        "python", {"code": "import sys\nprint(6 * 7, flush=True)\nprint('warn', file=sys.stderr)"}
    )
    assert outcome.ok, outcome.error
    assert outcome.output == "[exit status 0]\n42\nwarn"


def test_python_tool_failure_shows_the_traceback() -> None:
    outcome = call("python", {"code": "print('before')\n1 / 0"})
    assert not outcome.ok
    assert outcome.error.startswith("[exit status 1]\nbefore\n")
    assert 'File "main.py", line 2' in outcome.error  # no temp dir paths
    assert "ZeroDivisionError" in outcome.error


def test_python_tool_output_keeps_the_tail() -> None:
    tool = make_tool("python", ToolLimits(max_output_chars=2000))
    outcome = call(tool, {"code": "for i in range(100_000):\n    print(i)"})
    assert outcome.ok
    assert outcome.output.startswith("[exit status 0]\n[... ")
    assert "bytes dropped ...]" in outcome.output
    assert outcome.output.endswith("99999")
    assert len(outcome.output) <= 2000 + 100


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def test_python_tool_endless_loop_is_killed_with_all_it_started() -> None:
    marker = f"kf-tool-test-{os.getpid()}-{time.monotonic_ns()}"
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        sleep = [sys.executable, "-c", "import time; time.sleep(300)", "{marker}"]
        group = subprocess.Popen([*sleep, "group"])
        session = subprocess.Popen([*sleep, "session"], start_new_session=True)
        print("STARTED", flush=True)
        while True:
            pass
        """
    )
    started = time.monotonic()
    outcome = call(make_tool("python", ToolLimits(timeout_s=3)), {"code": code})
    assert time.monotonic() - started < 30  # not the 300 s its children would hold a pipe
    assert not outcome.ok
    assert outcome.error.startswith("[timed out after 3 s: the command and all it started")
    assert "STARTED" in outcome.error
    wait_until_unmarked(marker, within_s=5)
    if "--pid" not in isolation_prefix():  # a new session escapes without a PID namespace
        leftover = [
            p for p in marked(marker) if b"session" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        for pid in leftover:
            os.kill(pid, 9)
    assert not marked(marker), "a process outlived the tool's timeout"


KILLED_DAEMON = """
import asyncio, sys
from kernelflow.tools import ToolContext, make_tool, run_tool

code = "import subprocess, sys\\n" + (
    "subprocess.Popen([sys.executable, '-c', 'while True: pass', MARKER])\\nwhile True: pass"
).replace("MARKER", repr(sys.argv[1]))
asyncio.run(run_tool(make_tool("python"), {"code": code}, ToolContext(task_id="t", agent="a")))
"""


def test_python_tool_dies_with_a_killed_daemon() -> None:
    """SIGKILL leaves the daemon no chance to kill the command: the kernel must."""
    marker = f"kf-tool-test-{os.getpid()}-{time.monotonic_ns()}"
    daemon = subprocess.Popen([sys.executable, "-c", KILLED_DAEMON, marker], cwd=REPO)
    deadline = time.monotonic() + 30
    # The command itself: a child forked but not yet exec'd shows the daemon's marker too.
    while not [p for p in marked(marker) if _cmdline(p)[1:3] == [b"-c", b"while True: pass"]]:
        assert time.monotonic() < deadline, "the command never ran"
        time.sleep(0.05)
    daemon.kill()
    daemon.wait()
    wait_until_unmarked(marker, within_s=5)
    assert not marked(marker), "the command outlived the daemon that started it"


SPAWNER_GONE_AT_ONCE = """
import os, subprocess, sys
from kernelflow.sandbox.command import dying_with_this_process

spin = [sys.executable, "-c", "while True: pass", sys.argv[1]]
subprocess.Popen([*dying_with_this_process(), *spin])
os._exit(0)  # gone before the command's interpreter has even started
"""


def test_a_command_whose_spawner_died_as_it_started_does_not_run_on() -> None:
    """The race a loaded machine met: the daemon killed between the fork of a command and
    the command's request to die with it. Asked after its parent's death, the request
    would take init as the parent, and the command would spin for good."""
    marker = f"kf-tool-test-{os.getpid()}-{time.monotonic_ns()}"
    subprocess.run([sys.executable, "-c", SPAWNER_GONE_AT_ONCE, marker], cwd=REPO, check=True)
    try:
        # Its interpreter may take seconds to start on a loaded machine (until it does, its
        # own command line carries the marker); an orphan would spin on for good.
        wait_until_unmarked(marker, within_s=30)
        assert not marked(marker), "the command outlived the process that started it"
    finally:
        for pid in marked(marker):
            os.kill(pid, 9)


def test_python_tool_memory_bomb_is_contained() -> None:
    code = "hog = []\nwhile True:\n    hog.append(bytearray(50 * 1024 * 1024))"
    outcome = call(make_tool("python", ToolLimits(timeout_s=20, memory_mb=512)), {"code": code})
    assert not outcome.ok
    assert "MemoryError" in outcome.error


def test_python_tool_has_no_network() -> None:
    if not network_prefixes()[0]:
        pytest.skip("network namespaces are not available here")
    code = textwrap.dedent(
        """
        import socket
        print(sorted(name for _, name in socket.if_nameindex()))
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=2)
            print("connected")
        except OSError as exc:
            print("blocked:", exc)
        """
    )
    outcome = call("python", {"code": code})
    assert outcome.ok, outcome.error
    assert "['lo']" in outcome.output
    assert "blocked:" in outcome.output


def test_python_tool_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_SECRET_TOKEN", "do-not-leak")
    code = "import os\nprint(sorted(os.environ))\nprint(os.getcwd() == os.environ['HOME'])"
    outcome = call("python", {"code": code})
    assert outcome.ok, outcome.error
    assert "KF_SECRET_TOKEN" not in outcome.output
    assert outcome.output.endswith("True")


# --------------------------------------------------------------------------- registry


BUILTIN = {
    "calculator",
    "python",
    "view_file",
    "create_file",
    "edit_file",
    "search_code",
    "search_files",
    "execute_bash",
    "run_tests",
    "compile_kernel",
    "check_kernel",
    "time_kernel",
    "roofline",
    "profile_kernel",
    "dsl_notes",
}


def test_builtin_tools_are_registered_with_valid_specs() -> None:
    assert set(tool_names()) >= BUILTIN
    for name in BUILTIN:
        spec = make_tool(name).spec()
        assert spec["name"] == name and spec["description"]
        assert spec["parameters"]["type"] == "object"


def test_unknown_tool_names_the_known_ones() -> None:
    with pytest.raises(UnknownTool, match=r"unknown tool 'nope' \(known tools: calculator, "):
        make_tool("nope")
    with pytest.raises(UnknownTool, match="unknown tool 'calculater'; did you mean 'calculator'"):
        make_tool("calculater")


def test_make_tool_takes_limits() -> None:
    assert make_tool("python").limits == ToolLimits(timeout_s=30.0, memory_mb=2048)
    assert make_tool("python", ToolLimits(timeout_s=5)).limits.timeout_s == 5


def test_register_tool_refuses_bad_and_duplicate_names() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @register_tool
        class Other(_Sleeper):
            name = "calculator"

    with pytest.raises(ValueError, match="needs a class attribute `name`"):

        @register_tool
        class Spaced(_Sleeper):
            name = "two words"


PLUGIN = """
from kernelflow.tools import Tool


class Echo(Tool):
    name = "echo"
    description = "repeats its text"
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

    async def run(self, args, ctx):
        return args["text"]
"""

CHECK_PLUGIN = """
import asyncio
from kernelflow.tools import ToolContext, UnknownTool, make_tool, run_tool, tool_names

names = tool_names()
assert "echo" in names and "calculator" in names and "broken" not in names, names
ctx = ToolContext(task_id="t", agent="a")
print(asyncio.run(run_tool(make_tool("echo"), {"text": "hello"}, ctx)).output)
try:
    make_tool("broken")
except UnknownTool as exc:
    print(exc)
"""


def test_entry_point_plugins_are_found(tmp_path: Path) -> None:
    plugin_site(
        tmp_path,
        "kf-echo-plugin",
        "kernelflow.tools",
        "echo = kf_echo_plugin:Echo\nbroken = kf_missing_module:Tool",
        {"kf_echo_plugin": PLUGIN},
    )
    done = subprocess.run(
        [sys.executable, "-c", CHECK_PLUGIN],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{REPO}"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "hello"
    assert lines[1].startswith("tool plugin 'broken' (kf_missing_module:Tool) failed to load:")
    assert "ModuleNotFoundError" in lines[1]
    assert "tool plugin 'broken'" in done.stderr  # logged, not raised, when listing
