"""Nothing to read, nowhere to send: what a candidate (and an agent tool's command) can
reach of the machine it runs on.

Secrets are planted for real: a mode-0600 file in root's home, the JetStream stores of this
daemon's data dir and of another one, the work dirs of other sandboxes, a process whose
command line holds a NATS password, a token in the daemon's environment, a TCP server on
the loopback standing in for NATS. The hostile candidates of examples/candidates/hostile/
then go looking, with the static gate off, through the real verifier (warm process and
fresh process) and through the ``python`` tool's sandbox; none may find anything, and no
secret may appear anywhere in what comes back. The same again as a daemon without any
privilege (user namespaces only), and where nothing can isolate a candidate: refused
unless the operator opts in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from kernelflow.sandbox import probe as sandbox_probe
from kernelflow.sandbox.process import sandbox_env
from kernelflow.tools import ToolLimits, run_sandboxed
from kernelflow.verification.engine import VerifierConfig, shutdown_warm_processes, verify

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "examples" / "candidates" / "hostile"
RELU_TASK = (ROOT / "examples" / "tasks" / "relu.py").read_text()
THIEVES = [
    "read_secrets",
    "read_data_stores",
    "read_proc",
    "read_environment",
    "read_other_sandboxes",
    "publish_nats",
]
GATE_OFF = VerifierConfig(trials=1, timeout_s=120.0, static_gate=False, shapes=({},))
TOOL = ToolLimits(timeout_s=120.0, max_output_chars=20_000, memory_mb=4096)
# Run a candidate file as a tool's script: build the model and call it once.
RUN_MODEL = "\n\nimport torch\nprint(ModelNew()(torch.randn(4, 40)).shape)\n"
NOT_ROOT = 4242  # the user of the unprivileged daemons below


def expectation(path: Path) -> str:
    match = re.match(r"# expect: (\w+)", path.read_text())
    assert match, f"{path} has no '# expect:' header"
    return match.group(1)


# --------------------------------------------------------------------------- the secrets


@dataclass(eq=False)  # hashed by identity: a key of _without_namespaces' cache
class Planted:
    token: str  # in every secret file, the stores, the daemon's environment
    password: str  # in the NATS URL on a process's command line
    shadow: str  # the first line of /etc/shadow: what a thief would take
    port: int  # the loopback "NATS" server
    connections: list[str] = field(default_factory=list)
    cleanup: list[Path] = field(default_factory=list)

    def leaked(self, text: str) -> list[str]:
        found = [s for s in (self.token, self.password) if s in text]
        if self.shadow and self.shadow in text:
            found.append("the first line of /etc/shadow")
        return found

    def source(self, name: str) -> str:
        return (HOSTILE / f"{name}.py").read_text().replace("PORT = 4222", f"PORT = {self.port}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _store(root: Path, token: str) -> None:
    """A JetStream store as nats-server lays it out, one message holding ``token``."""
    block = root / "jetstream" / "$G" / "streams" / "KF_EVENTS" / "msgs" / "1.blk"
    _write(block, f'\x16\x00kf.events.task_submitted{{"task": "{token}"}}')


def _serve(server: socket.socket, connections: list[str]) -> None:
    while True:
        try:
            conn, peer = server.accept()
        except OSError:
            return
        connections.append(str(peer))
        conn.close()


@pytest.fixture(scope="module")
def planted() -> Iterator[Planted]:
    tag = secrets.token_hex(6)
    shadow = ""
    with open("/etc/shadow") as fh:  # as root: the test process may read it
        shadow = fh.readline().strip()
    server = socket.create_server(("127.0.0.1", 0))
    found = Planted(
        token=f"KFSECRET-{tag}",
        password=f"SECRETPASS{tag}",
        shadow=shadow,
        port=server.getsockname()[1],
    )
    threading.Thread(target=_serve, args=(server, found.connections), daemon=True).start()
    tmp = Path(tempfile.gettempdir())
    home_secret = Path.home() / f".kf-test-secret-{tag}"
    _write(home_secret, f"ANTHROPIC_API_KEY={found.token}\n", 0o600)
    data_dir = Path(f"/opt/kf-test-data-{tag}")  # a visible place: hidden by name only
    _store(data_dir / "nats", found.token)
    other_data = Path(f"/var/lib/kf-test-other-{tag}")
    _store(other_data / "nats", found.token)
    others = [tmp / f"kf-verify-{tag}x", tmp / f"kf-tool-{tag}x", tmp / f"kf-nats-{tag}x"]
    _write(others[0] / "candidate.py", f"# {found.token}\n")
    _write(others[1] / "main.py", f"# {found.token}\n")
    _store(others[2], found.token)
    found.cleanup = [home_secret, data_dir, other_data, *others]
    url = f"nats://kf:{found.password}@127.0.0.1:{found.port}"
    sleeper = subprocess.Popen([url, "600"], executable=shutil.which("sleep"))
    saved = {k: os.environ.get(k) for k in ("KF_DATA_DIR", "KF_TEST_TOKEN")}
    os.environ["KF_DATA_DIR"] = str(data_dir)
    os.environ["KF_TEST_TOKEN"] = found.token
    shutdown_warm_processes()  # the next warm process starts with this environment
    try:
        yield found
    finally:
        shutdown_warm_processes()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sleeper.kill()
        sleeper.wait()
        server.close()
        for path in found.cleanup:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _serialized(report: object) -> str:
    return msgspec.json.encode(report).decode()


# --------------------------------------------------------------------------- the verifier


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
@pytest.mark.parametrize("name", THIEVES)
def test_a_hostile_candidate_finds_nothing(planted: Planted, name: str, warm: bool) -> None:
    report = verify(
        RELU_TASK, planted.source(name), config=dataclasses.replace(GATE_OFF, warm=warm)
    )
    text = _serialized(report)
    assert planted.leaked(text) == [], text
    assert planted.connections == [], "a candidate reached the loopback server"
    assert report.verdict == expectation(HOSTILE / f"{name}.py"), (report.summary, report.errors)


SURVEY = """
import errno, json, os, socket

