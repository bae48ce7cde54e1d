"""docs/llm.md, "Serving a model of your own": each server of its table answered by a
local stand-in that takes the fields that server takes and returns what it returns
(tests/fake_llm_servers.py), and the provider's probe of an endpoint before a run."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path

import pytest

from kernelflow.events.model import ChatMessage
from kernelflow.llm import EndpointUnreachable, LLMResponse, make_provider
from kernelflow.llm.base import LLMRequest
from kernelflow.llm.config import LLMConfig
from tests.conftest import EXAMPLES, cli_env, run_cli
from tests.fake_llm_servers import SERVERS, FakeOpenAI, ScriptedAnswers

DOC = Path(__file__).resolve().parents[2] / "docs" / "llm.md"
# The table's server names, as tests/fake_llm_servers.py's SERVERS name them.
STAND_INS = {"vLLM": "vllm", "SGLang": "sglang", "Ollama": "ollama", "llama.cpp": "llama.cpp"}
YES_NO = {"yes": True, "no": False}


def servers_table() -> list[dict[str, str]]:
    """The rows of docs/llm.md's table of servers, by column."""
    text = DOC.read_text(encoding="utf-8").split("## Serving a model of your own", 1)[1]
    table = next(block for block in text.split("\n\n") if block.startswith("|"))
    lines = table.splitlines()
    cells = [[c.strip().strip("`") for c in ln.strip("|").split("|")] for ln in lines]
    header, rows = cells[0], cells[2:]
    return [dict(zip(header, row, strict=True)) for row in rows]


def request() -> LLMRequest:
    return LLMRequest("t", "coder", 0, [ChatMessage(role="user", content="write a kernel")])


def probed_and_answered(spec: str) -> tuple[dict[str, str], LLMResponse]:
    provider = make_provider(spec, LLMConfig())

    async def go() -> tuple[dict[str, str], LLMResponse]:
        return await provider.probe(["coder"], call=True), await provider.complete(request())

    return asyncio.run(go())


def test_the_table_names_every_server_the_stand_ins_know() -> None:
    rows = servers_table()
    assert [STAND_INS[row["server"]] for row in rows] == [s for s in SERVERS if s != "openai"]
    for row in rows:
        make_provider(row["--llm"], LLMConfig())  # each spec as printed is one


@pytest.mark.parametrize("row", servers_table(), ids=lambda row: row["server"])
def test_each_server_gives_what_the_table_says(row: dict[str, str]) -> None:
    served = row["--llm"].partition("#")[2] or "the-one-gguf"
    with FakeOpenAI(lambda _: "x = 1", model=served, server=STAND_INS[row["server"]]) as fake:
        # The spec as printed, on the stand-in's port.
        spec = re.sub(r"http://127\.0\.0\.1:\d+", fake.url, row["--llm"])
        probed, answer = probed_and_answered(spec)
        sent = fake.completions
    assert (answer.token_ids is not None) == YES_NO[row["answer's token ids"]]
    assert (answer.prompt_token_ids is not None) == YES_NO[row["prompt's token ids"]]
    assert (answer.logprobs is not None) == YES_NO[row["log-probabilities"]]
    (said,) = probed.values()
    ids, logprobs = row["answer's token ids"], row["log-probabilities"]
    assert f"token ids: {ids}, log-probabilities: {logprobs}" in said
    # The probe's request and the call's, each taken as sent (none refused and retried).
    assert len(sent) == 2 and all("return_token_ids" in body for body in sent)


def test_a_model_the_server_does_not_serve_is_named_with_the_ones_it_does() -> None:
    with FakeOpenAI(model="qwen2.5-coder:7b", server="ollama") as fake:
        provider = make_provider(f"openai:{fake.url}/v1#qwen2.5-coder:7", LLMConfig())
        with pytest.raises(EndpointUnreachable) as refused:
            asyncio.run(provider.probe(["coder"]))
    assert str(refused.value) == (
        f"LLM openai:{fake.url}/v1#qwen2.5-coder:7: {fake.url}/v1 serves no model "
        "'qwen2.5-coder:7'; did you mean 'qwen2.5-coder:7b'? (it serves: qwen2.5-coder:7b)"
    )


def test_an_endpoint_nothing_answers_at_is_said_with_its_url_and_why() -> None:
    provider = make_provider("openai:http://127.0.0.1:9/v1#qwen", LLMConfig())
    with pytest.raises(EndpointUnreachable) as refused:
        asyncio.run(provider.probe(["coder"]))
    assert str(refused.value) == (
        "LLM openai:http://127.0.0.1:9/v1#qwen: nothing answers at http://127.0.0.1:9/v1 "
        "(connection refused)"
    )


def test_a_provider_without_a_server_has_nothing_to_reach() -> None:
    provider = make_provider("scripted:examples/scripted/relu.yaml", LLMConfig())
    assert asyncio.run(provider.probe(["coder", "designer"])) == {
        "scripted:examples/scripted/relu.yaml": "nothing to reach"
    }


def server_sections() -> dict[str, list[str]]:
    """docs/llm.md's section of each server: the lines of its shell block, by server."""
    text = DOC.read_text(encoding="utf-8").split("## Serving a model of your own", 1)[1]
    text = text.split("\n## ", 1)[0]
    sections = {}
    for section in text.split("\n### ")[1:]:
        heading, body = section.split("\n", 1)
        block = body.split("```sh\n", 1)[1].split("```", 1)[0]
        sections[heading.split(" (")[0]] = block.splitlines()
    return sections


@pytest.mark.parametrize("row", servers_table(), ids=lambda row: row["server"])
def test_each_servers_section_runs_as_printed(row: dict[str, str], tmp_path: Path) -> None:
    """The section's commands are the table's; its ``kernelflow`` lines, run as printed on
    the stand-in's port (the embedded default: keys required), check the server and run
    the relu task on it."""
    lines = server_sections()[row["server"]]
    ours = [line for line in lines if line.startswith("kernelflow ")]
    assert [line for line in lines if line not in ours] == re.split(r"`, then `", row["start it"])
    served = row["--llm"].partition("#")[2] or "the-one-gguf"
    answers = ScriptedAnswers(EXAMPLES / "scripted" / "relu.yaml")
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    with FakeOpenAI(answers, model=served, server=STAND_INS[row["server"]]) as fake:
        said = []
        for line in ours:
            args = shlex.split(re.sub(r"http://127\.0\.0\.1:\d+", fake.url, line))[1:]
            assert args[args.index("--llm") + 1] == re.sub(
                r"http://127\.0\.0\.1:\d+", fake.url, row["--llm"]
            )
            if args[0] == "run":
                args += ["--json", "--out", str(tmp_path / "out")]
            done = run_cli(*args, env=env, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
            said.append(done.stdout)
    health, run = said
    ids, logprobs = row["answer's token ids"], row["log-probabilities"]
    assert f"token ids: {ids}, log-probabilities: {logprobs}" in " ".join(health.split())
    assert json.loads(run)["status"] == "success"
