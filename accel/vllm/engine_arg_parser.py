"""A vLLM pool's engine args read by vLLM's own argument parser, as ``vllm serve --config`` does.

Every key ``vllm serve`` 0.32 accepts is an engine arg of a vLLM pool, spelled as vLLM spells it
(``max_num_seqs`` or ``max-num-seqs``; nested mappings for the JSON configs such as
``speculative_config``). The check builds vLLM's parser (``AsyncEngineArgs.add_cli_args``), turns
the mapping into command-line arguments with vLLM's own YAML loader
(``FlexibleArgumentParser.load_config_file``: a true flag becomes ``--flag``, false ``--no-flag``,
a mapping its JSON), and parses them: an unknown key or a value vLLM's parser refuses is a
``ConfigError`` carrying vLLM's own message. The parsed values are vLLM's typed values (config
objects for the JSON configs), what ``AsyncEngineArgs.from_cli_args`` would receive.

vLLM is an optional dependency (a TT host may not have it): without it, ``parse_engine_args``
answers None and the replica's ``AsyncEngineArgs`` is the first to see the keys.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from accel.contract import ConfigError


def canonical_key(key: str) -> str:
    """``max-num-seqs`` -> ``max_num_seqs`` (AsyncEngineArgs' field names)."""
    return key.replace("-", "_")


@lru_cache(maxsize=1)
def _parser() -> Any:
    # deferred: vLLM is optional here (a host without it skips the check); the parser takes ~1 s
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="engine_args", exit_on_error=False)  # type: ignore[no-untyped-call]
    return AsyncEngineArgs.add_cli_args(parser)


def _vllm_available() -> bool:
    try:
        _parser()
    except ImportError:
        return False
    return True


def parse_engine_args(args: Mapping[str, Any]) -> dict[str, Any] | None:
    """``args`` (underscore keys) as vLLM's parser reads them, or None when vLLM is not importable.

    Raises ``ConfigError`` naming the first unknown key, or the key whose value vLLM refuses."""
    if not _vllm_available():
        return None
    import yaml

    parser = _parser()
    given = {key.replace("_", "-"): value for key, value in args.items() if value is not None}
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(given, f)
        argv = parser.load_config_file(path)
    finally:
        os.unlink(path)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            namespace, unknown = parser.parse_known_args(argv)
    except SystemExit:
        raise ConfigError(_refusal(errors.getvalue())) from None
    except Exception as exc:  # argparse.ArgumentError and vLLM's own type parsers
        raise ConfigError(_refusal(str(exc))) from None
    if unknown:
        key = _key_of(unknown[0], argv, given)
        if not unknown[0].startswith("--"):
            raise ConfigError(f"{key}: unexpected value {unknown[0]!r} (vLLM's parser; a flag takes true or false)")
        raise ConfigError(f"{key}: unknown engine arg (not an argument of vllm serve 0.32)")
    return {canonical_key(key): getattr(namespace, canonical_key(key)) for key in given}


def _key_of(token: str, argv: list[str], given: Mapping[str, Any]) -> str:
    """The given key behind a token vLLM's parser left over: a flag it does not know, or a value
    no flag took (``enforce_eager: 1`` becomes ``--enforce-eager 1``: the ``1`` is left)."""
    if not token.startswith("--"):
        index = argv.index(token)
        token = next((a for a in reversed(argv[:index]) if a.startswith("--")), token)
    name = token.removeprefix("--")
    if name not in given and name.startswith("no-") and name.removeprefix("no-") in given:
        name = name.removeprefix("no-")
    return canonical_key(name)


def _refusal(message: str) -> str:
    """vLLM's "argument --max-num-seqs: invalid int value: 'x'" as "max_num_seqs: invalid ..."."""
    line = next((ln for ln in message.splitlines() if "argument --" in ln), message.strip().splitlines()[-1])
    line = line.split("error: ", 1)[-1]
    if line.startswith("argument --"):
        flag, _, rest = line.removeprefix("argument --").partition(": ")
        return f"{canonical_key(flag.split('/')[0])}: {rest} (vLLM's engine arg parser)"
    return f"{line} (vLLM's engine arg parser)"