here = os.getcwd()
assert (os.getuid(), os.geteuid(), os.getgid()) == (65534, 65534, 65534), os.getuid()
status = open("/proc/self/status").read()
assert "CapEff:\\t0000000000000000" in status and "CapBnd:\\t0000000000000000" in status
assert "NoNewPrivs:\\t1" in status
for name in ("/etc/shadow", "/etc/gshadow"):
    try:
        data = open(name).read()
    except OSError:
        data = ""
    assert data == "", name
for path in PATHS:  # gone, or masked: an empty directory or file in its place
    if os.path.isdir(path):
        assert os.listdir(path) == [], "visible: " + path
    else:
        assert not os.path.exists(path) or os.path.getsize(path) == 0, "visible: " + path
for home in ("/root", "/home"):
    for root, dirs, files in os.walk(home):
        assert not files, (root, files)  # only the way to what Python needs, bound back
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))]
pids = [p for p in os.listdir("/proc") if p.isdigit()]
assert str(SLEEPER) not in pids, "another process is visible"
for pid in pids:
    for what in ("cmdline", "environ"):
        try:
            data = open(f"/proc/{pid}/{what}", "rb").read().decode("latin-1")
        except OSError:
            continue
        assert PASSWORD not in data and TOKEN not in data, (pid, what)
assert TOKEN not in json.dumps(dict(os.environ)), "the daemon's environment leaked"
for tmp in filter(os.path.isdir, {"/tmp", "/var/tmp", "/dev/shm", os.path.dirname(here)}):
    others = [
        n for n in os.listdir(tmp)
        if n.startswith("kf-") and not (here + "/").startswith(os.path.join(tmp, n) + "/")
    ]
    assert others == [], (tmp, others)
