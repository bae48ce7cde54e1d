"""The sandbox's file system: read-only for the candidate everywhere but its work dir.

The static gate refuses file access it can see; these tests turn it off and check that the
write itself fails at runtime (EROFS), leaves nothing behind, and that the verifier keeps
serving. Where the machine forbids mount namespaces the plan records it and the tests of
the isolation itself are skipped; the fallback has tests of its own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.sandbox import filesystem
from kernelflow.sandbox import probe as sandbox_probe
from kernelflow.verification import engine
from kernelflow.verification.engine import (
    CHILD_MODULE,
    VerifierConfig,
    _sandbox_plan,
    detect_device,
    verify,
)
from kernelflow.verification.gate import check_candidate

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = ROOT / "examples" / "candidates"
RELU_TASK = (ROOT / "examples" / "tasks" / "relu.py").read_text()
SOLUTION = (CANDIDATES / "solutions" / "relu.py").read_text()
GATE_OFF = VerifierConfig(trials=1, timeout_s=60.0, static_gate=False, shapes=({},))


@pytest.fixture
def isolated() -> None:
    plan = _sandbox_plan(GATE_OFF, detect_device())
    if not plan.fs_isolation:
        pytest.skip(f"file-system isolation is unavailable here: {plan.filesystem}")


def candidate(forward_body: str) -> str:
    """A correct ReLU candidate whose forward first runs ``forward_body``."""
    body = "\n".join("        " + line for line in forward_body.strip().splitlines())
    return SOLUTION.replace(
        "        x = x.contiguous()\n", f"{body}\n        x = x.contiguous()\n", 1
    )


# --------------------------------------------------------------------------- hostile


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
@pytest.mark.parametrize(
    ("name", "marker"),
    [("write_outside", "kf-hostile-marker"), ("write_outside_init", "kf-hostile-init-marker")],
)
def test_write_outside_fails_at_runtime(isolated: None, name: str, marker: str, warm: bool) -> None:
    source = (CANDIDATES / "hostile" / f"{name}.py").read_text()
    # The sandbox's work dir is made in this temp dir; the candidate aims at its parent.
    target = Path(tempfile.gettempdir(), marker)
    target.unlink(missing_ok=True)
    config = dataclasses.replace(GATE_OFF, warm=warm)
    report = verify(RELU_TASK, source, config=config)
    assert report.verdict == "rejected_runtime", (report.summary, report.errors)
    assert report.reasons[0].startswith("filesystem:"), report.reasons
    assert "Read-only file system" in report.reasons[0]
    assert not target.exists(), "the hostile candidate's file appeared outside the sandbox"
    # The verifier keeps serving: a correct candidate passes right after.
    ok = verify(RELU_TASK, SOLUTION, config=config)
    assert ok.verdict == "pass", (ok.summary, ok.errors)


def test_write_outside_is_also_refused_statically() -> None:
    rules = {
        v.rule for v in check_candidate((CANDIDATES / "hostile" / "write_outside.py").read_text())
    }
    assert "introspection" in rules  # open()
    init = check_candidate((CANDIDATES / "hostile" / "write_outside_init.py").read_text())
    assert [v.rule for v in init] == ["file_io"], init


# --------------------------------------------------------------------------- what stays usable


def test_only_the_work_dir_and_a_private_shm_are_writable(isolated: None) -> None:
    shm = Path("/dev/shm/kf-sandbox-private-test")
    shm.unlink(missing_ok=True)
    body = f"""
import errno, os, tempfile

