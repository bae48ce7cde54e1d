"""The first hour of a new user (issue 39's table), row by row, with the real CLI on
servers that require keys, as the embedded default does: each mistake a user can make
answered with one line, the right exit code, at once; the happy path's output read by a
person. Rows tested elsewhere (in tests/integration): a cancel of an unknown task and one
right after its submit (test_cancel.py), a command stopped mid-run (test_stopping.py),
``health`` (test_health.py), the HTML report in a browser (test_report_html.py), a real
model's server (test_llm_servers.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from kernelflow.projections.report import table
from tests.conftest import EXAMPLES, as_user, cli_env, run_cli
from tests.daemons import slow_script

RELU = str(EXAMPLES / "tasks" / "relu.py")
SCRIPT = "scripted:" + str(EXAMPLES / "scripted" / "relu.yaml")
# A command refused before it connects, or one a NATS server refuses, ends in this long
# at most (a Python start-up, an import of the CLI, two seconds of refusals) on a loaded
# machine; before, these took 30 s or more.
AT_ONCE_S = 20.0


def timed(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = run_cli(*args, env=env, timeout=120)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def one_line(stderr: str) -> str:
    """The one line a refused command says (nothing else on stderr, no traceback)."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("url", ["localhost:4222x", "nats://localhost:99999", "[::1"])
@pytest.mark.parametrize("command", [["status"], ["submit", RELU], ["daemon"]])
def test_a_nats_url_that_is_not_one_is_refused_before_connecting(
    command: list[str], url: str
) -> None:
    code, _, stderr, took = timed(*command, "--nats-url", url)
    assert code == 2
    assert one_line(stderr).startswith(f"kernelflow: --nats-url: NATS URL {url!r}: ")
    assert took < AT_ONCE_S
    # The same, set in the environment, says where it came from.
    code, _, stderr, _ = timed(*command, env=cli_env(KF_NATS_URL=url))
    assert code == 2 and one_line(stderr).startswith("kernelflow: KF_NATS_URL: ")


def test_a_nats_url_nothing_listens_at_fails_within_seconds() -> None:
    code, _, stderr, took = timed("status", "--nats-url", "nats://127.0.0.1:1")
    assert code == 1
    assert (
        one_line(stderr) == "kernelflow: nothing listens at nats://127.0.0.1:1 (connection refused)"
    )
    assert took < AT_ONCE_S


def test_a_nats_server_that_does_not_answer_is_given_up_on_with_why() -> None:
    # An address nothing answers at (TEST-NET-1, RFC 5737): each attempt times out, or
    # the network says it is unreachable; either way the reason is said.
    code, _, stderr, took = timed(
        "status", "--nats-url", "nats://192.0.2.1:4222", "--connect-timeout", "2"
    )
    assert code == 1, stderr
    last = stderr.splitlines()[-1]
    assert re.fullmatch(
        r"kernelflow: no NATS server answered at nats://192\.0\.2\.1:4222 within 2s \(.+\)", last
    ), stderr
    assert "Traceback" not in stderr and len(stderr.splitlines()) <= 2
    assert took < AT_ONCE_S


def test_an_llm_endpoint_nothing_answers_at_fails_the_run_at_once(tmp_path: Path) -> None:
    spec = "openai:http://127.0.0.1:9/v1#qwen"
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    code, stdout, stderr, took = timed("run", RELU, "--llm", spec, env=env)
    assert (code, stdout) == (2, "")
    assert one_line(stderr) == (
        f"kernelflow: LLM {spec}: nothing answers at http://127.0.0.1:9/v1 (connection refused)"
    )
    assert took < AT_ONCE_S
    # `health --llm` asks the endpoint too: a fault, said in its row.
    code, stdout, _, _ = timed("health", "--llm", spec, "--no-daemons", env=env)
    assert code == 1
    (row,) = [line for line in stdout.splitlines() if line.startswith("llm ") and "FAIL" in line]
    assert "endpoint" in row


def test_a_misspelt_role_is_refused_with_the_one_meant(nats_url: str) -> None:
    code, _, stderr, took = timed(
        "daemon", "--roles", "coder,verifer", *as_user("daemon", nats_url)
    )
    assert code == 2
    assert one_line(stderr).startswith(
        "kernelflow: --roles: no role 'verifer'; did you mean 'verifier'?"
    )
    assert took < AT_ONCE_S


