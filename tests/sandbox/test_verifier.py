"""The verifier against the real sandbox and real (interpreted, on CPU) Triton."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.actors.verifier import Verifier
from kernelflow.events.model import VerificationReport
from kernelflow.sandbox import probe as sandbox_probe
from kernelflow.sandbox import warm as sandbox_warm
from kernelflow.sandbox.probe import probed_once
from kernelflow.sandbox.workdirs import remove_abandoned_workdirs
from kernelflow.verification.engine import (
    CHILD_MODULE,
    VerifierConfig,
    _sandbox_plan,
    detect_device,
    shutdown_warm_processes,
    verify,
)
from tests.conftest import alive, marked, wait_until_unmarked

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
SCRIPTED = ROOT / "examples" / "scripted"
EXAMPLES = ["relu", "row_softmax", "sum_rows"]

QUICK = VerifierConfig(trials=1, timeout_s=60.0, static_gate=False, shapes=({},))

RELU_TASK = (TASKS / "relu.py").read_text()

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The fenced code blocks of a scripted LLM response (the real parser lives elsewhere)."""
    return [m.group(1) for m in _FENCE.finditer(text)]


def scripted(name: str) -> dict[str, list[dict[str, object]]]:
    return yaml.safe_load((SCRIPTED / f"{name}.yaml").read_text())


KERNEL = (
    "import triton\nimport triton.language as tl\n\n"
    "@triton.jit\n"
    "def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
    "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    "    m = offs < n\n"
    "    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)\n\n"
    "def relu_k(x, out=None):\n"
    "    y = torch.empty_like(x) if out is None else out\n"
    "    _relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n"
    "    return y\n"
)


def candidate(forward_body: str, prelude: str = "") -> str:
    """A small ModelNew for the ReLU task whose forward runs ``forward_body``; ``relu_k(x)``
    (a real Triton kernel) is available to it."""
    body = "\n".join("        " + line for line in forward_body.strip().splitlines())
    return (
        "import torch\nimport torch.nn as nn\n"
        f"{KERNEL}\n{prelude}\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "    def forward(self, x):\n"
        f"{body}\n"
    )


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", EXAMPLES)
def test_scripted_example_is_well_formed(name: str) -> None:
    doc = scripted(name)
    assert len(doc["designer"]) == 1 and python_blocks(str(doc["designer"][0]["text"]))
    assert len(doc["coder"]) == 2
    for response in doc["coder"]:
        assert len(python_blocks(str(response["text"]))) == 1
    decision = json.loads(str(doc["conductor"][0]["text"]))
    assert decision["decision"] == "coder" and decision["error_and_suggestion"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_second_coder_answer_passes(name: str) -> None:
    code = python_blocks(str(scripted(name)["coder"][1]["text"]))[0]
    report = verify((TASKS / f"{name}.py").read_text(), code)
    assert report.verdict == "pass", (report.summary, report.errors)
    assert report.trials == 3
    assert report.backend == "triton"
    assert report.device == detect_device()
    assert report.max_abs_err is not None and report.max_abs_err < 1e-3
    if report.device == "cpu":
        assert report.speedup is None  # interpreted Triton: no timing meaning
    assert report.duration_s > 0


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("relu", "differ from the reference"),
        ("row_softmax", "differ from the reference"),
        ("sum_rows", "shape mismatch"),
    ],
)
def test_first_coder_answer_fails_with_feedback(name: str, expect: str) -> None:
    code = python_blocks(str(scripted(name)["coder"][0]["text"]))[0]
    report = verify((TASKS / f"{name}.py").read_text(), code)
    assert report.verdict == "mismatch", (report.summary, report.errors)
    assert expect in report.summary
    assert report.errors
    if expect.startswith("differ"):
        # Unwritten outputs read as poisoned NaN, or as wrong finite values.
        assert (report.max_abs_err or 0.0) > 1e-4 or "NaN" in report.summary
        assert 1 <= len(report.mismatches) <= 5
        assert re.match(r"output\[\d+, \d+\]: expected \S+, got \S+", report.mismatches[0])
    else:
        assert "(16,)" in report.summary and "(16, 1)" in report.summary


