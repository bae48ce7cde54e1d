"""The container files of deploy/: Dockerfiles, the compose file and the Kubernetes
manifests. No Docker engine here, so they are checked as far as can be without one: the
manifests against Kubernetes' API schemas, the compose file against the Compose
Specification's, the Dockerfiles read statically; every kernelflow command they run is
parsed by kernelflow's own CLI parser and every KF_ variable they set is one kernelflow
reads; and the NATS configurations they mount run on the real nats-server (the
StatefulSet's as a 3-node cluster that refuses a node without the route password)."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kernelflow.cli.main import build_parser
from kernelflow.host.settings import Settings
from tests.conftest import REPO, run_cli

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
NATS_SERVER = Path(sys.executable).parent / "nats-server"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The Kubernetes versions the manifests are for: the oldest with every field they use
# (a container's appArmorProfile), and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())


def manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def compose() -> dict[str, Any]:
    return interpolated(yaml.safe_load(COMPOSE.read_text()))


def interpolated(value: Any) -> Any:
    """Compose's ``${NAME:-default}`` and ``${NAME}`` as with nothing set."""
    if isinstance(value, str):
        return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
    if isinstance(value, list):
        return [interpolated(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolated(v) for k, v in value.items()}
    return value


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in manifests():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield name, doc["spec"]["template"]["spec"]


def config_maps() -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["data"] for _, d in manifests() if d["kind"] == "ConfigMap"}


def is_kernelflow(image: str) -> bool:
    return image.split(":")[0].rsplit("/", 1)[-1] == "kernelflow"


def kernelflow_commands() -> list[tuple[str, list[str], dict[str, str | None]]]:
    """Every kernelflow command the files run: where, its arguments, its environment (a
    value from a Secret or the pod as None)."""
    found = []
    for service, spec in compose()["services"].items():
        if is_kernelflow(spec["image"]):
            env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
            found.append((f"compose:{service}", spec["command"], dict(env)))
    maps = config_maps()
    for name, pod in pod_specs():
        for c in pod["containers"]:
            if is_kernelflow(c["image"]):
                assert "command" not in c, f"{name}: the image's entrypoint is kernelflow"
                env: dict[str, str | None] = {}
                for source in c.get("envFrom", []):
                    env.update(maps[source["configMapRef"]["name"]])
                env.update({e["name"]: e.get("value") for e in c.get("env", [])})
                found.append((f"k8s:{name}", c["args"], env))
    return found


@functools.cache
def known_variables() -> set[str]:
    """The KF_ variables kernelflow reads: the names its source spells out in full."""
    names: set[str] = set()
    for folder in ("kernelflow", "events", "actors", "projections", "workflows"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and re.fullmatch(r"KF_[A-Z0-9_]*[A-Z0-9]", node.value)
                ):
                    names.add(node.value)
    return names


@pytest.mark.parametrize("name,doc", manifests(), ids=[n for n, _ in manifests()])
def test_each_kubernetes_manifest_validates_against_the_api_schema(
    name: str, doc: dict[str, Any]
) -> None:
    for version in K8S_VERSIONS:
        # strict: a misspelt or misplaced field is an error, not ignored.
        kubernetes_validate.validate(doc, version, strict=True)
    if doc["kind"] != "Namespace":
        assert doc["metadata"]["namespace"] == "kernelflow", name