@pytest.mark.parametrize(
    "args, meant",
    [
        (["run", RELU, "--workflow", "defualt", "--llm", SCRIPT], "default"),
        (["run", RELU, "--backend", "trito", "--llm", SCRIPT], "triton"),
        (["rollout", "--dataset", "x.jsonl", "--agent", "reactt", "--llm", SCRIPT], "react"),
        (
            ["rollout", "--dataset", "x.jsonl", "--reward", "exact_mach", "--llm", SCRIPT],
            "exact_match",
        ),
        (["daemon", "--pool", "verifer=2"], "verifier"),
        (["statu"], "status"),
    ],
    ids=["workflow", "backend", "agent", "reward", "pool", "command"],
)
def test_a_name_that_is_not_one_gets_the_one_meant(
    args: list[str], meant: str, tmp_path: Path
) -> None:
    code, _, stderr, took = timed(*args, env=cli_env(KF_DATA_DIR=str(tmp_path)))
    assert code == 2
    assert f"did you mean {meant!r}?" in one_line(stderr)
    assert took < AT_ONCE_S


@pytest.mark.parametrize("command", [["submit", RELU, "--task-id"], ["cancel"]])
def test_a_task_id_that_is_not_one_is_said_in_kernelflows_words(command: list[str]) -> None:
    code, _, stderr, _ = timed(*command, "a.b")
    assert code == 2
    assert one_line(stderr).endswith("task_id: expected 1 to 64 letters, digits, '_' or '-'")


@pytest.mark.parametrize("seconds", ["-5", "0", "soon", "inf"])
def test_a_deadline_that_is_not_a_time_is_refused_in_kernelflows_words(seconds: str) -> None:
    code, _, stderr, _ = timed("submit", RELU, "--deadline", seconds)
    assert code == 2
    line = one_line(stderr)
    assert line.startswith("kernelflow submit: --deadline: expected seconds"), line
    assert "$." not in line and "Expected" not in line  # not msgspec's


@pytest.mark.parametrize("command", ["replay", "status", "cancel", "export", "reverify"])
def test_task_ids_are_positional_everywhere_and_the_old_flag_still_works(
    command: str, nats_url: str, tmp_path: Path
) -> None:
    role = "publisher" if command in ("status", "cancel") else "reader"
    prefix = (
        ["export", "grpo", "--out", str(tmp_path / "x.jsonl")] if command == "export" else [command]
    )
    if command == "reverify":
        prefix += ["--dry-run"]
    given = run_cli(*prefix, "ghost", *as_user(role, nats_url))
    assert "Traceback" not in given.stderr and "required" not in given.stderr, given.stderr
    if command in ("replay", "status"):
        assert given.returncode == 2 and "no task ghost" in given.stderr, given.stderr
    if command in ("replay", "export", "reverify"):  # --task ID, as before
        flagged = run_cli(*prefix, "--task", "ghost", *as_user(role, nats_url))
        assert (flagged.returncode, flagged.stdout) == (given.returncode, given.stdout)
        both = run_cli(*prefix, "ghost", "--task", "other", *as_user(role, nats_url))
        assert both.returncode == 2
        assert "two tasks named: 'ghost' and 'other'" in one_line(both.stderr)


def test_version_and_the_workflows_there_are() -> None:
    code, stdout, _, _ = timed("--version")
    assert code == 0 and re.fullmatch(r"kernelflow \S+\n", stdout)
    code, stdout, _, _ = timed("workflow", "list")
    assert code == 0
    rows = [line.split() for line in stdout.splitlines()]
    listed = [row[0] for row in rows if row[1:2] == ["predefined"]]
    assert {"default", "coder_only", "verifier_only"} <= set(listed)


def test_the_help_says_where_things_go() -> None:
    helped = run_cli("run", "--help").stdout

    def said_of(option: str) -> str:  # the help of an option, on one line
        after = helped.split(f"\n  {option}", 1)[1]
        return " ".join(re.split(r"\n  -", after, maxsplit=1)[0].split())

    assert "outputs" not in said_of("--data-dir") and "store" in said_of("--data-dir")
    assert "./kernelflow-runs" in said_of("--out")


