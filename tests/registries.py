"""Local stand-ins for the two registries `freetoken pull` talks to, on threaded http.server,
speaking only the routes the code uses (and checking what it sends):

Ollama: GET /v2/<ns>/<name>/manifests/<tag>, GET /v2/<ns>/<name>/blobs/sha256:<hex>
Hugging Face (HF_ENDPOINT): GET /api/models/<repo>/revision/<rev>?blobs=true (listing with
    sha/siblings/blobId/lfs, as the Hub sends it) and GET /<repo>/resolve/<commit>/<path>,
    LFS files redirected (302) to /cdn/<sha256> as the Hub redirects to its CDN.
Both honour `Range: bytes=N-` (206 + Content-Range); `cut[key] = n` sends the full
Content-Length but closes after n bytes (a cut connection, once per key); `corrupt` keys get
one byte flipped; `requests` records (method, path, headers with lower-case names)."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse


class _Server:
    def __init__(self):
        self.requests: list[tuple[str, str, dict]] = []
        self.cut: dict[str, int] = {}
        self.corrupt: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                outer.route(self)

            def do_HEAD(self):
                outer.requests.append(("HEAD", self.path, {k.lower(): v for k, v in self.headers.items()}))
                outer.route(self, head=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ranges(self, path_part: str) -> list[str | None]:
        return [h.get("range") for m, p, h in self.requests if m == "GET" and path_part in p]

    @staticmethod
    def send(h, status: int, body: bytes = b"", headers: dict | None = None, head=False):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def send_bytes(self, h, key: str, data: bytes, head=False, extra: dict | None = None):
        """A blob, honouring Range, with the cut/corrupt faults."""
        if key in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])      # the last byte: inside any range asked
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
        if start > len(data):
            return self.send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
        part = data[start:]
        h.send_response(206 if rng else 200)
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(part)))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if head:
            return
        n = self.cut.pop(key, None)
        if n is not None:
            h.wfile.write(part[:n])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(part)


class OllamaRegistry(_Server):
    """`add(name, tag, layers)` with layers [(mediaType, bytes)]: a config blob is added first."""

    def __init__(self):
        self.manifests: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        super().__init__()

    def add(self, name: str, tag: str, layers: list[tuple[str, bytes]], ns: str = "library") -> dict:
        def blob(media, data):
            d = "sha256:" + hashlib.sha256(data).hexdigest()
            self.blobs[d] = data
            return {"mediaType": media, "digest": d, "size": len(data)}
        config = blob("application/vnd.docker.container.image.v1+json",
                      json.dumps({"model_format": "gguf", "model_family": "qwen3moe"}).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": config, "layers": [blob(m, d) for m, d in layers]}
        self.manifests[f"/v2/{ns}/{name}/manifests/{tag}"] = json.dumps(manifest).encode()
        return manifest

    def route(self, h, head=False):
        path = urlparse(h.path).path
        if path in self.manifests:
            return self.send(h, 200, self.manifests[path], {"Content-Type": "application/vnd.docker."
                                                            "distribution.manifest.v2+json"}, head)
        if "/blobs/" in path and path.rsplit("/", 1)[1] in self.blobs:
            d = path.rsplit("/", 1)[1]
            return self.send_bytes(h, d, self.blobs[d], head)
        self.send(h, 404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}', head=head)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HfHub(_Server):
    """`add(repo, files)`: one commit of the repo; files ending in an LFS suffix are LFS files."""

    LFS = (".safetensors", ".gguf", ".bin")

    def __init__(self, token: str | None = None):
        self.repos: dict[str, tuple[str, dict[str, bytes]]] = {}
        self.token = token
        super().__init__()

    def add(self, repo: str, files: dict[str, bytes]) -> str:
        commit = hashlib.sha1(repo.encode() + "\0".join(sorted(files)).encode()).hexdigest()
        self.repos[repo] = (commit, files)
        return commit

    def _sibling(self, name: str, data: bytes) -> dict:
        s = {"rfilename": name, "size": len(data)}
        if name.endswith(self.LFS):
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n" \
                      f"size {len(data)}\n".encode()
            s.update(blobId=git_blob_sha1(pointer), lfs={"sha256": hashlib.sha256(data).hexdigest(),
                                                         "size": len(data), "pointerSize": len(pointer)})
        else:
            s["blobId"] = git_blob_sha1(data)
        return s

    def _denied(self, h) -> bool:
        return self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}"

    def route(self, h, head=False):
        path = urlparse(h.path).path
        not_found = {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}
        if path.startswith("/cdn/"):
            sha = path[5:]
            for _, files in self.repos.values():
                for data in files.values():
                    if hashlib.sha256(data).hexdigest() == sha:
                        return self.send_bytes(h, sha, data, head)
            return self.send(h, 404, b"", head=head)
        if path.startswith("/api/models/"):
            repo, _, rev = path[len("/api/models/"):].partition("/revision/")
            if repo not in self.repos or self._denied(h):
                return self.send(h, 401 if self._denied(h) else 404,
                                 b'{"error":"Repository not found"}', not_found, head)
            commit, files = self.repos[repo]
            if rev not in ("main", commit):
                return self.send(h, 404, b'{"error":"Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, head)
            body = {"id": repo, "modelId": repo, "sha": commit, "private": False,
                    "siblings": [self._sibling(n, d) for n, d in sorted(files.items())]}
            return self.send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if repo not in self.repos or self._denied(h):
                return self.send(h, 404, b"", not_found, head)
            commit, files = self.repos[repo]
            if rev not in ("main", commit) or name not in files:
                return self.send(h, 404, b"", {"X-Error-Code": "EntryNotFound"}, head)
            data = files[name]
            meta = {"X-Repo-Commit": commit, "ETag": f'"{self._sibling(name, data)["blobId"]}"'}
            if name.endswith(self.LFS):
                sha = hashlib.sha256(data).hexdigest()
                meta.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)), "Location": f"/cdn/{sha}"})
                return self.send(h, 302, b"", meta, head)
            return self.send_bytes(h, name, data, head, meta)
        self.send(h, 404, b"", head=head)
