"""The import layers, enforced over every import statement (module level and deferred alike).

Imports only flow down. The floors, bottom first (``FLOORS``; a module is on the floor of the
longest prefix naming it, and imports first-party code only from its own floor and below)::

    accel                         engines, their contract, text, KV format
    deployments.config            the app's typed, frozen config (YAML in, dataclasses out)
    deployments.messages          what the ingress, the Router and the replicas exchange
    deployments.telemetry         Ray metrics of engine stats and requests
    deployments.handle_routing    Serve request-router plugins, run inside the callers' handles
    deployments.kv                the KV-connector actor and its transports
    deployments.pd                prefill/decode wiring and orchestration
    deployments.replicas          engine replicas (TT, vLLM) and their pool clients
    deployments.router            the Router deployment (pure ``logic/`` + its Serve shell)
    serve_app.http                the one HTTP edge: OpenAI protocol (pydantic) and the ingress
    serve_app.app                 the builder, the composition root: binds every deployment
    serve_app.launch              what ``make serve`` runs before ``serve run`` (port pre-flight)

- ``deployments.messages`` is neutral ground: the router and the replicas both import it, so
  neither imports the other for their shared vocabulary.
- ``deployments.router.logic`` is pure logic: no Ray, no torch, and of ``deployments`` only
  ``config``, ``messages`` and itself.
- No cycles between first-party modules, and none between folders at any depth (a folder stands
  for every module under it).
- A first-party import inside a function body is allowed only where it keeps a heavy optional
  dependency (vLLM, ttnn, JAX, the TPU backends) out of a process that does not need it: the
  imported module must reach one at module level, and the line (or the one above) says why with a
  ``# deferred:`` comment.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("accel", "deployments", "serve_app")
HEAVY_OPTIONAL = {"vllm", "ttnn", "jax", "jaxlib", "tpu_inference", "torch_tpu", "torchax", "libtpu"}
FLOORS = (  # bottom first; see the docstring
    "accel",
    "deployments.config",
    "deployments.messages",
    "deployments.telemetry",
    "deployments.handle_routing",
    "deployments.kv",
    "deployments.pd",
    "deployments.replicas",
    "deployments.router",
    "serve_app.http",
    "serve_app.app",
    "serve_app.launch",
)
PACKAGE_ROOTS = ("deployments", "serve_app")  # empty package markers, on no floor
ROUTER_LOGIC = "deployments.router.logic"
ROUTER_LOGIC_MAY_IMPORT = ("deployments.config", "deployments.messages", ROUTER_LOGIC)


@dataclass(frozen=True)
class Import:
    module: str  # importing module
    target: str  # imported module (resolved, absolute)
    line: int
    deferred: bool  # inside a function body
    comment: str  # the import line and the line above it


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    out = {}
    for top in FIRST_PARTY:
        for path in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(path)] = path
    return out


SOURCES = _sources()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(name: str, node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = _resolve(module, is_package, node)
    # ``from pkg import sub`` imports the submodule when one exists.
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in SOURCES else base for a in node.names]


def _imports(module: str, path: Path) -> list[Import]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                context = "\n".join(lines[max(0, child.lineno - 2) : child.end_lineno or child.lineno])
                for target in _targets(module, child, module, is_package):
                    found.append(Import(module, target, child.lineno, in_function, context))
            elif isinstance(child, ast.If) and _is_type_checking(child):
                continue  # annotations only: never executed
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


IMPORTS = {m: _imports(m, p) for m, p in SOURCES.items()}


def _first_party(target: str) -> str | None:
    """The first-party module ``target`` names (a module, or the package holding a name)."""
    while target and target not in SOURCES:
        target = target.rpartition(".")[0]
    return target or None


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _floor(module: str) -> int | None:
    """The index in ``FLOORS`` of the longest prefix naming ``module``; None for none."""
    found = [i for i, floor in enumerate(FLOORS) if _is_under(module, floor)]
    return max(found, key=lambda i: len(FLOORS[i])) if found else None


def _layer_problem(imp: Import) -> str | None:
    src, dst = imp.module, imp.target
    if dst.split(".")[0] not in FIRST_PARTY:
        if _is_under(src, ROUTER_LOGIC) and dst.split(".")[0] in ("ray", "torch"):
            return "the router logic is pure logic (no Ray, no torch)"
        return None
    if (
        _is_under(src, ROUTER_LOGIC)
        and _is_under(dst, "deployments")
        and not any(_is_under(dst, allowed) for allowed in ROUTER_LOGIC_MAY_IMPORT)
    ):
        return "the router logic imports only config and messages of deployments"
    src_floor, dst_floor = _floor(src), _floor(dst)
    if src_floor is not None and dst_floor is not None and dst_floor > src_floor:
        return f"an upward import: {FLOORS[src_floor]} is below {FLOORS[dst_floor]}"
    return None


def test_every_module_is_on_a_floor():
    missing = [m for m in SOURCES if m not in PACKAGE_ROOTS and _floor(m) is None]
    assert not missing, f"put these on a floor of FLOORS: {missing}"


def test_every_import_respects_the_layers():
    problems = [
        f"{imp.module}:{imp.line} imports {imp.target}: {why}"
        for imps in IMPORTS.values()
        for imp in imps
        if (why := _layer_problem(imp)) is not None
    ]
    assert not problems, "\n".join(problems)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in SOURCES}
    for module, imps in IMPORTS.items():
        for imp in imps:
            dst = _first_party(imp.target)
            if dst is not None and dst != module and not _is_under(module, dst):  # a package's own __init__
                graph[module].add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (deferred imports included):\n" + "\n".join(" <-> ".join(c) for c in cycles)


PACKAGES = {m for m, path in SOURCES.items() if path.name == "__init__.py"}


def _folder_graph(depth: int) -> dict[str, set[str]]:
    """Folders cut at ``depth`` name components (a module stands in its package's folder); an
    edge for every import between two folders neither of which holds the other."""

    def folder(module: str) -> str:
        package = module if module in PACKAGES else module.rpartition(".")[0]
        return ".".join(package.split(".")[:depth])

    graph: dict[str, set[str]] = {}
    for module, imps in IMPORTS.items():
        src = folder(module)
        graph.setdefault(src, set())
        for imp in imps:
            dst = _first_party(imp.target)
            if dst is None:
                continue
            dst = folder(dst)
            if not (_is_under(src, dst) or _is_under(dst, src)):
                graph[src].add(dst)
                graph.setdefault(dst, set())
    return graph


def test_no_folder_cycles_at_any_depth():
    depth = max(len(m.split(".")) for m in SOURCES)
    problems = []
    for d in range(1, depth + 1):
        problems.extend(" <-> ".join(cycle) for cycle in _cycles(_folder_graph(d)))
    assert not problems, "folder cycles:\n" + "\n".join(problems)


def _reaches_heavy(module: str) -> bool:
    """Whether importing ``module`` imports a heavy optional package (module-level imports only)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in SOURCES)
        for imp in IMPORTS.get(m, ()):
            if imp.deferred:
                continue
            if imp.target.split(".")[0] in HEAVY_OPTIONAL:
                return True
            dst = _first_party(imp.target)
            if dst is not None:
                todo.append(dst)
    return False


