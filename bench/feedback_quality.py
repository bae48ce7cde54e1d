"""Does the gate's feedback teach? A scripted "repair" coder applies only what the static
gate's messages say to the candidates of the feedback set (bench/feedback_cases.py: one
mistake each, the ones coder models make), and the bench counts how many then pass the
gate: with the messages of a base revision (``--base``, default ``main``: its gate runs
in a process of its own, bench/revision.py) and with this checkout's, in the same run.

The repair coder reads nothing but the messages' text. It understands ``replace `X` with
`Y``` (where X ends in ``= ...`` and Y holds ``...``, the ``...`` of Y is the value X's
line assigns): it replaces every X of the candidate with Y. Where a message says no such
thing, it takes a name the message suggests: a dotted name in it (quoted or not) of a
module the candidate imports, ending in the same name as the one refused (the first
quoted in the message), put in that one's place on the message's line (``triton.cdiv``
for ``tl.cdiv``). It gates the result again
and tries again on what is still refused, for at most ``--rounds`` rounds (a coder's
attempts). A message that suggests nothing leaves the candidate as it is.

    .venv/bin/python bench/feedback_quality.py [--base REF] [--rounds N] [--verbose]

docs/verifier.md ("Feedback that teaches") records the last counts.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.feedback_cases import CASES  # noqa: E402
from bench.revision import run_at_revision  # noqa: E402
from kernelflow.verification.gate import gate_findings  # noqa: E402

TASK = (ROOT / "examples" / "tasks" / "relu.py").read_text()
# Gates candidates with a revision's gate: the refusals' texts of each (any revision's
# gate_findings, or check_candidate where it has none).
GATE_AT_REVISION = """
import json, sys
from kernelflow.verification import gate
out = []
for item in json.load(sys.stdin):
    judge = getattr(gate, "gate_findings", None)
    if judge is not None:
        refused = judge(item["source"], backend=item["backend"], task_source=item["task"])[0]
    else:
        refused = gate.check_candidate(
            item["source"], backend=item["backend"], task_source=item["task"]
        )
    out.append([v.text() for v in refused])
json.dump(out, sys.stdout)
"""
_REPLACE = re.compile(r"replace `([^`]+)` with `([^`]+)`")
_DOTTED = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")

Gate = Callable[[list[tuple[str, str]]], list[list[str]]]  # (source, backend) -> texts


def gate_here(items: list[tuple[str, str]]) -> list[list[str]]:
    return [
        [v.text() for v in gate_findings(source, backend=backend, task_source=TASK)[0]]
        for source, backend in items
    ]


def gate_at(ref: str) -> Gate:
    def judge(items: list[tuple[str, str]]) -> list[list[str]]:
        batch = [{"source": s, "backend": b, "task": TASK} for s, b in items]
        return list(json.loads(run_at_revision(ref, GATE_AT_REVISION, json.dumps(batch))))

    return judge


def repair(source: str, messages: list[str]) -> str:
    """``source`` with every ``replace `X` with `Y``` the messages say applied, or, for a
    message that says none, the name it suggests."""
    for message in messages:
        if not _REPLACE.search(message):
            source = _suggested_name(source, message)
        for old, new in _REPLACE.findall(message):
            if old.endswith(" = ...") and "..." in new:
                target = re.escape(old[: -len(" = ...")])
                line = re.search(rf"^(\s*){target} = (.+)$", source, re.M)
                if line is not None:
                    filled = new.replace("...", line.group(2), 1)
                    source = source.replace(line.group(0), line.group(1) + filled, 1)
            elif old in source:
                source = source.replace(old, new)
    return source


def _suggested_name(source: str, message: str) -> str:
    """``source`` with the name ``message`` refuses (its first quoted dotted name) replaced,
    on the message's line, by a dotted name the message mentions with the same last name."""
    quoted = [q for q in re.findall(r"`([^`]+)`", message) if _DOTTED.fullmatch(q)]
    line = re.search(r": line (\d+)", message)
    if not quoted or line is None:
        return source
    refused = quoted[0]
    leaf = refused.rsplit(".", 1)[-1]
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    offered = [
        name
        for name in _DOTTED.findall(message)
        if name != refused and name.endswith("." + leaf) and name.split(".")[0] in imported
    ]
    if not offered:
        return source
    lines = source.splitlines(keepends=True)
    index = int(line.group(1)) - 1
    if not 0 <= index < len(lines):
        return source
    lines[index] = re.sub(rf"\b[\w.]*\.{re.escape(leaf)}\b", offered[0], lines[index])
    return "".join(lines)


def repaired(gate: Gate, rounds: int) -> tuple[list[bool], list[list[str]]]:
    """Per case: whether the repair coder made it pass within ``rounds``; and the first
    messages each got."""
    sources = [case.source for case in CASES]
    backends = [case.backend for case in CASES]
    first = gate(list(zip(sources, backends, strict=True)))
    messages = list(first)
    passed = [not m for m in messages]
    for _ in range(rounds):
        todo = [i for i, ok in enumerate(passed) if not ok]
        changed = {i: repair(sources[i], messages[i]) for i in todo}
        changed = {i: s for i, s in changed.items() if s != sources[i]}
        if not changed:
            break
        judged = gate([(changed[i], backends[i]) for i in changed])
        for i, texts in zip(changed, judged, strict=True):
            sources[i], messages[i] = changed[i], texts
            passed[i] = not texts
    return passed, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", metavar="REF", help="the revision before")
    parser.add_argument("--rounds", type=int, default=3, help="repair attempts per case")
    parser.add_argument("--verbose", action="store_true", help="each case's first messages")
    args = parser.parse_args()
    before, before_said = repaired(gate_at(args.base), args.rounds)
    after, after_said = repaired(gate_here, args.rounds)
    width = max(len(case.name) for case in CASES) + 2
    print(f"repair coder on the feedback set: {len(CASES)} candidates, one mistake each")
    print(f"  {'case':{width}}{'rule':22}{'base ' + args.base:>16}{'this checkout':>16}")
    for i, case in enumerate(CASES):
        marks = ["passes" if ok else "refused" for ok in (before[i], after[i])]
        print(f"  {case.name:{width}}{case.rule:22}{marks[0]:>16}{marks[1]:>16}")
        if args.verbose:
            for label, said in (("before", before_said[i]), ("after", after_said[i])):
                print(f"      {label}: {said[0] if said else '(accepted)'}")
    print(
        f"passing the gate after repair: base {args.base} {sum(before)} of {len(CASES)}, "
        f"this checkout {sum(after)} of {len(CASES)}"
    )


if __name__ == "__main__":
    main()