def refused(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
    except OSError as exc:  # read-only, or hidden altogether
        return exc.errno in (errno.EROFS, errno.ENOENT)
    return False

here = os.getcwd()
outside = [{str(ROOT / "kf-escape")!r}, "/tmp/kf-escape", "/var/tmp/kf-escape",
           "/etc/kf-escape", os.path.dirname(here) + "/kf-escape"]
for path in outside:
    assert refused(path), "writable: " + path
assert os.environ["HOME"] == os.environ["TMPDIR"] == here
with open("inside.txt", "w") as fh:
    fh.write("ok")
with tempfile.NamedTemporaryFile() as fh:
    fh.write(b"x")
    assert fh.name.startswith(here + "/"), fh.name
assert os.environ["TRITON_CACHE_DIR"].startswith(here + "/")
with open({str(shm)!r}, "w") as fh:
    fh.write("private")
"""
    report = verify(RELU_TASK, candidate(body), config=GATE_OFF)
    assert report.verdict == "pass", (report.summary, report.errors)
    assert not any("file-system isolation" in e for e in report.errors)
    assert not shm.exists(), "the sandbox's /dev/shm is not private"
    # Nothing of the sandbox's mounts propagated to this (the host's) mount namespace.
    assert "kf-verify-" not in Path("/proc/self/mountinfo").read_text()


def test_candidate_cannot_undo_the_read_only_mounts(isolated: None) -> None:
    """Not by remounting, nor from a new user namespace of its own (where it would hold
    every capability): the mounts it inherits there stay locked read-only."""
    body = """
import ctypes, errno, os

libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND, CLONE_NEWNS, CLONE_NEWUSER = 0x20, 0x1000, 0x20000, 0x10000000

def remount_rw():
    return libc.mount(None, b"/", None, ctypes.c_ulong(MS_REMOUNT | MS_BIND), None) == 0

assert not remount_rw(), "remounted / read-write"
assert libc.unshare(CLONE_NEWNS) != 0, "made a mount namespace of its own"
pid = os.fork()
if pid == 0:
    code = 0
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
        code = 3 if remount_rw() else 0
        try:
            open(os.path.dirname(os.getcwd()) + "/kf-userns-escape", "w").close()
            code = 4
        except OSError:
            pass
    os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
"""
    report = verify(RELU_TASK, candidate(body), config=GATE_OFF)
    assert report.verdict == "pass", (report.summary, report.errors)
    assert not Path(tempfile.gettempdir(), "kf-userns-escape").exists()


# --------------------------------------------------------------------------- fallback


def test_plan_falls_back_when_mount_namespaces_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where the ``fs`` probe fails: the plan says so and refuses candidates
    (``plan.refusal``) unless the operator opts in; opted in, verification still works,
    and each report carries the plan's note that the candidate is not isolated."""
    real = sandbox_probe.run_quiet

    def no_mount_namespaces(
        cmd: list[str],
        timeout: float,
        env: dict[str, str] | None = None,
        failed: list[str] | None = None,
    ) -> str | None:
        if cmd[-1] != "fs":
            return real(cmd, timeout, env, failed)
        if failed is not None:
            failed.append("isolation: unavailable: no namespaces (mount: EPERM)\n")
        return None

    monkeypatch.setattr(sandbox_probe, "run_quiet", no_mount_namespaces)
    monkeypatch.delenv("KF_SANDBOX_ALLOW_NETWORK", raising=False)
    plan = sandbox_probe.sandbox_plan.__wrapped__(
        sys.executable, detect_device(), 4096, CHILD_MODULE
    )
    assert not plan.fs_isolation
    assert plan.filesystem.startswith("not isolated")
    assert plan.refusal is not None and "no namespaces (mount: EPERM)" in plan.refusal
    monkeypatch.setenv("KF_SANDBOX_ALLOW_NETWORK", "1")
    assert plan.refusal is None and plan.notes
    monkeypatch.setattr(engine, "_sandbox_plan", lambda *args: plan)
    report = verify(RELU_TASK, SOLUTION, config=VerifierConfig(trials=1, shapes=({},)))
    assert report.verdict == "pass", (report.summary, report.errors)
    assert any(e in report.errors for e in plan.notes), report.errors
    assert any("NOT isolated" in e for e in report.errors), report.errors


def _stdlib_python_for_nobody() -> str:
    """A Python that user ``nobody`` can run (the sandbox module needs only the stdlib)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"):
        pytest.skip("needs root, setpriv and unshare")
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        ok = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", path, "-c", "0"],
            capture_output=True,
            check=False,
        )
        if ok.returncode == 0:
            return path
    pytest.skip("no Python that `nobody` can run")


ISOLATE = """
import ctypes
import importlib.util
import os
import sys
from pathlib import Path


def load(name):
    # From the sandbox package's files: this Python has no kernelflow installed.
    path = Path({where!r}, name + ".py")
    spec = importlib.util.spec_from_file_location("kernelflow.sandbox." + name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


limits = load("limits")
filesystem = load("filesystem")
work = Path({work!r})
# What the sandbox's view starts with: a mount namespace, everything read-only but work.
if limits.libc().unshare(0x00020000) != 0:  # CLONE_NEWNS
    print("unavailable: unshare(CLONE_NEWNS):", os.strerror(ctypes.get_errno()))
    raise SystemExit(0)
left = filesystem.make_read_only(work)
limits.drop_capabilities()
(work / "inside").write_text("x")
try:
    (work.parent / "kf-userns-outside").write_text("x")
    print("outside writable")
except OSError as exc:
    print("isolated", exc.errno, left)
"""


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="kf-fs-test-"))
    work.chmod(0o777)
    yield work
    shutil.rmtree(work, ignore_errors=True)
    Path(work.parent, "kf-userns-outside").unlink(missing_ok=True)


def _isolate_as_nobody(python: str, work: Path, *prefix: str) -> str:
    script = ISOLATE.format(where=str(Path(filesystem.__file__).parent), work=str(work))
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*as_nobody, *prefix, python, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_isolation_fails_cleanly_without_privileges(nobody_dir: Path) -> None:
    """An unprivileged process may not make a mount namespace: unshare refuses (the probe
    then falls back) before anything is half-isolated."""
    python = _stdlib_python_for_nobody()
    said = _isolate_as_nobody(python, nobody_dir)
    assert said.startswith("unavailable: ") and "unshare" in said, said


def test_isolation_works_inside_an_unprivileged_user_namespace(nobody_dir: Path) -> None:
    """The path a non-root daemon takes (``unshare --net --map-root-user``): the inherited
    mounts are locked there, and the read-only remount must keep their flags."""
    python = _stdlib_python_for_nobody()
    if subprocess.run(["unshare", "--user", "true"], check=False).returncode != 0:
        pytest.skip("user namespaces are not allowed here")
    said = _isolate_as_nobody(python, nobody_dir, "unshare", "--net", "--map-root-user")
    assert said.startswith("isolated 30"), said  # EROFS
    assert (nobody_dir / "inside").exists()
    assert not (nobody_dir.parent / "kf-userns-outside").exists()
