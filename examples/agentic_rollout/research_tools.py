"""What the research example (``seed/advanced_integration.py``) leaves to its reader: its
tools and its model (docs/agents.md, "Examples").

``WebSearchTool``, ``ScholarTool`` and ``FactCheckTool`` work offline on a small corpus of
documents (``research_corpus.json``: news, industry and academic texts) so that the
example runs anywhere: the searches rank the documents of their kinds by the words they
share with the query, and the fact check says whether some document holds most of a
claim's words. Replace them with tools that call your search services; the agent does not
change.

``RESEARCH_REPLIES`` are the replies of the stand-in model (``YourLLMFunction`` of
``your_model.py``, one reply per turn): two searches, then the conclusion.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kernelflow.agentic_rollout import BaseTool, ToolExecutionError

CORPUS = json.loads((Path(__file__).with_name("research_corpus.json")).read_text("utf-8"))
# Words too common to say what a text is about.
_STOP = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "in", "is", "it"}
    | {"of", "on", "or", "the", "to", "with"}
)
# Share of a claim's words a document must hold to support it.
SUPPORT = 0.6

RESEARCH_REPLIES = (
    "Action: web_search(query='quantum computing applications')",
    "Action: academic_search(query='quantum chemistry simulation')",
    "Final Answer: Conclusion: quantum chemistry simulation (drug discovery, materials) is "
    "the application expected first; optimisation pilots have not yet beaten classical "
    "solvers, and cryptography needs fault-tolerant machines.",
)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def _ranked(query: str, kinds: set[str], limit: int) -> list[dict[str, str]]:
    """The documents of ``kinds`` sharing words with ``query``, the most shared first."""
    wanted = _words(query)
    if not wanted:
        raise ToolExecutionError("the query has no words to search for")
    scored = [
        (len(wanted & _words(doc["title"] + " " + doc["text"])), i)
        for i, doc in enumerate(CORPUS)
        if doc["kind"] in kinds
    ]
    hits = sorted((-score, i) for score, i in scored if score)
    return [{k: CORPUS[i][k] for k in ("title", "source", "text")} for _, i in hits[:limit]]


class _Search(BaseTool):
    kinds: frozenset[str] = frozenset()
    parameters_schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    async def execute(self, query: str, max_results: int = 3, **kwargs: Any) -> Any:
        return _ranked(query, set(self.kinds), max_results) or "no results"


class WebSearchTool(_Search):
    description = "Search news and industry pages: the best matches' title, source and text."
    kinds = frozenset({"news", "industry"})


class ScholarTool(_Search):
    description = "Search academic papers: the best matches' title, source and text."
    kinds = frozenset({"academic"})


class FactCheckTool(BaseTool):
    description = "Check a claim: supported when a source holds most of its words, with them."
    parameters_schema = {
        "type": "object",
        "properties": {"claim": {"type": "string", "minLength": 1}},
        "required": ["claim"],
        "additionalProperties": False,
    }

    async def execute(self, claim: str, **kwargs: Any) -> dict[str, Any]:
        words = _words(claim)
        if not words:
            raise ToolExecutionError("the claim has no words to check")
        sources = [
            doc["title"]
            for doc in CORPUS
            if len(words & _words(doc["title"] + " " + doc["text"])) >= SUPPORT * len(words)
        ]
        return {
            "claim": claim,
            "verdict": "supported" if sources else "unsupported",
            "sources": sources,
        }
