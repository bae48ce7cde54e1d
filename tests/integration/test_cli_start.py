"""The CLI starts at once: ``kernelflow --version`` and ``--help`` import no command (no
torch, no NATS, no actors), and a command imports only its own module. Its time against
``python -c pass`` is bench/cli_start.py's to measure; here, what makes it fast."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from kernelflow.cli.main import COMMANDS, build_parser, command_module
from tests.conftest import REPO

HEAVY = ("torch", "nats", "msgspec", "kernelflow.actors", "kernelflow.verification")
PROBE = """
import json, sys
from kernelflow.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def modules_after(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["--version"], ["--help"], [], ["nonsense"]])
def test_version_and_help_import_no_command(args: list[str]) -> None:
    loaded = modules_after(*args)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
    assert heavy == []
    assert not [m for m in loaded if m.startswith("kernelflow.cli.commands.")]


def test_a_command_imports_its_own_module_only() -> None:
    loaded = modules_after("schema", "--help")
    commands = {m for m in loaded if m.startswith("kernelflow.cli.commands.")}
    assert "kernelflow.cli.commands.schema" in commands
    assert (
        "kernelflow.cli.commands.run" not in commands
        and "kernelflow.cli.commands.ui" not in commands
    )


def test_the_help_lines_are_the_commands_own() -> None:
    for name, (_, line) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        command_module(name).register(parser.add_subparsers())
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        own = {action.dest: action.help for action in sub._choices_actions}
        assert own.get(name) == line, name
    # Every command any module registers is listed.
    full = build_parser(["--help"])
    (sub,) = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(COMMANDS)


def test_a_misspelt_command_gets_the_one_meant() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernelflow", "stauts"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 2
    assert "did you mean 'status'" in done.stderr
