"""Rebuild the precision corpus (``.corpus/``) from ``bench/corpus/manifest.json``.

The manifest names third-party KernelBench solutions by repository, commit and path, each
with its ``backend``: ``triton`` (the default) or ``cuda`` (KernelBench's CUDA format: a
module whose ``ModelNew`` builds its kernels with ``torch.utils.cpp_extension.load_inline``);
nothing fetched is committed. For every entry this script reads the published file at its
commit, applies the entry's extraction (``extract``) and writes the code to
``<out>/kernels/<source>/<id>.py``; it also writes the KernelBench reference problem each
entry solves: ``<out>/problems/<problem_file>`` from the manifest's KernelBench commit, or,
for an entry whose source solved an older revision of the problem set (its
``problem_commit``), ``<out>/problems/@<first 12 digits of that commit>/<problem_file>``.
It also writes the files of KernelBench itself the manifest names (``kernelbench.files``:
its static checker ``src/kernelbench/kernel_static_checker.py``, the prompt examples every
KernelBench prompt shows a model), at the manifest's KernelBench commit, to
``<out>/kernelbench/`` (``src/kernelbench/`` left off their paths).
``<out>/index.json`` lists every entry with the paths of its kernel and problem files
(relative to ``<out>``), its backend, level, problem number and source.

Run from the repository root::

    python bench/corpus/fetch.py [--out .corpus] [--git-dir OWNER/NAME=PATH ...]

``--git-dir`` points a repository at a local git directory (read with
``git --git-dir PATH show COMMIT:PATH``); any other repository is fetched from
``https://github.com/OWNER/NAME`` at the needed commits into ``<out>/.cache/``. A second run
rewrites nothing that is already right, and files the manifest no longer names are removed.
A missing commit, path or extraction target stops the run with one ``error:`` line and exit
status 1.

Extraction kinds (``extract.kind``):

- ``file``: the file, byte for byte;
- ``json``: the string at JSON pointer ``pointer`` (RFC 6901) of a JSON document;
- ``jsonl``: the string at ``field`` (a key, or a JSON pointer when it starts with ``/``) of
  line ``line`` (1-based) of a JSON-lines file;
- ``markdown-block``: the body of fenced code block ``index`` (0-based, counted over the
  blocks whose info string starts with ``lang`` when ``lang`` is given) of a markdown file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
DEFAULT_MANIFEST = HERE / "manifest.json"
BACKENDS = ("triton", "cuda")
KERNELBENCH_SRC = "src/kernelbench/"
ENTRY_ID = re.compile(r"^(?P<source>[a-z0-9][a-z0-9-]*)-L(?P<level>[12])-(?P<problem>\d+)-[a-z]+$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")


class FetchError(Exception):
    """A problem that stops the run; its text is the one line printed."""


def fail(message: str) -> NoReturn:
    raise FetchError(message)


# ------------------------------------------------------------------ git access


class Repos:
    """Git directories per ``owner/name``: given ones, or clones cached under the out dir."""

    def __init__(self, given: dict[str, Path], cache: Path) -> None:
        self.given = given
        self.cache = cache

    def git_dir(self, repo: str) -> Path:
        if repo in self.given:
            return self.given[repo]
        return self.cache / (repo.replace("/", "+") + ".git")

    def ensure(self, repo: str, commits: Iterable[str]) -> None:
        """Make every commit of ``repo`` readable, fetching the missing ones from GitHub."""
        git_dir = self.git_dir(repo)
        if repo in self.given:
            if not git_dir.exists():
                fail(f"--git-dir for {repo} does not exist: {git_dir}")
            for commit in commits:
                if not self.has_commit(git_dir, commit):
                    fail(f"commit {commit} of {repo} is not in {git_dir}")
            return
        if not git_dir.exists():
            git_dir.parent.mkdir(parents=True, exist_ok=True)
            run_git(["init", "--bare", "--quiet", str(git_dir)])
        url = f"https://github.com/{repo}"
        for commit in commits:
            if self.has_commit(git_dir, commit):
                continue
            print(f"  fetching {repo}@{commit[:12]} from {url}", flush=True)
            done = subprocess.run(
                ["git", f"--git-dir={git_dir}", "fetch", "--quiet", "--depth=1", url, commit],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0 or not self.has_commit(git_dir, commit):
                reason = (done.stderr.strip().splitlines() or ["not found"])[-1]
                fail(f"cannot fetch commit {commit} of {repo}: {reason}")
            # A ref keeps the fetched commit from being pruned as unreachable.
            run_git([f"--git-dir={git_dir}", "update-ref", f"refs/corpus/{commit}", commit])

    @staticmethod
    def has_commit(git_dir: Path, commit: str) -> bool:
        done = subprocess.run(
            ["git", f"--git-dir={git_dir}", "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def read(self, repo: str, commit: str, path: str) -> bytes:
        git_dir = self.git_dir(repo)
        done = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            fail(f"{repo}@{commit[:12]} has no file {path}")
        return done.stdout


def run_git(args: list[str]) -> None:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        fail(f"git {' '.join(args)} failed: {done.stderr.strip()}")


# ------------------------------------------------------------------ extraction


def json_pointer(document: Any, pointer: str) -> Any:
    """The value at an RFC 6901 JSON pointer."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        fail(f"JSON pointer must start with '/': {pointer!r}")
    value = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list):
            if not token.isdigit() or int(token) >= len(value):
                fail(f"JSON pointer {pointer!r}: no index {token!r}")
            value = value[int(token)]
        elif isinstance(value, dict):
            if token not in value:
                fail(f"JSON pointer {pointer!r}: no key {token!r}")
            value = value[token]
        else:
            fail(f"JSON pointer {pointer!r}: {token!r} goes below a scalar")
    return value