def test_the_manifests_refer_to_what_exists_and_the_docs_make_every_secret() -> None:
    docs = (REPO / "docs" / "containers.md").read_text()
    maps = config_maps()
    labels = [pod_labels for pod_labels in _pod_labels()]
    secrets: set[str] = set()
    for name, pod in pod_specs():
        ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
        for c in pod["containers"]:
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] in maps, name
            for e in c.get("env", []):
                if "secretKeyRef" in (e.get("valueFrom") or {}):
                    secrets.add(e["valueFrom"]["secretKeyRef"]["name"])
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in ports, (name, probe)
        for volume in pod.get("volumes", []):
            sources = volume.get("projected", {}).get("sources", [volume])
            for s in sources:
                if "configMap" in s:
                    assert s["configMap"]["name"] in maps, name
                if "secret" in s:
                    secrets.add(s["secret"].get("secretName") or s["secret"]["name"])
    for secret in secrets:
        assert f"kubectl -n kernelflow create secret generic {secret} " in docs, secret
    # Each pod's KF_NATS_CREDS is a key of the Secret mounted there, as the docs make it.
    for name, pod in pod_specs():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            creds = next(
                (e["value"] for e in c.get("env", []) if e["name"] == "KF_NATS_CREDS"), None
            )
            if creds is None:
                continue
            folder, key = creds.rsplit("/", 1)
            (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
            secret = volumes[mount["name"]]["secret"]["secretName"]
            assert f"create secret generic {secret} --from-file={key}\n" in docs, (name, creds)
    for name, doc in manifests():
        if doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
            assert any(selector.items() <= pod.items() for pod in labels), name
        if doc["kind"] in ("Deployment", "StatefulSet"):
            template = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= template.items(), name


def _pod_labels() -> Iterator[dict[str, str]]:
    for _, doc in manifests():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["spec"]["template"]["metadata"]["labels"]


def test_the_compose_file_validates_against_the_compose_specification() -> None:
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    spec = compose()
    jsonschema.Draft7Validator(schema).validate(spec)
    for service in spec["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and not source.startswith("./secrets/"):
                assert (DEPLOY / source).is_file(), volume
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert context == REPO and (context / service["build"]["dockerfile"]).is_file()
    # The credentials it mounts are made into deploy/secrets/, which git ignores.
    for secret in spec["secrets"].values():
        assert secret["file"].startswith("./secrets/"), secret
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "deploy/secrets/daemon.nk"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0, "deploy/secrets/ must not be committed"


@pytest.mark.parametrize(
    "where,args,env", kernelflow_commands(), ids=[w for w, _, _ in kernelflow_commands()]
)
def test_each_command_and_its_environment_are_kernelflows(
    where: str, args: list[str], env: dict[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arguments parse with kernelflow's own parser, as ``kernelflow ARGS`` would, and
    every KF_ variable is one kernelflow reads, with a value its settings accept."""
    parser = build_parser(args)
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{where}: `kernelflow {shlex.join(args)}` does not parse (exit {exc.code})")
    unknown = {k for k in env if k.startswith("KF_")} - known_variables()
    assert not unknown, f"{where}: kernelflow reads no {sorted(unknown)}"
    for key in [k for k in os.environ if k.startswith("KF_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("KF_") and value is not None:
            monkeypatch.setenv(key, value)
    Settings()  # raises SettingsError on a value it does not accept


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order: continuation lines joined, comments out."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#") or (not text and not current):
            continue
        if text.endswith("\\"):
            current += text[:-1] + " "
            continue
        op, _, rest = (current + text).partition(" ")
        instructions.append((op.upper(), " ".join(rest.split())))
        current = ""
    return instructions


def with_args(text: str, instructions: list[tuple[str, str]]) -> str:
    """``text`` with ``${NAME}`` of the file's ARGs replaced by their defaults."""
    defaults = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), text)


@pytest.mark.parametrize(
    "name,extras",
    # What the commands each image runs need: the verifier, metrics (--metrics-port), the
    # dashboard (ui) and its plots (report); CuPy kernels on GPU verifier nodes.
    [
        ("Dockerfile", {"verifier", "observability", "ui", "report"}),
        ("Dockerfile.cuda", {"verifier", "cupy", "observability"}),
    ],
)
def test_the_dockerfiles_build_kernelflow_from_the_repository(name: str, extras: set[str]) -> None:
    path = DEPLOY / "docker" / name
    steps = dockerfile(path)
    ops = [op for op, _ in steps]
    assert ops[0] == "FROM" and ops.count("FROM") == 1
    image = steps[0][1].split()[0]
    repo, _, tag = image.partition(":")
    assert repo and re.search(r"\d", tag) and tag != "latest", f"{name}: pin {image} by tag"
    # Everything it copies is in the repository, and sent in the build context.
    ignore = (path.parent / f"{name}.dockerignore").read_text().splitlines()
    for op, args in steps:
        if op == "COPY":
            sources = [a for a in shlex.split(args) if not a.startswith("--")][:-1]
            for source in sources:
                assert (REPO / source).exists(), f"{name}: COPY {source}: not in the repository"
                assert f"!{source}" in ignore, f"{name}: {source} is not in the build context"
    # pip installs this checkout with the extras asked for, which pyproject defines.
    (install,) = [with_args(a, steps) for op, a in steps if op == "RUN" and "pip install" in a]
    (spec,) = re.findall(r"\"\.\[([\w,]+)\]\"", install)
    assert extras <= set(spec.split(",")), install
    assert set(spec.split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])
    # The `cpp` (and on GPUs `cuda`) backend builds extensions with the system's g++.
    packages = " ".join(a for op, a in steps if op == "RUN" and "apt-get install" in a)
    assert re.search(r"\bg\+\+", packages), f"{name}: no C++ compiler for load_inline"
    cpu = "-c constraints/cpu.txt" in install
    assert cpu == (name == "Dockerfile"), f"{name}: torch's CPU build only in the CPU image"
    # It runs kernelflow's console script, as a user that is not root.
    (entrypoint,) = [json.loads(a) for op, a in steps if op == "ENTRYPOINT"]
    assert entrypoint == ["kernelflow"] and "kernelflow" in PYPROJECT["project"]["scripts"]
    assert [a for op, a in steps if op == "USER"] == ["kernelflow"]


def test_kernelflow_images_carry_the_projects_version() -> None:
    version = PYPROJECT["project"]["version"]
    images = [s["image"] for s in compose()["services"].values()]
    images += [c["image"] for _, pod in pod_specs() for c in pod["containers"]]
    ours = [i for i in images if is_kernelflow(i)]
    assert ours and all(i.split(":")[1].startswith(version) for i in ours), ours


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replaced(text: str, old: str, new: str) -> str:
    assert old in text, f"the configuration no longer holds {old!r}: update this test"
    return text.replace(old, new)


def users_file(tmp_path: Path) -> Path:
    users = tmp_path / "nats-users.conf"
    made = run_cli(
        "creds", "daemon", "--new", "--out", str(tmp_path / "daemon.nk"), "--users-file", str(users)
    )
    assert made.returncode == 0, made.stderr
    return users


def test_the_compose_nats_reads_its_mounted_configuration(tmp_path: Path) -> None:
    """The files compose mounts, where it mounts them: nats-server accepts the whole."""
    nats = compose()["services"]["nats"]
    assert nats["entrypoint"] == ["nats-server"]
    root = tmp_path / "container"
    host_files = {"./secrets/nats-users.conf": users_file(tmp_path)}
    for volume in nats["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            (root / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(host_files.get(source, DEPLOY / source), root / target.lstrip("/"))
    args = [str(root / a.lstrip("/")) if a.startswith("/etc/") else a for a in nats["command"]]
    checked = subprocess.run([NATS_SERVER, "-t", *args], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def statefulset_container(name: str) -> dict[str, Any]:
    (sts,) = [d for _, d in manifests() if d["kind"] == "StatefulSet"]
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return container


@contextlib.contextmanager
def nats_node(
    tmp_path: Path, node: int, ports: dict[str, int], routes: list[int], password: str
) -> Iterator[subprocess.Popen[bytes]]:
    """One pod of the StatefulSet, on loopback: its ConfigMap and users file side by side
    (the projected volume), its args as Kubernetes expands them."""
    container = statefulset_container("nats")
    conf = config_maps()["nats-config"]["nats.conf"]
    conf = replaced(conf, "listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{ports['client']}")
    conf = replaced(conf, "listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{ports['cluster']}")
    conf = replaced(conf, "http: 127.0.0.1:8222", f"http: 127.0.0.1:{ports['http']}")
    conf = replaced(conf, 'store_dir: "/data"', f'store_dir: "{tmp_path / f"data-{node}"}"')
    etc = tmp_path / f"etc-{node}"
    etc.mkdir()
    (etc / "nats.conf").write_text(conf)
    shutil.copy(tmp_path / "nats-users.conf", etc / "nats-users.conf")
    args = [a.replace("$(ROUTE_PASSWORD)", password) for a in container["args"]]
    args = [replaced(a, "/etc/nats", str(etc)) if a.startswith("/etc/nats") else a for a in args]
    for i, port in enumerate(routes):
        args = [a.replace(f"nats-{i}.nats-cluster:6222", f"127.0.0.1:{port}") for a in args]
    env = {"POD_NAME": f"nats-{node}", "ROUTE_PASSWORD": password}
    log = (tmp_path / f"nats-{node}.log").open("wb")
    with log, subprocess.Popen(container["command"] + args, env=env, stdout=log, stderr=log,
                               executable=NATS_SERVER) as server:  # fmt: skip
        try:
            yield server
        finally:
            server.terminate()
            server.wait(30)


def monitoring(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
        return dict(json.load(answer))


def wait_until(check: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, KeyError, TypeError):
            if check():
                return
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_the_nats_statefulset_forms_a_jetstream_cluster_that_refuses_strangers(
    tmp_path: Path,
) -> None:
    users_file(tmp_path)
    ports = [{k: free_port() for k in ("client", "cluster", "http")} for _ in range(3)]
    routes = [p["cluster"] for p in ports]
    with contextlib.ExitStack() as nodes:
        for node in range(3):
            nodes.enter_context(nats_node(tmp_path, node, ports[node], routes, "s3cret"))

        def cluster_formed() -> bool:
            meta = monitoring(ports[0]["http"], "/jsz")["meta_cluster"]
            return bool(meta["cluster_size"] == 3 and meta.get("leader"))

        wait_until(cluster_formed, "the three nodes did not form a JetStream cluster")
        # Clients need a key of the users file.
        with socket.create_connection(("127.0.0.1", ports[0]["client"]), timeout=5) as s:
            info = json.loads(s.recv(65536).decode().removeprefix("INFO "))
        assert info["auth_required"] is True
        # A node that does not know the route password is not let in as a peer.
        stranger = {k: free_port() for k in ("client", "cluster", "http")}
        with nats_node(tmp_path, 3, stranger, routes[:1], "guessed"):
            log = tmp_path / "nats-3.log"
            wait_until(lambda: b"Authorization Violation" in log.read_bytes(), log.name)
            peers = {r["remote_name"] for r in monitoring(ports[0]["http"], "/routez")["routes"]}
            assert peers == {"nats-1", "nats-2"}