# --------------------------------------------------------------------------- failures


def test_syntax_error_is_error_without_sandbox() -> None:
    report = verify(RELU_TASK, "class ModelNew(nn.Module:\n    pass\n")
    assert report.verdict == "compile_error"
    assert "not valid Python" in report.summary and "line 1" in report.summary


def test_missing_modelnew_is_error() -> None:
    report = verify(RELU_TASK, "import torch\nclass Model:\n    pass\n")
    assert report.verdict == "compile_error" and "ModelNew" in report.summary


def test_a_bad_task_is_the_task_s_fault_not_the_candidate_s() -> None:
    report = verify("import torch\n", candidate("return x"))
    assert report.verdict == "task_error" and report.fault == "task"
    assert "get_inputs" in report.summary


def test_exception_in_forward_gives_trimmed_traceback() -> None:
    report = verify(RELU_TASK, candidate("return helper_that_does_not_exist(x)"), config=QUICK)
    assert report.verdict == "runtime_error"
    assert "NameError" in report.summary
    text = "\n".join(report.errors)
    assert 'File "candidate.py"' in text  # paths are relative to the sandbox dir
    assert "kf-verify-" not in text
    assert len(report.errors) == 1
    assert len(text.splitlines()) <= 31


def test_triton_interpreter_error_points_at_kernel_line() -> None:
    prelude = (
        "import triton\nimport triton.language as tl\n\n"
        "@triton.jit\n"
        "def bad_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    x = tl.load(x_ptr + offs, mask=offs < n)\n"
        "    tl.store(y_ptr + offs, tl.maximum(x, undefined_zero), mask=offs < n)\n"
    )
    body = (
        "y = torch.empty_like(x)\n"
        "bad_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n"
        "return y"
    )
    report = verify(RELU_TASK, candidate(body, prelude), config=QUICK)
    assert report.verdict == "runtime_error"
    text = "\n".join(report.errors)
    assert "undefined_zero" in text
    if report.device == "cpu":
        assert re.search(r"candidate.py\", line \d+, in bad_kernel", text)


def test_wrong_shape_fails_naming_shape() -> None:
    report = verify(RELU_TASK, candidate("return relu_k(x)[:, :-1]"), config=QUICK)
    assert report.verdict == "mismatch"
    assert "shape" in report.summary and "(16, 1000)" in report.summary
    assert "(16, 999)" in report.summary


def test_wrong_dtype_fails() -> None:
    report = verify(RELU_TASK, candidate("return relu_k(x).double()"), config=QUICK)
    assert report.verdict == "mismatch" and "dtype" in report.summary


def test_nan_positions_must_match() -> None:
    body = "y = relu_k(x)\ny[0, 0] = float('nan')\nreturn y"
    report = verify(RELU_TASK, candidate(body), config=QUICK)
    assert report.verdict == "mismatch"
    assert "NaN" in report.summary
    assert report.mismatches[0].startswith("output[0, 0]: expected")


def test_input_mutation_fails() -> None:
    report = verify(RELU_TASK, candidate("relu_k(x, out=x)\nreturn x.clone()"), config=QUICK)
    assert report.verdict == "rejected_runtime"
    assert "mutation" in report.summary and "input #0" in report.summary


def sleeper_body(marker: str) -> str:
    """A forward that starts ``sleep MARKER`` and spins: the test finds both on the host
    by the marker (the candidate's own pids are its PID namespace's, not the host's)."""
    return (
        "import os, subprocess\n"
        f"sleeper = subprocess.Popen(['sleep', '{marker}'])\n"
        "print('WORKDIR ' + os.getcwd(), flush=True)\n"
        "while True:\n"
        "    pass"
    )


