"""The lines `make serve` prints about Ray's dashboard: where it is and how to sign in.

Ray 2.60 turns token authentication on for a new local cluster (unless ``RAY_AUTH_MODE`` says
otherwise) and keeps the token in ``~/.ray/auth_token`` (``RAY_AUTH_TOKEN_PATH`` moves it),
written at the first start. The dashboard and its API then answer 401 "Missing authentication
token" without it: a browser shows an "Authentication Token Required" box (the token is posted
to ``/api/authenticate``, which sets the ``ray-authentication-token`` cookie); a script sends
``Authorization: Bearer <token>`` (or ``X-Ray-Authorization``).
"""

from __future__ import annotations

from pathlib import Path

# `serve run` starts Ray with the dashboard's defaults: 127.0.0.1, port 8265 when free (else the
# next free one, which Ray's "View the dashboard at ..." line names).
DASHBOARD_URL = "http://127.0.0.1:8265"


def dashboard_banner(auth_mode: str | None, token_path: Path, url: str = DASHBOARD_URL) -> list[str]:
    lines = [
        f"Ray dashboard: {url} (Serve tab: the app, its deployments and replicas; if 8265 is taken, "
        "Ray's line 'View the dashboard at ...' below names the port)"
    ]
    if auth_mode is not None and auth_mode.lower() != "token":
        lines.append(f"  no sign-in: RAY_AUTH_MODE={auth_mode}")
        return lines
    where = f"the token in {token_path}" + ("" if token_path.exists() else " (Ray writes it as it starts)")
    lines.append(f"  sign in: paste {where} into the dashboard's 'Authentication Token Required' box;")
    lines.append(f'  scripts: curl -H "Authorization: Bearer $(cat {token_path})" {url}/api/version')
    return lines
