"""A tiny tokenizer built here (no download) for verl's datasets and reward managers: a
byte-level BPE, so decoding gives back any text exactly (code included), with special
tokens around each message and a chat template that renders every message on its own
(what verl's ``MultiTurnSFTDataset`` checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
SPECIAL = ["<pad>", "<end>", *(f"<{r}>" for r in ROLES)]
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<end>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CORPUS = [
    "import torch\nimport triton\nimport triton.language as tl\n",
    "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n",
    "Thought: I should compute this.\nAction: calculator(expression='6 * 7')\n",
    "Final Answer: 42. What is 6 times 7? The answer is 1024 or 41.",
]


def tiny_tokenizer(directory: Path) -> Any:
    """Train it, save it with its chat template under ``directory``, load it as verl would
    (``AutoTokenizer.from_pretrained``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token="<pad>",
        eos_token="<end>",
        additional_special_tokens=SPECIAL[2:],
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)