def host_pids(marker: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """The host pids of the ``sleep MARKER`` a candidate started and of its parent (the
    candidate's process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if entry.name.isdigit() and argv[:2] == [b"sleep", marker.encode()]:
                    stat = (entry / "stat").read_text()
                    return int(entry.name), int(stat.rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no process `sleep {marker}` appeared")


@pytest.mark.parametrize("warm", [True, False])
def test_a_sandbox_runs_candidates_without_torch_dynamo(warm: bool) -> None:
    """torch._dynamo is imported by a sandbox only for a candidate or baseline that
    compiles: importing it is 2+ s of CPU in every warm process or fresh sandbox."""
    body = (
        "y = relu_k(x)\n"
        "import sys\n"
        "assert 'torch._dynamo' not in sys.modules, 'the sandbox imported torch._dynamo'\n"
        "return y"
    )
    config = dataclasses.replace(QUICK, warm=warm)
    report = verify(RELU_TASK, candidate(body), config=config)
    assert report.verdict == "pass", (report.summary, report.errors)


def test_pytorch_compute_through_torch_compile_is_still_caught_at_run_time() -> None:
    body = "fast = torch.compile(lambda t: torch.relu(t) * 1.0, backend='eager')\nreturn fast(x)"
    report = verify(RELU_TASK, candidate(body), config=QUICK)
    assert report.verdict == "rejected_runtime", report.summary
    assert "relu" in report.summary and "mul" in report.summary, report.summary


def test_timeout_kills_process_group() -> None:
    marker = f"{100 + time.time() % 100:.6f}"
    started = time.monotonic()
    found: list[tuple[int, int]] = []

    def find() -> None:  # on a loaded machine a scan of /proc may miss the sleeper's 5 s
        with contextlib.suppress(AssertionError):
            found.append(host_pids(marker, timeout_s=20))

    finder = threading.Thread(target=find)
    finder.start()
    report = verify(
        RELU_TASK,
        candidate(sleeper_body(marker)),
        config=VerifierConfig(trials=1, timeout_s=5.0, static_gate=False),
    )
    elapsed = time.monotonic() - started
    assert report.verdict == "timeout"
    assert "5 s" in report.summary
    assert elapsed < 15
    said = re.search(r"^WORKDIR (.*)$", "\n".join(report.errors), re.M)
    assert said, report.errors  # printed once `sleep MARKER` had started
    wait_until_unmarked(marker, within_s=10)
    assert not marked(marker), "a process started by the candidate survived the timeout"
    finder.join()
    for sleeper, child in found:  # the candidate's own process, where the scan saw it
        deadline = time.monotonic() + 5
        while (alive(child) or alive(sleeper)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "sandbox process survived the timeout"
    assert not Path(said.group(1)).exists(), "sandbox temp dir was not removed"


def test_sandbox_dies_with_a_killed_daemon(tmp_path: Path) -> None:
    """SIGKILL leaves no chance to kill the sandbox: the kernel must do it (PDEATHSIG)."""
    marker = f"{200 + time.time() % 100:.6f}"
    script = (
        "import sys\n"
        "from kernelflow.verification.engine import VerifierConfig, verify\n"
        f"config = VerifierConfig(trials=1, timeout_s=300, static_gate=False)\n"
        f"verify(sys.stdin.read(), {candidate(sleeper_body(marker))!r}, config=config)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    daemon = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, text=True, env=env
    )
    assert daemon.stdin is not None
    daemon.stdin.write(RELU_TASK)
    daemon.stdin.close()
    sleeper, child = host_pids(marker)
    daemon.kill()
    daemon.wait()
    deadline = time.monotonic() + 5
    while (alive(child) or alive(sleeper)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the sandbox outlived the daemon that started it"
    assert not alive(sleeper), "a process the candidate started outlived the daemon"
    # Its work dir stays behind, until a verifier that starts later removes it.
    (left,) = tmp_path.glob("kf-verify-*")
    assert remove_abandoned_workdirs(str(tmp_path), older_than_s=0) == [str(left)]
    assert not left.exists()


def test_only_abandoned_work_dirs_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Daemons share the temp dir: one cleaning up after a crash (verifications', their
    probe's, tools' and the embedded NATS server's dirs) must leave alone the work dirs of
    verifications running elsewhere, fresh ones, links and other files."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    body = (
        "import os, time\nopen('running', 'w').close()\n"
        "while not os.path.exists('go'):\n    time.sleep(0.01)\nreturn relu_k(x)"
    )
    reports: list[VerificationReport] = []
    running = threading.Thread(
        target=lambda: reports.append(verify(RELU_TASK, candidate(body), config=QUICK))
    )
    running.start()
    deadline = time.monotonic() + 60
    while (
        not (found := list(tmp_path.glob("kf-verify-*/candidate/running")))
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert found, "the candidate never ran"
    in_use = found[0].parent.parent

    fresh = tmp_path / "kf-verify-fresh"
    fresh.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("")
    (tmp_path / "kf-verify-link").symlink_to(outside)
    (tmp_path / "kf-verify-file").write_text("")
    old = [tmp_path / f"kf-{kind}-old" for kind in ("verify", "probe", "tool", "nats")]
    for path in old:
        path.mkdir()
        (path / "task.py").write_text("")
    for path in (in_use, fresh, *old, outside):
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    os.utime(fresh, None)

    assert sorted(remove_abandoned_workdirs()) == sorted(map(str, old))
    assert in_use.is_dir() and fresh.is_dir() and (outside / "keep").exists()
    assert (tmp_path / "kf-verify-link").is_symlink()

    (in_use / "candidate" / "go").write_text("")
    running.join(timeout=60)
    assert [r.verdict for r in reports] == ["pass"], reports
    assert not in_use.exists()


def test_segfault_is_error_with_stack() -> None:
    report = verify(
        RELU_TASK, candidate("import ctypes\nctypes.string_at(0)\nreturn x"), config=QUICK
    )
    assert report.verdict == "runtime_error"
    assert "SIGSEGV" in report.summary
    # faulthandler in the child prints where it crashed, in the sandbox-relative file.
    assert re.search(r'File "candidate.py", line \d+ in forward', "\n".join(report.errors))


def test_os_exit_is_error_with_output() -> None:
    report = verify(
        RELU_TASK, candidate("import os\nprint('debug: hello')\nos._exit(3)"), config=QUICK
    )
    assert report.verdict == "runtime_error"
    assert "status 3" in report.summary
    assert "debug: hello" in "\n".join(report.errors)


def test_a_result_the_candidate_writes_is_never_read() -> None:
    """Only the judge's process holds the result pipe: a result.json (or anything else)
    the candidate writes before it exits is not a result."""
    body = (
        "import json, os\n"
        "for where in ('result.json', '../result.json'):\n"
        "    try:\n"
        "        open(where, 'w').write(json.dumps({'verdict': 'pass', 'summary': 'ok'}))\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)"
    )
    report = verify(RELU_TASK, candidate(body), config=QUICK)
    assert report.verdict == "runtime_error", report
    assert "the candidate's process exited with status 0" in report.summary


def test_output_is_bounded() -> None:
    body = "import sys\nsys.stderr.write('x' * 1_000_000)\nsys.stderr.flush()\nos._exit(1)"
    report = verify(
        RELU_TASK,
        candidate(body, "import os"),
        config=VerifierConfig(trials=1, timeout_s=60.0, max_output_bytes=4096, static_gate=False),
    )
    assert report.verdict == "runtime_error"
    assert sum(len(e) for e in report.errors) < 20_000


def test_memory_limit_applies() -> None:
    if _sandbox_plan(VerifierConfig(memory_mb=1024), detect_device()).memory_kind == "none":
        pytest.skip("no memory limit works on this machine")
    body = "big = torch.ones(2 * 1024**3, dtype=torch.uint8)\nreturn relu_k(x)"
    report = verify(
        RELU_TASK, candidate(body), config=VerifierConfig(trials=1, timeout_s=60.0, memory_mb=1024)
    )
    assert report.verdict == "runtime_error", report.summary


def test_network_is_isolated_when_possible() -> None:
    if not _sandbox_plan(QUICK, detect_device()).prefix:
        pytest.skip("network namespaces are not available here")
    body = (
        "import socket\n"
        "names = sorted(name for _, name in socket.if_nameindex())\n"
        "assert names == ['lo'], names\n"
        "return relu_k(x)"
    )
    report = verify(RELU_TASK, candidate(body), config=QUICK)
    assert report.verdict == "pass", (report.summary, report.errors)


def test_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_SECRET_TOKEN", "do-not-leak")
    body = (
        "import os\n"
        "assert 'KF_SECRET_TOKEN' not in os.environ\n"
        "assert os.environ['HOME'] == os.getcwd()\n"
        "return relu_k(x)"
    )
    report = verify(RELU_TASK, candidate(body), config=QUICK)
    assert report.verdict == "pass", (report.summary, report.errors)


# --------------------------------------------------------------------------- backends


def test_cuda_backend_unsupported_without_gpu() -> None:
    if detect_device() == "cuda":
        pytest.skip("this machine has a CUDA GPU")
    code = python_blocks(str(scripted("relu")["coder"][1]["text"]))[0]
    report = verify(RELU_TASK, code, backend="cuda")
    assert report.verdict == "unsupported"
    assert report.summary == "backend 'cuda' is unsupported on this device (no CUDA GPU)"
    assert report.backend == "cuda" and report.device == "cpu"


def test_unknown_backend_unsupported() -> None:
    code = python_blocks(str(scripted("relu")["coder"][1]["text"]))[0]
    report = verify(RELU_TASK, code, backend="metal")
    assert report.verdict == "unsupported" and "metal" in report.summary


def test_detect_device_is_cached() -> None:
    first = detect_device()
    started = time.perf_counter()
    assert detect_device(sys.executable, None) == first in ("cpu", "cuda")
    assert time.perf_counter() - started < 0.2  # a probe starts an interpreter (~1 s)


def stand_in_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_without_gpu_device_files_the_device_is_cpu_without_asking_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = stand_in_python(tmp_path, "echo cuda")  # what torch would say, if asked
    monkeypatch.setattr(sandbox_probe, "GPU_DEVICE_FILES", (str(tmp_path / "nvidiactl"),))
    assert detect_device(python, None) == "cpu"
    (tmp_path / "nvidiactl").touch()
    assert detect_device(python, "0") == "cuda"


# A warm process that answers each probe as the sandbox module would: refused under the
# strongest network isolation (the one whose prefix sets KF_TEST_STRONGEST), whole under
# none; it records what it was asked in the file its argument names.
STAND_IN_WARM_PROCESS = """
import json, os, sys
from pathlib import Path
print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    workdir = Path(job["workdir"])
    with open(sys.argv[1], "a") as asked:
        asked.write(json.dumps([os.environ.get("KF_TEST_STRONGEST"), job.get("probe")]) + "\\n")
    if os.environ.get("KF_TEST_STRONGEST"):
        (workdir / "output.log").write_text("Traceback ...\\nOSError: not under this one\\n")
        print(json.dumps({"outcome": "done", "code": 1}), flush=True)
        continue
    said = "filesystem: read-only\\nisolation: network=isolated\\n" if "fs" in job["probe"] else ""
    (workdir / "probe.out").write_text(said + "ok\\n")
    print(json.dumps({"outcome": "done", "code": 0}), flush=True)
"""


def test_a_warm_processs_sandboxes_are_probed_in_its_forks_and_only_the_plans_process_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each combination of the plan is probed in a sandbox forked from the warm process of
    that network isolation (no fresh interpreter imports torch for it); the process of
    the isolation the plan picks is the one left running for the first candidate."""
    server = tmp_path / "warm.py"
    server.write_text(STAND_IN_WARM_PROCESS)
    asked = tmp_path / "asked.jsonl"
    python = stand_in_python(tmp_path, f"exec {sys.executable} {server} {asked}")
    strongest = ("env", "KF_TEST_STRONGEST=1")
    monkeypatch.setattr(sandbox_probe, "network_prefixes", lambda: (strongest, ()))
    try:
        plan = sandbox_warm.warm_sandbox_plan.__wrapped__(python, "cpu", None, CHILD_MODULE, 4096)
        assert (plan.prefix, plan.memory_kind, plan.fs_isolation) == ((), "as", True)
        assert plan.filesystem == "read-only" and plan.network_isolated
        probes = [json.loads(line) for line in asked.read_text().splitlines()]
        assert probes == [
            ["1", ["cpu", "as", "4096", "fs"]],
            ["1", ["cpu", "as", "4096"]],
            ["1", ["cpu", "none", "4096", "fs"]],
            ["1", ["cpu", "none", "4096"]],
            [None, ["cpu", "as", "4096", "fs"]],
        ]
        ours = {key.prefix: p for key, p in sandbox_warm.WARM_PROCESSES.items() if key[0] == python}
        assert list(ours) == [()] and ours[()].alive()  # the refused one is stopped, not leaked
    finally:
        shutdown_warm_processes()


def test_a_probe_asked_from_many_threads_at_once_runs_once_per_argument_values() -> None:
    calls: list[tuple[str, int]] = []

    @probed_once
    def probe(name: str, size: int = 1) -> str:
        calls.append((name, size))
        time.sleep(0.2)  # long enough for every thread to ask while it runs
        return f"{name}:{size}"

    askers = [
        threading.Thread(target=probe, args=args)
        for args in [("a",), ("a", 1), ("a",), ("b", 2), ("b", 2)]
    ]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert sorted(calls) == [("a", 1), ("b", 2)]
    assert probe("a") == "a:1" and probe(name="b", size=2) == "b:2" and len(calls) == 2


def test_a_verifier_readies_its_sandbox_before_its_first_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probes and the warm process happen as the verifier actor starts; the first
    candidate then runs in that worker with nothing left to start."""
    cold_steps: list[str] = []
    real_worker_init = sandbox_warm.WarmProcess.__init__
    real_run = sandbox_warm.WarmProcess.run

    def worker_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        cold_steps.append("worker")
        real_worker_init(self, *args, **kwargs)

    def run(self, workdir, timeout_s, probe=None):  # type: ignore[no-untyped-def]
        cold_steps.append("job" if probe is None else "probe")
        return real_run(self, workdir, timeout_s, probe)

    monkeypatch.setattr(sandbox_warm.WarmProcess, "__init__", worker_init)
    monkeypatch.setattr(sandbox_warm.WarmProcess, "run", run)
    shutdown_warm_processes()  # whatever earlier tests started
    # A memory limit no other test uses: its sandbox plan is probed afresh.
    config = VerifierConfig(trials=1, timeout_s=60.0, shapes=({},), memory_mb=12_345)
    bridge = MemoryServer().bridge().start()  # the actor is asked directly: the memory log
    verifier = Verifier.start(bridge, config)
    try:
        proxy = verifier.proxy()
        assert proxy.config.get(timeout=120) == config  # answered once on_start is done
        assert "worker" in cold_steps and "probe" in cold_steps
        cold_steps.clear()
        report = proxy.check(RELU_TASK, candidate("return relu_k(x)"), "triton").get(timeout=120)
        assert report.verdict == "pass", report.summary
        assert cold_steps == ["job"]  # nothing started or probed first
    finally:
        verifier.stop()
        bridge.stop()


def test_report_roundtrips_msgspec() -> None:
    import msgspec

    report = verify(RELU_TASK, candidate("return relu_k(x)"), config=QUICK)
    assert report.verdict == "pass"
    data = msgspec.json.encode(report)
    assert msgspec.json.decode(data, type=VerificationReport) == report


def test_a_verifier_pinned_to_a_gpu_shows_its_sandboxes_that_device_only() -> None:
    from kernelflow.sandbox import sandbox_env

    assert sandbox_env("/tmp/w", "3")["CUDA_VISIBLE_DEVICES"] == "3"
    assert "ANTHROPIC_API_KEY" not in sandbox_env("/tmp/w", "3")
    unpinned = sandbox_env("/tmp/w")
    assert unpinned.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
