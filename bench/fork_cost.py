"""What finishing a fork costs (docs/workflows.md, "Forking a task").

    python bench/fork_cost.py [--steps 20] [--fork-after 15]

A relu task runs ``--steps`` steps with a scripted model (coder, verifier, coder, ...: the
coder's answers are wrong until its last, each checked by the verifier), then is forked
after step ``--fork-after`` and the fork finished, both with ``kernelflow run`` and
``kernelflow fork`` as installed, on an embedded NATS of their own. From the log it counts
each task's LLM calls and verifications: those the original made after the fork's cut
are what the fork's remaining steps need; anything the fork makes beyond them is work done
again. It prints both tasks' counts and wall times, the fork's share of the original's
work, and the ratio that is held to at most 5 %: the work the fork made again over the
original's. Exit 1 when it is above, or either task did not succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kernelflow.events.model import Event, LLMCalled, VerificationCompleted
from kernelflow.offline.files import file_events

REPO = Path(__file__).resolve().parent.parent
RELU = REPO / "examples" / "tasks" / "relu.py"
SCRIPT = REPO / "examples" / "scripted" / "relu.yaml"
KERNELFLOW = [sys.executable, "-m", "kernelflow"]
LIMIT = 0.05


def workflow(steps: int) -> str:
    """Coder and verifier in turn, no LLM between them, for at most ``steps`` steps."""
    return yaml.safe_dump(
        {
            "agent_info": {
                "coder": {
                    "possible_next_agent": ["verifier"],
                    "output_format": {
                        "parser_name": "coder_parser",
                        "parser_definition": {
                            "output_fields": {
                                "code": {"field_type": "str", "mandatory": True},
                            }
                        },
                    },
                },
                "verifier": {"possible_next_agent": ["finish", "coder"]},
            },
            "start_agent": "coder",
            "limitation_info": {"required": {"max_step": steps}},
        }
    )


def script(answers: int) -> str:
    """The coder's answers: wrong (the grid misses the last block) but for the last."""
    wrong, right = (e["text"] for e in yaml.safe_load(SCRIPT.read_text())["coder"][:2])
    texts = [wrong.replace("with a", f"(attempt {n}) with a") for n in range(1, answers)]
    return yaml.safe_dump({"coder": [{"text": t} for t in [*texts, right]]})


def cli(*args: str, env: dict[str, str]) -> tuple[dict[str, object], float]:
    started = time.perf_counter()
    done = subprocess.run([*KERNELFLOW, *args, "--json"], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"kernelflow {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1]), wall


def events_of(task_id: str, env: dict[str, str], where: Path) -> list[Event]:
    out = where / f"{task_id}.jsonl"
    subprocess.run(
        [*KERNELFLOW, "log", "export", task_id, "--out", str(out)],
        env=env,
        check=True,
        capture_output=True,
    )
    return [e for _, e in file_events(out)]


def work(events: list[Event]) -> tuple[int, int]:
    """LLM calls and verifications among ``events``."""
    return (
        sum(isinstance(e, LLMCalled) for e in events),
        sum(isinstance(e, VerificationCompleted) for e in events),
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="steps of the original (even)")
    p.add_argument("--fork-after", type=int, default=15, help="the step the fork starts after")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-fork-cost-") as tmp:
        where = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
        env["KF_DATA_DIR"] = str(where / "data")
        (where / "flow.yaml").write_text(workflow(args.steps))
        (where / "coder.yaml").write_text(script(args.steps // 2))
        model = f"scripted:{where / 'coder.yaml'}"
        out = ["--out", str(where / "runs")]
        flow = str(where / "flow.yaml")
        original, original_s = cli(
            "run", str(RELU), "--workflow", flow, "--llm", model, *out, env=env
        )
        task_id = str(original["task_id"])
        forked, fork_s = cli(
            "fork", task_id, "--after-step", str(args.fork_after), "--llm", model, *out, env=env
        )
        before = events_of(task_id, env, where)
        after = events_of(str(forked["task_id"]), env, where)
    at = int(str(forked["at"]))
    total = work(before)
    needed = work(before[at:])  # what the original did after the cut: the fork's steps
    made = work(after[at:])
    again = sum(made) - sum(needed)
    ratio = again / sum(total)
    print(f"original {task_id}: {original['steps']} steps, {total[0]} LLM calls, "
          f"{total[1]} verifications, {original_s:.1f}s wall ({original['status']})")  # fmt: skip
    print(f"fork {forked['task_id']} after step {args.fork_after} (event {at}): "
          f"{made[0]} LLM calls, {made[1]} verifications made, {needed[0]} and {needed[1]} "
          f"needed; {fork_s:.1f}s wall ({forked['status']})")  # fmt: skip
    print(f"the fork's share of the original's work: {sum(made) / sum(total):.0%}; "
          f"its wall time over the original's: {fork_s / original_s:.2f}")  # fmt: skip
    print(f"work made again / the original's: {again}/{sum(total)} = {ratio:.1%} "
          f"(at most {LIMIT:.0%})")  # fmt: skip
    succeeded = original["status"] == forked["status"] == "success"
    return 0 if ratio <= LIMIT and succeeded and made == needed else 1


if __name__ == "__main__":
    sys.exit(main())
