"""What `make serve` prints about the Ray dashboard."""

from __future__ import annotations

import socket
from pathlib import Path

from serve_app.launch import preflight
from serve_app.launch.dashboard_banner import dashboard_banner


def test_token_mode_names_the_url_the_token_file_and_a_header_that_works(tmp_path: Path):
    token = tmp_path / "auth_token"
    token.write_text("t0k")
    text = "\n".join(dashboard_banner(None, token))
    assert "http://127.0.0.1:8265" in text
    assert f"the token in {token} into" in text
    assert f'-H "Authorization: Bearer $(cat {token})" http://127.0.0.1:8265/api/version' in text
    assert "writes it" not in text
    assert "\n".join(dashboard_banner("token", token)) == text


def test_a_token_file_not_yet_written_is_said_so(tmp_path: Path):
    assert "Ray writes it as it starts" in "\n".join(dashboard_banner(None, tmp_path / "absent"))


def test_auth_disabled_needs_no_sign_in(tmp_path: Path):
    lines = dashboard_banner("disabled", tmp_path / "auth_token")
    assert lines[0].startswith("Ray dashboard: http://127.0.0.1:8265")
    assert lines[1:] == ["  no sign-in: RAY_AUTH_MODE=disabled"]


def test_the_preflight_reads_the_config_port_and_prints_the_banner(tmp_path: Path, capsys, monkeypatch):
    config = tmp_path / "app.yaml"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed
    config.write_text(f"http_options:\n  host: 127.0.0.1\n  port: {port}\napplications: []\n")
    assert preflight.config_port(config) == port
    (tmp_path / "bare.yaml").write_text("applications: []\n")
    assert preflight.config_port(tmp_path / "bare.yaml") == preflight.SERVE_DEFAULT_PORT
    # Only the config's port (HAProxy's are checked when RAY_SERVE_ENABLE_HA_PROXY is on); nothing
    # holds it, so the pre-flight only prints.
    monkeypatch.setattr(preflight, "needed_ports", lambda _config: {"the config's HTTP port": port})
    assert preflight.main([str(config)]) == 0
    out = capsys.readouterr().out
    assert "Ray dashboard: http://127.0.0.1:8265" in out and "auth_token" in out