def test_deferred_first_party_imports_only_keep_heavy_dependencies_out():
    problems = []
    for imps in IMPORTS.values():
        for imp in imps:
            dst = _first_party(imp.target)
            if not imp.deferred or dst is None:
                continue
            if not _reaches_heavy(dst):
                problems.append(
                    f"{imp.module}:{imp.line} defers {imp.target}, which imports no heavy optional "
                    "dependency: import it at the top"
                )
            elif "# deferred:" not in imp.comment:
                problems.append(f"{imp.module}:{imp.line} defers {imp.target}: say why with a '# deferred:' comment")
    assert not problems, "\n".join(problems)


def test_the_checker_reads_the_tree_and_its_rules_bite():
    """Guard against a checker that silently reads nothing, and against rules that flag nothing."""
    assert len(SOURCES) > 50 and sum(len(v) for v in IMPORTS.values()) > 200
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    for src, dst, is_allowed in (
        ("accel.tt.engine", "deployments.replicas.engine_replica", False),  # upward
        ("deployments.config", "deployments.pd.pairing", False),  # upward
        ("deployments.replicas.client", "deployments.router.client", False),  # upward, inside deployments
        ("deployments.messages.routing", "deployments.kv.messages", False),  # messages are neutral
        ("deployments.router.logic.policy", "deployments.replicas.client", False),  # logic: messages only
        ("serve_app.http.openai_ingress", "serve_app.app", False),  # the builder is the top
        ("deployments.router.deployment", "deployments.replicas.client", True),  # downward
        ("serve_app.app", "serve_app.http.openai_ingress", True),  # downward
    ):
        assert (_layer_problem(Import(src, dst, 1, False, "")) is None) == is_allowed, (src, dst)
