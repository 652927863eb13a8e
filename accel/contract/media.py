"""Images a request carries: ``EncodedImage``, the encoded file bytes as the client sent them.

Why encoded bytes and not pixels: they are what crosses Ray (a PNG/JPEG is a few KiB where the
decoded or processed tensors are 10-100x larger), and every engine runs its own model's processor
on them (vLLM's multimodal processor on a vLLM pool; the HF processor host-side on a TT mesh), so
the ingress does no image preprocessing of its own. ``content_hash`` is the identity routing and
caching use: two requests with the same image bytes share it, different bytes never do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from accel.contract.errors import require


@dataclass(frozen=True)
class EncodedImage:
    """One image: ``data`` the file's bytes (PNG, JPEG, ...), ``mime`` its type (``image/png``).
    ``content_hash``: sha256 hex of ``data``, derived on construction."""

    data: bytes = field(repr=False)
    mime: str
    content_hash: str = field(init=False)

    def __post_init__(self) -> None:
        require(isinstance(self.data, bytes) and len(self.data) > 0, "images", "an image needs its bytes")
        is_image = isinstance(self.mime, str) and self.mime.startswith("image/")
        require(is_image, "images", f"not an image type: {self.mime!r}")
        object.__setattr__(self, "content_hash", hashlib.sha256(self.data).hexdigest())

    @property
    def num_bytes(self) -> int:
        return len(self.data)