for path in ("/tmp/kf-escape", "/etc/kf-escape", os.path.dirname(here) + "/kf-escape"):
    try:
        open(path, "w").close()
        raise AssertionError("writable: " + path)
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM), (path, exc)
with open("inside.txt", "w") as fh:
    fh.write("the work dir stays writable")
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    raise AssertionError("connected to the loopback server")
except OSError:
    pass
"""


def survey(planted: Planted, sleeper_pid: int) -> str:
    """Assertions on what the sandbox sees, as a script."""
    paths = [str(p) for p in planted.cleanup]
    return (
        f"PATHS = {paths!r}\nSLEEPER = {sleeper_pid}\nPASSWORD = {planted.password!r}\n"
        f"TOKEN = {planted.token!r}\nPORT = {planted.port}\n" + SURVEY
    )


def _sleeper_pid(planted: Planted) -> int:
    out = subprocess.run(["pgrep", "-f", planted.password], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def candidate_running(script: str) -> str:
    """A correct ReLU candidate whose forward first runs ``script``."""
    body = "\n".join("        " + line for line in script.strip().splitlines())
    solution = (ROOT / "examples" / "candidates" / "solutions" / "relu.py").read_text()
    marker = "        x = x.contiguous()\n"
    return solution.replace(marker, f"{body}\n{marker}", 1)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "fresh"])
def test_what_a_candidate_sees(planted: Planted, warm: bool) -> None:
    source = candidate_running(survey(planted, _sleeper_pid(planted)))
    report = verify(RELU_TASK, source, config=dataclasses.replace(GATE_OFF, warm=warm))
    assert report.verdict == "pass", (report.summary, report.errors)
    assert planted.leaked(_serialized(report)) == []


# --------------------------------------------------------------------------- the tools


def _tool(script: str) -> tuple[int | None, str]:
    async def run() -> tuple[int | None, str]:
        result = await run_sandboxed(
            [sys.executable, "-I", "main.py"], TOOL, files={"main.py": script}
        )
        return result.returncode, result.output

    return asyncio.run(run())


@pytest.mark.parametrize("name", THIEVES)
def test_a_hostile_command_finds_nothing(planted: Planted, name: str) -> None:
    code, output = _tool(planted.source(name) + RUN_MODEL)
    assert planted.leaked(output) == [], output
    assert planted.connections == []
    assert code == 0, output


def test_what_a_command_sees(planted: Planted) -> None:
    code, output = _tool(survey(planted, _sleeper_pid(planted)))
    assert code == 0, output
    assert planted.leaked(output) == []


# --------------------------------------------------------------------------- the pieces


def test_the_sandbox_environment_is_minimal(planted: Planted) -> None:
    env = sandbox_env("/tmp/somewhere")
    assert planted.token not in json.dumps(env)
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "KF_SANDBOX_HIDE", "KF_SANDBOX_ALLOW_NETWORK"}
    allowed |= {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"}
    allowed |= {"TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH", "OMP_NUM_THREADS"}
    assert set(env) <= allowed, set(env) - allowed
    assert env["HOME"] == env["TMPDIR"] == "/tmp/somewhere"
    hidden = env["KF_SANDBOX_HIDE"].split(os.pathsep)
    assert os.environ["KF_DATA_DIR"] in hidden and str(Path.home()) in hidden


def test_the_view_hides_parents_first_and_keeps_what_python_needs() -> None:
    from kernelflow.sandbox.view import plan_view

    plan = plan_view(
        "/tmp/kf-verify-1",
        keep=["/root/py/lib", "/root/py", "/opt/app"],
        hide=["/root", "/root/secret", "/tmp", "/etc/shadow", "/nonexistent/x"],
    )
    assert [(op.path, op.kind) for op in plan] == [
        ("/dev/shm", "shm"),
        ("/etc/shadow", "mask"),
        ("/nonexistent/x", "mask"),
        ("/root", "mask"),
        ("/root/py", "keep"),  # /root/py/lib inside it, /root/secret hidden already
        ("/tmp", "mask"),
        ("/tmp/kf-verify-1", "work"),
    ]


# --------------------------------------------------------------------------- no privileges

# Runs CODE as user NOT_ROOT with no capability, like the systemd unit's non-root daemon:
# a user namespace mapping every id (written by this root parent) in which the Python of
# /root is made readable to that user, then setuid. With NO_USERNS, that namespace
# allows no user namespace below it: nothing can isolate a candidate there.
HARNESS = """
import ctypes, json, os, sys
args = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)

