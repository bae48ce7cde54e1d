"""Token drift (docs/datasets.md, "Token drift"): whether each sample's recorded token ids
still are its text under the policy's tokenizer, a local Hugging Face tokenizer (a
directory ``save_pretrained`` wrote, or a ``tokenizer.json`` file). Ids that decode to
other text, or text that encodes to other ids, train the policy on something it did not
say: such turns are flagged (``token_drift``), counted in the export's meta, and left out
with ``--drop-drifted``.

A turn's response ids must decode to its response text and the text re-encode to the same
ids (a trailing end-of-sequence token, which the server returns and the text leaves out,
is not compared). Its prompt ids, where the tokenizer has a chat template, must be the
prompt's messages as that template renders them (with the generation prompt), both ways.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from kernelflow.projections.flow_grpo import GrpoSample

NOT_CHECKED = (
    "no tokenizer given (export grpo --tokenizer PATH): recorded token ids were not checked "
    "against their text"
)


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded from the path given."""


def load_tokenizer(path: Path) -> Any:
    """A local tokenizer: a directory (``AutoTokenizer``) or a ``tokenizer.json`` file. No
    download is ever tried."""
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
    except ImportError as exc:
        raise TokenizerError(f"--tokenizer needs the transformers package ({exc})") from exc
    try:
        if path.is_dir():
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        if path.is_file():
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as exc:  # the library's own errors: a broken or foreign file
        raise TokenizerError(f"{path}: not a tokenizer ({type(exc).__name__}: {exc})") from exc
    raise TokenizerError(f"{path}: no such tokenizer directory or file")


@dataclass
class DriftCheck:
    """Checks each sample on its way to the writer (``checked``), counting what it found."""

    tokenizer: Any
    path: str
    drop: bool = False
    checked: int = 0
    drifted: int = 0
    dropped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def checked_writes(self, write: Callable[[GrpoSample], None]) -> Callable[[GrpoSample], None]:
        def check_then_write(sample: GrpoSample) -> None:
            problems = self.problems(sample)
            if problems is None:
                write(sample)
                return
            self.checked += 1
            if problems:
                self.drifted += 1
                self.reasons.update(problems)
                if self.drop:
                    self.dropped += 1
                    return
            write(msgspec.structs.replace(sample, token_drift=bool(problems)))

        return check_then_write

    def problems(self, sample: GrpoSample) -> list[str] | None:
        """What drifted in the sample (empty: nothing); None: it has no ids to check."""
        found: list[str] | None = None
        if sample.response_token_ids is not None:
            ids = self._without_end(sample.response_token_ids)
            found = self._compare("response", ids, sample.response)
        template = getattr(self.tokenizer, "chat_template", None)
        if sample.prompt_token_ids is not None and template:
            messages = [{"role": m.role, "content": m.content} for m in sample.prompt]
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            found = [*(found or []), *self._compare("prompt", sample.prompt_token_ids, text)]
        return found

    def _compare(self, part: str, ids: list[int], text: str) -> list[str]:
        found = []
        decoded = self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if decoded != text:
            found.append(f"{part} ids decode to other text")
        if list(self.tokenizer.encode(text, add_special_tokens=False)) != list(ids):
            found.append(f"{part} text encodes to other ids")
        return found

    def _without_end(self, ids: list[int]) -> list[int]:
        end = getattr(self.tokenizer, "eos_token_id", None)
        return ids[:-1] if ids and end is not None and ids[-1] == end else ids

    def meta(self) -> dict[str, Any]:
        return {
            "checked": True,
            "tokenizer": self.path,
            "rows_checked": self.checked,
            "rows_drifted": self.drifted,
            "rows_dropped": self.dropped,
            "by_reason": dict(sorted(self.reasons.items())),
        }
