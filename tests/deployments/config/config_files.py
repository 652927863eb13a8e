"""The shipped configs (``configs/*.yaml``) as the loader tests read them."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.yaml"))


def config_args(name: str = "tiny") -> dict:
    """``applications[0].args`` of ``configs/<name>.yaml``."""
    path = Path(__file__).parents[3] / "configs" / f"{name}.yaml"
    return yaml.safe_load(path.read_text())["applications"][0]["args"]


def tpu_pd_args() -> dict:
    """``configs/tpu_pd.yaml``'s args, a copy the caller may change."""
    return copy.deepcopy(config_args("tpu_pd"))
