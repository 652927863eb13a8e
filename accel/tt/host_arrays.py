"""Host-side step inputs as numpy, for threads that share the GIL with busy Python threads.

A small torch op (``clone``, tensor indexing, ``max``, ``torch.as_tensor`` of an array) releases
the GIL around its few microseconds of work; when another thread of the process is running
Python (the asyncio side detokenizing 128 streams, a torch model's device thread), taking the
GIL back then waits for that thread's switch interval (5 ms by default). Small numpy ops,
``Tensor.numpy()``, ``torch.from_numpy`` and ``torch.tensor(list)`` keep it. The engine's step
thread and a model's ``decode_forward`` (which runs on that thread) therefore stage inputs here
and hand torch views over.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def host_array(values: Any) -> np.ndarray:
    """``values`` as numpy without a GIL-releasing torch op: a CPU tensor's own memory through
    ``Tensor.numpy()`` (no copy), anything else through ``np.asarray``."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu" or values.requires_grad:
            values = values.detach().cpu()
        array: np.ndarray = values.numpy()
        return array
    return np.asarray(values)


def host_copy(values: Any, dtype: type[np.generic]) -> np.ndarray:
    """A private copy of ``values`` as a numpy ``dtype`` array (a snapshot the caller may then
    overwrite its buffer under)."""
    return host_array(values).astype(dtype, copy=True)
