"""The Hub's HTTP API as `huggingface_hub` calls it (create repo, preupload, commit), in memory:
`faked_hub()` routes every huggingface_hub request to a `FakeHub` that records the committed files."""

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager

from huggingface_hub.utils import _http as hf_http

# the HTTP client library huggingface_hub calls: httpx2 from huggingface_hub 2 on, httpx before (same API)
httpx = getattr(hf_http, "httpx2", None) or hf_http.httpx


class FakeHub:
    """The Hub's HTTP API as `huggingface_hub` calls it (create repo, preupload, commit), in memory."""

    def __init__(self):
        self.created, self.files = [], {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url.endswith("/api/repos/create"):
            self.created.append(json.loads(request.content)["name"])
            return httpx.Response(200, json={"url": "https://huggingface.co/user/ddcl-incrt-tiny"})
        if "/preupload/" in url:
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return httpx.Response(200, json={"files": modes})
        if "/commit/" in url:
            for line in request.content.decode().splitlines():
                entry = json.loads(line)
                if entry["key"] == "file":
                    self.files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
            commit = {"commitUrl": f"https://huggingface.co/user/ddcl-incrt-tiny/commit/{'1' * 40}"}
            return httpx.Response(200, json={**commit, "commitOid": "1" * 40})
        return httpx.Response(200, json={})


@contextmanager
def faked_hub() -> Iterator[FakeHub]:
    hub = FakeHub()
    hf_http.set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(hub)))
    try:
        yield hub
    finally:
        hf_http.set_client_factory(hf_http.default_client_factory)