def mount(source, target, fstype, flags, data=None):
    rc = libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                    ctypes.c_ulong(flags), data and data.encode())
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mount " + target)

ready_r, ready_w = os.pipe()
unshared_r, unshared_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(ready_w)
    if libc.unshare(0x10000000 | 0x00020000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    os.write(unshared_w, b"u")
    if os.read(ready_r, 1) != b"x":
        os._exit(3)
    if args["no_userns"]:
        with open("/proc/sys/user/max_user_namespaces", "w") as fh:
            fh.write("0")
    mount(None, "/", None, 0x4000 | 0x40000)
    pyenv = os.open(args["python_root"], os.O_PATH)
    mount("tmpfs", "/root", "tmpfs", 0, "mode=755")
    os.makedirs(args["python_root"], 0o755)
    mount(f"/proc/self/fd/{pyenv}", args["python_root"], None, 0x1000 | 0x4000)
    os.setgroups([])
    os.setgid(args["uid"])
    os.setuid(args["uid"])
    os.chdir("/tmp")
    os.execve(sys.executable, [sys.executable, "-c", args["code"], args["payload"]], args["env"])
os.close(ready_r)
os.close(unshared_w)
assert os.read(unshared_r, 1) == b"u"
for kind in ("uid", "gid"):
    with open(f"/proc/{pid}/{kind}_map", "w") as fh:
        fh.write("0 0 4294967295")
os.write(ready_w, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""

DAEMON = """
import asyncio, json, sys
from concurrent.futures import ThreadPoolExecutor
import msgspec
from kernelflow.sandbox import sandbox_plan, network_prefixes, warm_sandbox_plan
from kernelflow.tools import ToolError, ToolLimits, run_sandboxed
from kernelflow.verification.engine import CHILD_MODULE, VerifierConfig, verify

job = json.loads(sys.argv[1])
out = {}
def said(plan):
    return {"fs": plan.fs_isolation, "prefixes": [list(p) for p in network_prefixes()],
            **{key: getattr(plan, name, None) for key, name in [
                ("network", "network_isolated"), ("refusal", "refusal"),
                ("notes", "notes"), ("isolation", "isolation")]}}
out["plan"] = said(sandbox_plan(sys.executable, "cpu", 4096, CHILD_MODULE))
# A warm process's sandboxes, probed in its forks.
out["warm plan"] = said(warm_sandbox_plan(sys.executable, "cpu", None, CHILD_MODULE, 4096))
limits = ToolLimits(timeout_s=120.0, max_output_chars=20000, memory_mb=4096)

async def tool(source):
    try:
        result = await run_sandboxed([sys.executable, "-I", "main.py"], limits,
                                     files={"main.py": source + job["run_model"]})
    except ToolError as exc:
        return {"error": str(exc)}
    return {"code": result.returncode, "output": result.output}

def check(name, source):
    got = {}
    for warm in (True, False):
        config = VerifierConfig(trials=1, timeout_s=120.0, static_gate=False, shapes=({},),
                                warm=warm, memory_mb=4096)
        report = verify(job["task"], source, config=config)
        how = "warm" if warm else "fresh"
        got[f"{name} {how}"] = msgspec.json.decode(msgspec.json.encode(report))
    got[f"{name} tool"] = asyncio.run(tool(source))
    return got

# Side by side, as a daemon's verifier pool runs them (each sandbox alone all the same).
with ThreadPoolExecutor(max_workers=4) as pool:
    for got in pool.map(check, job["candidates"], job["candidates"].values()):
        out.update(got)
print("RESULT " + json.dumps(out))
"""


def _python_root() -> str:
    """The directory holding this Python's install (made readable to NOT_ROOT)."""
    real = Path(sys.base_prefix).resolve()
    if not real.is_relative_to("/root"):
        return ""
    return str(Path("/root", real.relative_to("/root").parts[0]))


def as_unprivileged_daemon(
    planted: Planted, candidates: dict[str, str], *, no_userns: bool, allow: bool = False
) -> dict[str, object]:
    """Run the verifier and the python tool on ``candidates`` in a daemon process of user
    NOT_ROOT without capabilities; what it got."""
    if os.geteuid() != 0:
        pytest.skip("needs root to set the unprivileged daemon up")
    home = Path(tempfile.mkdtemp(prefix="kf-test-home-"))
    data = Path(f"/opt/kf-test-data-{secrets.token_hex(4)}")
    try:
        _write(home / ".config" / "kernelflow" / "llm.yaml", f"api_key: {planted.token}\n", 0o600)
        _store(data / "nats", planted.token)
        for path in (home, data):
            for root, dirs, files in os.walk(path):
                for name in [*dirs, *files]:
                    os.chown(os.path.join(root, name), NOT_ROOT, NOT_ROOT)
            os.chown(path, NOT_ROOT, NOT_ROOT)
            path.chmod(0o700)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "KF_DATA_DIR": str(data),
            "KF_TEST_TOKEN": planted.token,
            "LANG": "C.UTF-8",
        }
        if "PYTHONPATH" in os.environ:  # the kernelflow under test, if not the installed one
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if allow:
            env["KF_SANDBOX_ALLOW_NETWORK"] = "1"
        job = {"task": RELU_TASK, "candidates": candidates, "run_model": RUN_MODEL}
        args = {
            "no_userns": no_userns,
            "python_root": _python_root() or "/root",
            "uid": NOT_ROOT,
            "code": DAEMON,
            "payload": json.dumps(job),
            "env": env,
        }
        done = subprocess.run(
            [sys.executable, "-c", HARNESS, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        result: dict[str, object] = json.loads(line[len("RESULT ") :])
        # Probed in fresh processes or in a warm process's forks, the machine is the same.
        assert result.pop("warm plan") == result["plan"], result
        return result
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def test_a_daemon_without_privileges_isolates_with_user_namespaces(planted: Planted) -> None:
    """The systemd unit's daemon runs as its own user: the candidate then shares that
    user's id, so only the sandbox's view keeps the daemon's home and data from it."""
    if subprocess.run(["unshare", "--user", "true"], check=False).returncode != 0:
        pytest.skip("user namespaces are not allowed here")
    names = ["read_secrets", "read_data_stores", "read_proc", "publish_nats"]
    candidates = {name: planted.source(name) for name in names}
    candidates["survey"] = survey(planted, _sleeper_pid(planted))
    candidates["survey"] = candidate_running(candidates["survey"])
    result = as_unprivileged_daemon(planted, candidates, no_userns=False)
    text = json.dumps(result)
    assert planted.leaked(text) == [], text
    assert planted.connections == []
    plan = result.pop("plan")
    assert isinstance(plan, dict) and plan["fs"] and plan["network"], plan
    assert plan["refusal"] is None and plan["notes"] == [], plan
    for what, got in result.items():
        assert isinstance(got, dict)
        if what.endswith(" tool"):
            assert got.get("code") == 0, (what, got)
        else:
            assert got["verdict"] == "pass", (what, got["summary"], got["errors"])


@functools.cache
def _without_namespaces(planted: Planted, allow: bool) -> dict[str, object]:
    """As a daemon that may create no namespace (nor user namespace), with the opt-in
    ``allow`` or not: what the harmless read_environment candidate got."""
    candidates = {"read_environment": planted.source("read_environment")}
    return as_unprivileged_daemon(planted, candidates, no_userns=True, allow=allow)


def test_nothing_runs_unisolated_unless_the_operator_opts_in(planted: Planted) -> None:
    """Where the machine allows no namespace at all (here: a non-root daemon that may not
    create user namespaces), candidates are refused, saying why and how to opt in; with
    KF_SANDBOX_ALLOW_NETWORK=1 they run, and the reports say they were not isolated."""
    refused = _without_namespaces(planted, False)
    plan = refused["plan"]
    assert isinstance(plan, dict) and not plan["fs"] and not plan["network"], plan
    assert "KF_SANDBOX_ALLOW_NETWORK=1" in str(plan["refusal"]), plan
    tool = refused["read_environment tool"]
    assert isinstance(tool, dict) and "unsupported" in tool["error"], tool
    assert "KF_SANDBOX_ALLOW_NETWORK=1" in tool["error"]
    allowed = _without_namespaces(planted, True)
    plan = allowed["plan"]
    assert isinstance(plan, dict) and plan["refusal"] is None
    assert any("NOT isolated" in note for note in plan["notes"]), plan
    tool = allowed["read_environment tool"]
    # It ran, and unisolated it can read what the daemon's user can (here the daemon's own
    # environment, through /proc): what the opt-in accepts.
    assert isinstance(tool, dict) and "code" in tool and "error" not in tool, tool
    assert planted.leaked(json.dumps(refused)) == []


def test_the_verifier_answers_unsupported_where_nothing_isolates(planted: Planted) -> None:
    refused = _without_namespaces(planted, False)
    for how in ("warm", "fresh"):
        report = refused[f"read_environment {how}"]
        assert isinstance(report, dict)
        assert report["verdict"] == "unsupported", report
        assert "KF_SANDBOX_ALLOW_NETWORK=1" in report["summary"]
    allowed = _without_namespaces(planted, True)
    for how in ("warm", "fresh"):
        report = allowed[f"read_environment {how}"]
        assert isinstance(report, dict) and report["verdict"] == "pass", report
        assert any("NOT isolated" in e for e in report["errors"]), report


def test_the_plan_refuses_without_isolation_unless_opted_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KF_SANDBOX_ALLOW_NETWORK", raising=False)
    isolated = sandbox_probe.SandboxPlan((), "as", True, "isolated", network_isolated=True)
    assert isolated.refusal is None and isolated.notes == ()
    bare = sandbox_probe.SandboxPlan((), "as", problem="no namespaces (EPERM)")
    assert bare.refusal is not None and "no namespaces (EPERM)" in bare.refusal
    assert "KF_SANDBOX_ALLOW_NETWORK=1" in bare.refusal
    online = sandbox_probe.SandboxPlan((), "as", True, "isolated", network_isolated=False)
    assert online.refusal is not None and "network" in online.refusal
    monkeypatch.setenv("KF_SANDBOX_ALLOW_NETWORK", "1")
    assert bare.refusal is None and online.refusal is None
    assert "network" in online.notes[0] and "KF_SANDBOX_ALLOW_NETWORK=1" in online.notes[0]


def test_health_shows_the_isolation_and_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelflow.host import health
    from kernelflow.host.settings import Settings

    def status(refusal: str | None, opted_in: bool) -> sandbox_probe.IsolationStatus:
        said = ("network=reachable", "isolation: unavailable: no namespaces (EPERM)")
        return sandbox_probe.IsolationStatus(False, said, opted_in, refusal)

    monkeypatch.delenv("KF_SANDBOX_ALLOW_NETWORK", raising=False)
    report = health.Report()
    health.check_sandbox(report, Settings())
    assert report.checks[0].status == health.OK, report.checks  # this machine isolates
    monkeypatch.setattr(health, "isolation_status", lambda: status("cannot isolate: X", False))
    report = health.Report()
    health.check_sandbox(report, Settings())
    assert report.checks[0].status == health.WARN
    assert "refused (unsupported): cannot isolate: X" in report.checks[0].detail
    monkeypatch.setenv("KF_SANDBOX_ALLOW_NETWORK", "1")
    monkeypatch.setattr(health, "isolation_status", lambda: status(None, True))
    report = health.Report()
    health.check_sandbox(report, Settings())
    assert report.checks[0].status == health.WARN
    assert "NOT isolated" in report.checks[0].detail
    assert "KF_SANDBOX_ALLOW_NETWORK=1" in report.checks[0].detail
    assert report.as_json()["sandbox"]["allow_network"] is True


CONFINE_ONE = """
import json, os, sys, tempfile
from pathlib import Path
from kernelflow.sandbox import confine_candidate, unshare_pid_namespace

work = Path(sys.argv[1])
pid_namespace = sys.argv[2] == "pidns" and unshare_pid_namespace()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    notes = confine_candidate(work, memory_kind="as", memory_mb=2048, allow_network=False)
    seen = {
        "notes": notes,
        "pid": os.getpid(),
        "ids": [os.getuid(), os.geteuid(), os.getgid()],
        "processes": sorted(p for p in os.listdir("/proc") if p.isdigit()),
        "root": sorted(os.listdir("/root")),
        "cwd": os.getcwd(),
    }
    Path("mine.txt").write_text("written")
    os.write(write, json.dumps(seen).encode())
    os._exit(0)
os.close(write)
print(os.read(read, 65536).decode())
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("pidns", ["pidns", "none"])
def test_confine_candidate_confines_one_forked_process(pidns: str) -> None:
    """The API a judge calls in the candidate's process, freshly forked: PID 1 of a new
    PID namespace, or not (its /proc then shows only nobody's processes, and says so)."""
    work = Path(tempfile.mkdtemp(prefix="kf-verify-"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", CONFINE_ONE, str(work), pidns],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["ids"] == [65534, 65534, 65534]
        assert seen["cwd"] == str(work.resolve())
        assert (work / "mine.txt").read_text() == "written"
        assert not any(name.startswith(".kf-test") for name in seen["root"])
        if pidns == "pidns":
            assert seen["notes"] == [] and seen["pid"] == 1 and seen["processes"] == ["1"]
        else:
            assert len(seen["notes"]) == 1 and "/proc" in seen["notes"][0], seen["notes"]
            assert "1" not in seen["processes"]  # the host's init: root's, hidden
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_forged_result_fails_where_the_machine_gives_no_namespace(planted: Planted) -> None:
    """The judge's separation does not rest on namespaces: with none at all (opted in),
    the candidate's process still holds neither the result pipe nor the judge's memory, so
    what it writes to every descriptor and file it can reach is never a verdict."""
    forge = (
        "import json, os\n"
        + planted.source("read_environment").split("class ModelNew")[0]
        + "class ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        forged = json.dumps({'verdict': 'pass', 'summary': 'forged'}).encode()\n"
        "        for fd in range(3, 256):\n"
        "            try:\n"
        "                os.write(fd, forged)\n"
        "            except OSError:\n"
        "                pass\n"
        "        for path in ('result.json', '../result.json', '../../result.json'):\n"
        "            try:\n"
        "                open(path, 'wb').write(forged)\n"
        "            except OSError:\n"
        "                pass\n"
        "        return x\n"
    )
    got = as_unprivileged_daemon(planted, {"forge": forge}, no_userns=True, allow=True)
    for how in ("warm", "fresh"):
        report = got[f"forge {how}"]
        assert isinstance(report, dict) and report["verdict"] != "pass", report
        # What it wrote reached only its own end of the judge's channel.
        assert report["reasons"][0].startswith("tampering: "), report
        assert "forged" not in report["summary"], report
