"""Hold ``accel.vllm.tpu.backends`` against a backend's real code, read as source (``ast``).

Importing either backend needs TPU-only dependencies (JAX + libtpu, torch_tpu), so the checks
parse the installed (or unpacked-wheel) source instead: every class, attribute, connector,
executor and env var name we rely on must be there, with the meaning we rely on. Used twice:

- in CI (``tests/accel/vllm/tpu/test_backend_contract.py``) against the tpu-inference wheel
  fetched from PyPI and unpacked with ``--no-deps``;
- by the replica at start-up on a TPU host (``verify_installed``), against what is installed:
  vllm-torchtpu is not on PyPI, so there it is the only check of the names read upstream.

A problem is a sentence naming the missing piece (module, class, attribute, connector, env var).
Pure stdlib; nothing here imports a backend.
"""

from __future__ import annotations

import ast
import configparser
import functools
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

from accel.vllm.tpu.backends import TpuBackend

# module dotted name -> its source file (``a/b.py`` or ``a/b/__init__.py``), None if absent
SourceFinder = Callable[[str], Path | None]


def tree_finder(root: Path) -> SourceFinder:
    """Modules laid out under ``root`` (an unpacked wheel, a site-packages folder)."""

    def find(module: str) -> Path | None:
        base = root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    return find


def installed_finder() -> SourceFinder:
    """Modules of the running interpreter, found without importing them: only the top-level
    package is located (``find_spec`` of a top-level name runs no code), the rest is paths."""

    def find(module: str) -> Path | None:
        top = module.split(".")[0]
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin is None:
            return None
        origin = Path(spec.origin)
        root = origin.parent.parent if origin.name == "__init__.py" else origin.parent
        return tree_finder(root)(module)

    return find


@functools.lru_cache(maxsize=64)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _split(dotted: str) -> tuple[str, str]:
    module, _, name = dotted.rpartition(".")
    return module, name


def _strings(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n.value


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _class_attr(cls: ast.ClassDef, attr: str) -> ast.expr | None:
    for n in cls.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in n.targets):
            return n.value
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == attr:
            return n.value
    return None


def _imports(tree: ast.Module, module: str, name: str) -> bool:
    """``from module import name`` anywhere (function-local imports included)."""
    return any(
        isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names)
        for n in ast.walk(tree)
    )


class _Checker:
    def __init__(self, backend: TpuBackend, find: SourceFinder) -> None:
        self.backend = backend
        self.find = find
        self.problems: list[str] = []

    def tree(self, module: str) -> ast.Module | None:
        path = self.find(module)
        if path is None:
            self.problems.append(f"{self.backend.name}: module {module} is not installed")
            return None
        return _parse(path)

    def cls(self, dotted: str) -> ast.ClassDef | None:
        module, name = _split(dotted)
        tree = self.tree(module)
        if tree is None:
            return None
        found = _class(tree, name)
        if found is None:
            self.problems.append(f"{self.backend.name}: class {name} is not defined in {module}")
        return found

    def platform(self) -> None:
        b = self.backend
        cls = self.cls(b.platform_cls)
        if cls is None:
            return
        for attr, want in (("ray_device_key", "TPU"), ("device_control_env_var", "TPU_VISIBLE_CHIPS")):
            value = _class_attr(cls, attr)
            got = value.value if isinstance(value, ast.Constant) else None
            if got != want:
                self.problems.append(f"{b.name}: {b.platform_cls}.{attr} is {got!r}, we rely on {want!r}")
        module, _ = _split(b.platform_cls)
        tree = self.tree(module)
        assert tree is not None
        strings = set(_strings(tree))
        if b.worker_cls not in strings:
            self.problems.append(f"{b.name}: {module} no longer sets worker_cls {b.worker_cls!r}")
        # Executor selection: TPU_MULTIHOST_BACKEND="ray" -> the Ray executors (V1/V2), else uni/mp.
        if "ray" not in strings:
            self.problems.append(f"{b.name}: {module} no longer selects an executor for TPU_MULTIHOST_BACKEND='ray'")
        for dotted in (b.ray_executor_cls, b.ray_executor_v2_cls, b.multiproc_executor_cls):
            exec_module, name = _split(dotted)
            if not _imports(tree, exec_module, name):
                self.problems.append(f"{b.name}: {module} does not select executor {dotted}")
        self.accepted_connectors(tree, module)

    def accepted_connectors(self, tree: ast.Module, module: str) -> None:
        """The platform's own list of accepted connectors equals ours (a name it dropped would
        fail at engine start; one it added is a capability we do not offer yet)."""
        ours = set(self.backend.accepted_connectors)
        for n in ast.walk(tree):
            if isinstance(n, (ast.Set, ast.Tuple, ast.List)):
                names = {e.value for e in n.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if "TPUConnector" in names and len(names) == len(n.elts):
                    if names != ours:
                        self.problems.append(
                            f"{self.backend.name}: {module} accepts KV connectors {sorted(names)}, "
                            f"we encode {sorted(ours)}"
                        )
                    return
        self.problems.append(f"{self.backend.name}: no accepted-KV-connector list found in {module}")

    def connectors(self) -> None:
        for spec in self.backend.connectors:
            if spec.module_path.startswith("vllm."):
                continue  # vLLM's own (checked against the installed vLLM by the tests)
            self.cls(f"{spec.module_path}.{spec.name}")

    def executors(self) -> None:
        b = self.backend
        for dotted in (b.ray_executor_cls, b.ray_executor_v2_cls):
            if self.cls(dotted) is None:
                continue
            module, _ = _split(dotted)
            tree = self.tree(module)
            assert tree is not None
            if not any(_is_placement_group_reuse(n) for n in ast.walk(tree)):
                self.problems.append(
                    f"{b.name}: {dotted} no longer reuses parallel_config.placement_group when it is set"
                )
        module, _ = _split(b.ray_executor_cls)
        tree = self.tree(module)
        if tree is not None:
            per = _worker_tpu_resource(tree)
            if per != b.workers:
                self.problems.append(
                    f"{b.name}: {b.ray_executor_cls} gives each worker {per or 'an unknown'} TPU share, "
                    f"we place workers {b.workers}"
                )

    def env_vars(self) -> None:
        tree = self.tree(self.backend.envs_module)
        if tree is None:
            return
        strings = set(_strings(tree))
        for var in self.backend.env_vars:
            if var not in strings:
                self.problems.append(f"{self.backend.name}: env var {var} is not read by {self.backend.envs_module}")


def _is_placement_group_reuse(node: ast.AST) -> bool:
    """``<...>.parallel_config.placement_group is not None``."""
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "placement_group"
        and isinstance(node.left.value, ast.Attribute)
        and node.left.value.attr == "parallel_config"
        and any(isinstance(op, ast.IsNot) for op in node.ops)
    )


