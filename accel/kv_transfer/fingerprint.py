"""A model's identity for KV transfer: KV computed by one model is garbage in another.

The fingerprint hashes what decides the KV values: the canonical ``config.json`` and the weights.
Reading every weight byte of a 70B checkpoint per process would cost minutes, so each
``*.safetensors`` file contributes its name, size, header (names, dtypes, shapes, offsets) and
``SAMPLE_BYTES`` from the start, middle and end of its data — enough to tell two seeds or two
fine-tunes of one architecture apart. Computed once per process per folder (cached).
"""

from __future__ import annotations

import hashlib
import json
import struct
from functools import lru_cache
from pathlib import Path

SAMPLE_BYTES = 1 << 20
# config.json keys that do not change the computation (tooling metadata).
_IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "use_cache"})


def model_fingerprint(model_dir: str | Path) -> str:
    """Hex digest identifying the model in ``model_dir`` (an HF-format folder)."""
    return _fingerprint(str(Path(model_dir).expanduser().resolve()))


@lru_cache(maxsize=16)
def _fingerprint(model_dir: str) -> str:
    folder = Path(model_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"cannot fingerprint {folder}: no config.json")
    config = {k: v for k, v in json.loads(config_path.read_text()).items() if k not in _IGNORED_CONFIG_KEYS}
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    weight_files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    for path in weight_files:
        _hash_weight_file(digest, path)
    return digest.hexdigest()[:32]


def _hash_weight_file(digest: hashlib._Hash, path: Path) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        data_start = 0
        if path.suffix == ".safetensors":
            (header_len,) = struct.unpack("<Q", f.read(8))
            digest.update(f.read(header_len))
            data_start = 8 + header_len
        for offset in sorted({data_start, data_start + (size - data_start) // 2, max(data_start, size - SAMPLE_BYTES)}):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
