"""An environment built in the real sandbox (bubblewrap, as the build uid) from an index that
requires credentials, served by the test: uv authenticates with them, and at every request it
makes, no process on the machine has them on its command line (bubblewrap reads them from a
pipe). The index refusing the credentials is a build error (retried), not a refusal."""

from __future__ import annotations

import base64
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ace3_control.settings import Settings
from ace3_worker.environments.build import EnvironmentBuilder
from ace3_worker.environments.uv_commands import EnvironmentBuildError
from ace3_worker.sandbox.plan import SandboxPlan, runtime_paths
from tests.wheelhouse import make_wheel

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="needs bubblewrap and root (CI installs bubblewrap and runs as root)",
)

TOKEN = "S3CRET-TOKEN-28"
USER = "alice"


class _Index(http.server.ThreadingHTTPServer):
    house: Path
    seen_auth: list[str | None]
    leaks: list[str]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Index

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> tuple[int, bytes]:
        self.server.seen_auth.append(self.headers.get("Authorization"))
        self.server.leaks += _command_lines_holding(TOKEN)  # (uv is running: look now)
        expected = base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") != f"Basic {expected}":
            return 401, b""
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "simple":
            names = sorted(p.name for p in self.server.house.glob(f"{parts[1]}-*.whl"))
            links = "".join(f'<a href="/files/{name}">{name}</a>\n' for name in names)
            return (200, links.encode()) if names else (404, b"")
        if len(parts) == 2 and parts[0] == "files" and (self.server.house / parts[1]).is_file():
            return 200, (self.server.house / parts[1]).read_bytes()
        return 404, b""

    def _answer(self, with_body: bool) -> None:
        status, body = self._body()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
        self.send_header("Content-Type", "text/html" if b"<a" in body else "application/zip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


def _command_lines_holding(secret: str) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as file:
                    line = file.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if secret in line:
                found.append(f"{name}: {line[:200]}")
    return found


@pytest.fixture
def index(tmp_path: Path) -> Iterator[_Index]:
    house = tmp_path / "house"
    make_wheel(house, "tinyext", "1.0", {"tinyext/__init__.py": "VALUE = 42\n"}, ["tinydep"])
    make_wheel(house, "tinydep", "0.2", {"tinydep/__init__.py": "X = 1\n"})
    server = _Index(("127.0.0.1", 0), _Handler)
    server.house, server.seen_auth, server.leaks = house, [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _builder(tmp_path: Path, index_url: str) -> EnvironmentBuilder:
    settings = Settings(data_dir=tmp_path / "data", pip_index_url=index_url)
    plan = SandboxPlan(mode="bwrap", dedicated_uids=True, runtime_paths=runtime_paths(), hidden=())
    return EnvironmentBuilder(settings, plan)


def _scratch(tmp_path: Path, name: str) -> Path:
    scratch = tmp_path / name
    scratch.mkdir()
    return scratch


def test_index_credentials_reach_uv_but_no_command_line(tmp_path: Path, index: _Index) -> None:
    url = f"http://{USER}:{TOKEN}@127.0.0.1:{index.server_address[1]}/simple"
    built = _builder(tmp_path, url).build(["tinyext"], _scratch(tmp_path, "scratch"))
    assert [pin.requirement for pin in built.pins] == ["tinydep==0.2", "tinyext==1.0"]
    assert (built.path / "tinyext" / "__init__.py").read_text() == "VALUE = 42\n"
    assert index.seen_auth and all(auth and auth.startswith("Basic ") for auth in index.seen_auth)
    assert index.leaks == []


def test_the_index_refusing_the_credentials_is_a_build_error(tmp_path: Path, index: _Index) -> None:
    url = f"http://{USER}:wrong@127.0.0.1:{index.server_address[1]}/simple"
    with pytest.raises(EnvironmentBuildError, match="401 Unauthorized"):
        _builder(tmp_path, url).build(["tinyext"], _scratch(tmp_path, "scratch"))
