"""What every tiny checkpoint's tokenizer is trained on, and how its JSON is written.

Shared by the tiny text checkpoints (``tiny.py``) and the tiny vision-language one
(``tiny_vl.py``): a byte-level BPE trained with the ``tokenizers`` library on source text that
ships with Python, so no hub access and byte-identical reruns.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Modules whose source is the tokenizer's training text (ships with every CPython 3.11).
_CORPUS_MODULES = ("textwrap", "string", "difflib", "heapq", "bisect", "fractions", "shlex", "this")


def training_text() -> list[str]:
    lines: list[str] = []
    for module in _CORPUS_MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        lines.extend(Path(spec.origin).read_text(encoding="utf-8").splitlines())
    # A few non-ASCII lines so multi-byte characters appear in the merges.
    lines += ["café naïve résumé — “quotes” ½ ∑ π ≈ 3.14159", "日本語のテキスト 中文 한국어 😀 🚀"]
    return lines


def train_byte_level_bpe(special_tokens: Sequence[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` entries; ``special_tokens`` take the first ids, in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok


def canonicalize_json(path: Path) -> None:
    """Rewrite JSON files with sorted keys so reruns are byte-identical."""
    for f in sorted(path.glob("*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        f.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
