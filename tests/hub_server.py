"""A small hub-compatible HTTP server on 127.0.0.1 for offline tests of the fetch stage.

It serves folders ``root/{models,datasets}/<repo>/<revision>/...`` through the routes
huggingface_hub calls: repo info (``/api/{models,datasets}/<repo>/revision/<revision>``), the
recursive file tree (``/api/.../tree/<revision>``) and file downloads (HEAD and GET of
``[/datasets]/<repo>/resolve/<revision>/<file>`` with ``X-Repo-Commit`` and ``ETag`` = the git
blob id). A revision's commit is the SHA-1 of ``<repo>@<revision>``; commits resolve too. Every
request is logged; the server shuts itself down after ``lifetime`` seconds.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def commit_of(repo: str, revision: str) -> str:
    """The 40-hex commit id the server gives a repo's revision."""
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


def blob_id(data: bytes) -> str:
    """Git's blob id of a file (what the hub sends as the ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LocalHub:
    """Serve ``root`` on 127.0.0.1 (``endpoint``) until ``stop()`` or ``lifetime`` seconds."""

    def __init__(self, root: Path, lifetime: float = 600.0) -> None:
        self.root = root
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.timer = threading.Timer(lifetime, self.stop)
        self.timer.daemon = True

    def __enter__(self) -> LocalHub:
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def _revision_folder(self, kind: str, repo: str, revision: str) -> Path | None:
        base = self.root / kind / repo
        if not base.is_dir():
            return None
        for folder in base.iterdir():
            if revision in (folder.name, commit_of(repo, folder.name)):
                return folder
        return None

    def _route(self, path: str) -> tuple[str, str, str, str, str] | None:
        """(action, kind, repo, revision, file) of a request path, None if not a hub route."""
        parts = unquote(urlsplit(path).path).strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in ("models", "datasets"):
            action = parts[4]
            if action in ("revision", "tree"):
                return action, parts[1], "/".join(parts[2:4]), parts[5], "/".join(parts[6:])
            return None
        kind = "models"
        if parts[0] == "datasets":
            kind, parts = "datasets", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            return "resolve", kind, "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        return None

    def handle(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((request.command, request.path))
        route = self._route(request.path)
        folder = self._revision_folder(*route[1:4]) if route else None
        if route is None or folder is None:
            return self._send(request, 404, b'{"error": "not found"}', {}, body)
        action, kind, repo, _, name = route
        commit = commit_of(repo, folder.name)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        headers = {"X-Repo-Commit": commit}
        if action == "revision":
            info = {
                "id": repo,
                "sha": commit,
                "private": False,
                "siblings": [{"rfilename": str(p.relative_to(folder))} for p in files],
            }
            return self._send(request, 200, json.dumps(info).encode(), headers, body)
        if action == "tree":
            tree = [
                {
                    "type": "file",
                    "path": str(p.relative_to(folder)),
                    "size": p.stat().st_size,
                    "oid": blob_id(p.read_bytes()),
                }
                for p in files
                if str(p.relative_to(folder)).startswith(name)
            ]
            return self._send(request, 200, json.dumps(tree).encode(), headers, body)
        target = folder / name
        if not target.is_file():
            return self._send(request, 404, b"", {**headers, "X-Error-Code": "EntryNotFound"}, body)
        data = target.read_bytes()
        return self._send(request, 200, data, {**headers, "ETag": f'"{blob_id(data)}"'}, body)

    @staticmethod
    def _send(
        request: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
    ) -> None:
        request.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(data)
