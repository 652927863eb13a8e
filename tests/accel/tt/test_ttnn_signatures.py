"""Every ttnn function, keyword and enum member our code uses exists in the real ``ttnn`` 0.81.1
wheel, and the host stub mirrors those signatures.

Our uses are declared in ``accel.tt.mesh_device.TTNN_CALLS`` / ``TTNN_ATTRIBUTES`` (the stub tests
check that every call we make stays inside that table). The real-wheel half needs a Python 3.12
(or 3.10) venv with ttnn, since ttnn ships no cp311 wheel; it is skipped, with the reason, where that
venv is absent. To create it (glibc >= 2.34, ~100 MB download, no hardware needed):

    python3.12 -m venv ~/.cache/meshserve/ttnn-venv      # pyenv: ~/.pyenv/versions/3.12.*/bin/python3.12
    ~/.cache/meshserve/ttnn-venv/bin/pip install ttnn==0.81.1

or point ``MESHSERVE_TTNN_PYTHON`` at any interpreter that can ``import ttnn``.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from accel.envs import ENVS
from accel.tt.mesh_device import TTNN_ATTRIBUTES, TTNN_CALLS

# Runs inside the ttnn venv: prints {name: {"exists", "params", "var_kw"}} for the requested names.
# pybind11 functions often have no inspect signature; their docstrings carry one line per overload.
_INTROSPECT = r"""
import inspect, json, sys
import ttnn

def resolve(path):
    obj = ttnn
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj

def split_top_level(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""
        else:
            cur += ch
    return parts + [cur]

def doc_params(doc, short):
    names, start = [], 0
    while True:
        i = doc.find(short + "(", start)
        if i < 0:
            return names
        j, depth = i + len(short), 0
        for k in range(j, len(doc)):
            depth += doc[k] in "([{"
            depth -= doc[k] in ")]}"
            if depth == 0:
                break
        for part in split_top_level(doc[j + 1:k]):
            name = part.split(":")[0].split("=")[0].strip().lstrip("*")
            if name and name.isidentifier() and name != "self" and name not in names:
                names.append(name)
        start = k

def describe(path):
    try:
        obj = resolve(path)
    except AttributeError:
        return {"exists": False, "params": None, "var_kw": False}
    try:
        params = inspect.signature(obj).parameters.values()
        return {"exists": True, "params": [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)],
                "var_kw": any(p.kind is p.VAR_KEYWORD for p in params)}
    except (TypeError, ValueError):
        doc = (obj.__init__.__doc__ if isinstance(obj, type) else obj.__doc__) or ""
        short = "__init__" if isinstance(obj, type) else path.split(".")[-1]
        return {"exists": True, "params": doc_params(doc, short), "var_kw": False}

names = json.load(sys.stdin)
print(json.dumps({n: describe(n) for n in names}))
"""


_NOT_IN_TTNN = "open_mesh_device_that_does_not_exist"


@pytest.fixture(scope="module")
def real_ttnn() -> dict:
    python = ENVS.ttnn_python
    if not python.exists():
        pytest.skip(
            f"no Python with the real ttnn wheel at {python} (MESHSERVE_TTNN_PYTHON); "
            "see this module's docstring to create it"
        )
    names = sorted(TTNN_CALLS) + list(TTNN_ATTRIBUTES) + [_NOT_IN_TTNN]
    proc = subprocess.run(
        [str(python), "-c", _INTROSPECT], input=json.dumps(names), capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0 and "No module named 'ttnn'" in proc.stderr:
        pytest.skip(f"{python} cannot import ttnn")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_declared_function_and_keyword_exists_in_the_wheel(real_ttnn):
    # The introspection itself is not vacuous: it sees real parameters and reports absent names.
    assert "trace_region_size" in real_ttnn["open_mesh_device"]["params"]
    assert not real_ttnn[_NOT_IN_TTNN]["exists"]
    for name, keywords in TTNN_CALLS.items():
        info = real_ttnn[name]
        assert info["exists"], f"ttnn.{name} is not in the wheel"
        missing = [k for k in keywords if k not in info["params"]]
        assert info["var_kw"] or not missing, f"ttnn.{name} has no keyword(s) {missing}; real: {info['params']}"


def test_every_declared_enum_member_exists_in_the_wheel(real_ttnn):
    assert [a for a in TTNN_ATTRIBUTES if not real_ttnn[a]["exists"]] == []


def test_stub_parameters_match_the_wheel(real_ttnn, ttnn_stub):
    for name in TTNN_CALLS:
        real = real_ttnn[name]["params"]
        if not real or name in ("MeshShape", "MeshDevice.get_submeshes"):
            continue  # positional constructor overloads / method with no parameters
        stub = [p for p in inspect.signature(_resolve(ttnn_stub, name)).parameters if p != "self"]
        assert stub == real, f"stub ttnn.{name}{stub} != wheel {real}"


def _resolve(module, path):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def test_stub_accepts_every_declared_call(ttnn_stub):
    for name, keywords in TTNN_CALLS.items():
        obj = _resolve(ttnn_stub, name)
        params = inspect.signature(obj).parameters
        assert set(keywords) <= set(params), f"stub ttnn.{name} lacks {set(keywords) - set(params)}"
    for attr in TTNN_ATTRIBUTES:
        _resolve(ttnn_stub, attr)


def test_stub_is_not_on_the_path_by_default():
    # Host code must run without ttnn (the 3.11 venv has no wheel), and the stub is opt-in per test.
    assert "ttnn" not in sys.modules
    with pytest.raises(ImportError):
        __import__("ttnn")