def test_a_malformed_workflow_is_one_line_naming_the_file_and_the_place(tmp_path: Path) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nagent_info: [\n  a: b\n")
    expected = (
        f"kernelflow: {bad}: not valid YAML: line 4, column 1: did not find expected ',' or "
        "']' (in the flow sequence that begins at line 2, column 13)"
    )
    for args in (["workflow", "validate", str(bad)], ["run", RELU, "--workflow", str(bad)]):
        code, _, stderr, _ = timed(*args, "--llm", SCRIPT) if args[0] == "run" else timed(*args)
        assert code == 2
        assert one_line(stderr) == expected
        assert "<unicode string>" not in stderr


def test_a_mismatch_is_said_once(tmp_path: Path) -> None:
    candidate = tmp_path / "off_by_half.py"
    legit = (EXAMPLES / "candidates" / "legit" / "relu_autotune.py").read_text()
    candidate.write_text(legit.replace("mask=mask), 0.0)", "mask=mask), 0.5)"))
    assert candidate.read_text() != legit
    code, stdout, stderr, _ = timed("verify", "--task", RELU, "--candidate", str(candidate))
    assert code == 1, stderr
    said = stdout + stderr
    assert said.count("MISMATCH") == 1, said
    assert said.count("elements (") == 1 and said.count("max abs err") == 1, said


def test_the_first_hour_on_the_embedded_default(tmp_path: Path) -> None:
    """A run given up on (`--timeout`), a run, then `health`, `replay --view metrics` and
    `report`, as a new user tries them, on one data dir's embedded server."""
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    slow = slow_script(tmp_path, 60, "designer")
    code, _, stderr, _ = timed(
        "run", RELU, "--llm", f"scripted:{slow}", "--timeout", "3", "--task-id", "gave-up", env=env
    )
    assert code == 3, stderr

    # The next run is not told of the task the first one cancelled.
    code, stdout, stderr, _ = timed("run", RELU, "--llm", SCRIPT, "--task-id", "t1", env=env)
    assert code == 0, stderr
    assert "gave-up" not in stderr and "note:" not in stderr, stderr
    assert "replay:   kernelflow replay t1" in stdout

    # Nothing is wrong with what health was asked: no daemon runs, and none was asked for.
    code, stdout, _, _ = timed("health", env=env)
    assert code == 0, stdout
    assert stdout.startswith("checked: ")
    assert max(len(line) for line in stdout.splitlines()) <= 100
    rows = {tuple(line.split()[:2]): line for line in stdout.splitlines() if line[:1].isalpha()}
    assert "ABSENT" in rows[("daemons", "0")]
    if not Path("/dev/nvidia0").exists():
        assert "ABSENT" in rows[("backend", "cuda")] and "OK" not in rows[("backend", "cuda")]

    # Metrics for a person: dates, durations, rounded numbers, rewards by meaning.
    code, stdout, stderr, _ = timed("replay", "t1", "--view", "metrics", env=env)
    assert code == 0, stderr
    metrics = dict((line[:22].strip(), line[23:]) for line in stdout.split("\n\n")[0].splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+", metrics["submitted_at"])
    # A duration as a person reads one: 2.35s, 16.4s, 1m05s (however loaded the machine).
    duration = r"\d\.\d\ds|\d\d\.\ds|\d+m\d\ds"
    assert re.fullmatch(duration, metrics["wall_s"])
    assert re.fullmatch(duration, metrics["llm_latency_s"])
    assert metrics["llm_calls_by_agent"] == "designer 1, coder 2, conductor 1"
    assert metrics["rewards"].startswith("binary@1 = 1  (passed: 1, else 0)")
    assert "{" not in stdout and "(" not in metrics["verdicts"]

    # The report names each reward by what it means, and says no kernel was timed.
    code, stdout, stderr, _ = timed("report", env=env)
    assert code == 0, stderr
    rewards = stdout.split("Rewards (means of those recorded)", 1)[1].split("\n\n")[0]
    assert "cheat_penalty@1  passed: 1, else 0; 1 less after a reward-hack attempt" in rewards
    assert "no kernel was timed here, so 1 for every pass" in rewards


def test_numbers_in_tables_are_rounded_never_exponents() -> None:
    text = table(["what", "s"], [["tiny", 3.39e-05], ["near a thousand", 999.7], ["some", 0.40113]])
    assert "e-" not in text and "e+" not in text
    assert [line.split()[-1] for line in text.splitlines()[2:]] == ["<0.001", "1000", "0.401"]