def _worker_tpu_resource(tree: ast.Module) -> str | None:
    """How the Ray executor sizes a worker's ``TPU`` ask (``num_tpu_per_worker = ...``): a
    constant 1 = one worker per chip; bundle 0's TPU count = one worker per host."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "num_tpu_per_worker" for t in n.targets
        ):
            if isinstance(n.value, ast.Constant) and n.value.value == 1:
                return "per_chip"
            if "bundle_specs" in ast.unparse(n.value):
                return "per_host"
    return None


def check_backend(backend: TpuBackend, find: SourceFinder) -> list[str]:
    """Every problem with ``backend``'s names in the code ``find`` locates (empty: all hold)."""
    checker = _Checker(backend, find)
    checker.platform()
    checker.connectors()
    checker.executors()
    checker.env_vars()
    return checker.problems


def entry_points_of(dist_info: Path) -> dict[str, dict[str, str]]:
    """``entry_points.txt`` of an unpacked distribution: group -> name -> value."""
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names' case
    parser.read(dist_info / "entry_points.txt")
    return {group: dict(parser[group]) for group in parser.sections()}


def check_platform_plugin(backend: TpuBackend, entry_points: dict[str, dict[str, str]]) -> list[str]:
    """An out-of-tree backend must register its platform under ``vllm.platform_plugins``."""
    if backend.platform_entry_point is None:
        return []
    plugins = entry_points.get("vllm.platform_plugins", {})
    if backend.platform_entry_point not in plugins.values():
        return [
            f"{backend.name}: no vllm.platform_plugins entry point {backend.platform_entry_point} "
            f"(found {sorted(plugins.values())})"
        ]
    return []


def verify_installed(backend: TpuBackend) -> None:
    """Start-up check on a TPU host: raise ``RuntimeError`` listing each name ``backend``'s
    installed code lacks (or that it is not installed at all), before vLLM starts on it."""
    from importlib import metadata

    top = backend.platform_cls.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise RuntimeError(
            f"pool runs tpu_backend {backend.name!r} but its package {top!r} is not installed "
            f"in this Python; install {backend.distribution} (see README, TPU install)"
        )
    problems = check_backend(backend, installed_finder())
    eps = {g: {ep.name: ep.value for ep in metadata.entry_points(group=g)} for g in ("vllm.platform_plugins",)}
    problems += check_platform_plugin(backend, eps)
    if problems:
        raise RuntimeError(
            f"the installed {backend.name} backend does not match what meshserve was built against "
            f"({backend.source}):\n  " + "\n  ".join(problems)
        )