def markdown_blocks(text: str, lang: str | None) -> list[str]:
    """Bodies of the fenced code blocks of ``text`` (CommonMark fences), in order."""
    blocks: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i].rstrip("\r\n"))
        if not opening:
            i += 1
            continue
        fence = opening.group("fence")
        info = opening.group("info").strip()
        body: list[str] = []
        i += 1
        while i < len(lines):
            closing = FENCE.match(lines[i].rstrip("\r\n"))
            if (
                closing
                and closing.group("fence")[0] == fence[0]
                and len(closing.group("fence")) >= len(fence)
                and not closing.group("info").strip()
            ):
                break
            body.append(lines[i])
            i += 1
        i += 1
        if lang is None or info.split(maxsplit=1)[:1] == [lang]:
            blocks.append("".join(body))
    return blocks


def as_text(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        fail(f"{where} is a {type(value).__name__}, not a string")
    return value.encode("utf-8")


def extract(raw: bytes, spec: dict[str, Any], where: str) -> bytes:
    """Apply one entry's extraction to the published bytes."""
    kind = spec.get("kind")
    if kind == "file":
        return raw
    text = raw.decode("utf-8")
    if kind == "json":
        return as_text(json_pointer(json.loads(text), spec["pointer"]), where)
    if kind == "jsonl":
        lines = text.splitlines()
        number = int(spec["line"])
        if not 1 <= number <= len(lines):
            fail(f"{where} has no line {number}")
        record = json.loads(lines[number - 1])
        field = str(spec["field"])
        pointer = (
            field if field.startswith("/") else "/" + field.replace("~", "~0").replace("/", "~1")
        )
        return as_text(json_pointer(record, pointer), where)
    if kind == "markdown-block":
        blocks = markdown_blocks(text, spec.get("lang"))
        index = int(spec["index"])
        if not 0 <= index < len(blocks):
            fail(f"{where} has no code block {index} (it has {len(blocks)})")
        return blocks[index].encode("utf-8")
    fail(f"{where}: unknown extraction kind {kind!r}")


# ------------------------------------------------------------------ the run


def write(path: Path, data: bytes) -> bool:
    """Write ``data`` unless ``path`` already holds it; whether it wrote."""
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def problem_path(problem_file: str, commit: str, main_commit: str) -> str:
    """Where a problem file lands in the corpus (relative to the out dir)."""
    if commit == main_commit:
        return f"problems/{problem_file}"
    return f"problems/@{commit[:12]}/{problem_file}"


def parse_git_dirs(values: list[str]) -> dict[str, Path]:
    given: dict[str, Path] = {}
    for value in values:
        repo, sep, path = value.partition("=")
        if not sep or repo.count("/") != 1 or not path:
            fail(f"--git-dir wants OWNER/NAME=PATH, got {value!r}")
        given[repo] = Path(path).expanduser()
    return given


def check_entry(entry: dict[str, Any]) -> str:
    """Validate one manifest entry; its source slug."""
    for key in ("id", "repo", "commit", "path", "extract", "level", "problem", "problem_file"):
        if key not in entry:
            fail(f"manifest entry {entry.get('id', '?')} lacks {key!r}")
    match = ENTRY_ID.match(entry["id"])
    if not match:
        fail(f"manifest entry id {entry['id']!r} is not <source>-L<level>-<problem>-<letter>")
    if not re.fullmatch(r"[0-9a-f]{40}", entry["commit"]):
        fail(f"{entry['id']}: commit must be 40 hex digits")
    if entry.get("backend", "triton") not in BACKENDS:
        fail(f"{entry['id']}: backend must be one of {', '.join(BACKENDS)}")
    if not re.fullmatch(r"level[12]/\d+_[^/]+\.py", entry["problem_file"]):
        fail(f"{entry['id']}: bad problem_file {entry['problem_file']!r}")
    return match.group("source")


def build(manifest_path: Path, out: Path, given: dict[str, Path]) -> None:
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"cannot read manifest {manifest_path}: {exc}")
    kernelbench = manifest["kernelbench"]
    entries: list[dict[str, Any]] = manifest["entries"]
    sources = {entry["id"]: check_entry(entry) for entry in entries}
    if len(sources) != len(entries):
        fail("manifest entry ids are not unique")

    needed: dict[str, set[str]] = {kernelbench["repo"]: {kernelbench["commit"]}}
    for entry in entries:
        needed.setdefault(entry["repo"], set()).add(entry["commit"])
        problem_commit = entry.get("problem_commit", kernelbench["commit"])
        needed.setdefault(kernelbench["repo"], set()).add(problem_commit)
    repos = Repos(given, out / ".cache")
    print(f"{len(entries)} entries from {len(needed)} repositories", flush=True)
    for repo in sorted(needed):
        source = given.get(repo, repos.git_dir(repo))
        print(f"repository {repo} ({len(needed[repo])} commits) <- {source}", flush=True)
        repos.ensure(repo, sorted(needed[repo]))

    kept: set[Path] = set()
    written = 0
    files_cache: dict[tuple[str, str, str], bytes] = {}
    for number, entry in enumerate(entries, 1):
        key = (entry["repo"], entry["commit"], entry["path"])
        if key not in files_cache:
            files_cache.clear()  # keep one file in memory
            files_cache[key] = repos.read(*key)
        where = f"{entry['repo']}@{entry['commit'][:12]}:{entry['path']}"
        code = extract(files_cache[key], entry["extract"], where)
        digest = entry.get("sha256")
        if digest and hashlib.sha256(code).hexdigest() != digest:
            fail(f"{entry['id']}: extracted code does not match the manifest's sha256 ({where})")
        target = out / "kernels" / sources[entry["id"]] / f"{entry['id']}.py"
        kept.add(target)
        if write(target, code):
            written += 1
        if number % 50 == 0 or number == len(entries):
            print(f"  kernels: {number}/{len(entries)}", flush=True)

    problems: dict[str, tuple[str, str]] = {}  # corpus path -> (commit, problem_file)
    index: list[dict[str, Any]] = []
    for entry in entries:
        commit = entry.get("problem_commit", kernelbench["commit"])
        problem = problem_path(entry["problem_file"], commit, kernelbench["commit"])
        problems[problem] = (commit, entry["problem_file"])
        index.append(
            {
                "id": entry["id"],
                "source": sources[entry["id"]],
                "backend": entry.get("backend", "triton"),
                "level": entry["level"],
                "problem": entry["problem"],
                "kernel": f"kernels/{sources[entry['id']]}/{entry['id']}.py",
                "problem_source": problem,
            }
        )
    for problem, (commit, name) in sorted(problems.items()):
        data = repos.read(kernelbench["repo"], commit, f"KernelBench/{name}")
        target = out / problem
        kept.add(target)
        if write(target, data):
            written += 1
    print(f"  problems: {len(problems)}", flush=True)
    for name in kernelbench.get("files", []):
        target = out / "kernelbench" / name.removeprefix(KERNELBENCH_SRC)
        kept.add(target)
        if write(target, repos.read(kernelbench["repo"], kernelbench["commit"], name)):
            written += 1
    print(f"  KernelBench's own files: {len(kernelbench.get('files', []))}", flush=True)
    index_path = out / "index.json"
    if write(index_path, (json.dumps(index, indent=1) + "\n").encode("utf-8")):
        written += 1

    removed = 0
    for folder in (out / "kernels", out / "problems", out / "kernelbench"):
        for path in sorted(folder.rglob("*")) if folder.exists() else []:
            if path.is_file() and path not in kept:
                path.unlink()
                removed += 1
    print(f"done: {out} ({written} written, {removed} stale removed)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path(".corpus"), help="corpus folder")
    parser.add_argument(
        "--git-dir",
        action="append",
        default=[],
        metavar="OWNER/NAME=PATH",
        help="read OWNER/NAME from this local git directory instead of GitHub",
    )
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        build(args.manifest, args.out, parse_git_dirs(args.git_dir))
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
