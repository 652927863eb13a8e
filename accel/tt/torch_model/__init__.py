"""Torch implementation of the ``MeshModel`` contract (Llama, Qwen3) that runs without a mesh."""

from accel.tt.torch_model.model import TorchMeshModel

__all__ = ["TorchMeshModel"]
