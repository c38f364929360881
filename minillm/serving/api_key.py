"""A key for a room's network: with `serve --api-key KEY` (or MINILLM_API_KEY), a request must carry
`Authorization: Bearer KEY`, or it is answered 401 before it reaches the app, let alone the engine.

What needs the key follows vLLM's AuthenticationMiddleware (vllm/entrypoints/openai/api_server.py, `--api-key` or
VLLM_API_KEY): every path under /v1 (the generation endpoints and the model list); OPTIONS (a browser's preflight)
and the paths outside /v1 stay open there, so a load balancer or Prometheus can check /health and /metrics without
the key: they hold counts and timings, nothing anyone typed. One more here: GET /trace (the live view's feed) holds
every prompt and reply the engine saw lately, so it asks for the key too.

The key is compared in constant time: both sides hashed (SHA-256, as vLLM does: equal lengths, so the comparison
cannot leak the key's length either) and the digests compared with hmac.compare_digest. The answer never repeats
what was sent (OpenAI's echoes part of a wrong key; a log of answers would then hold most of a near miss).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

ENV = "MINILLM_API_KEY"  # read when --api-key is not given (as vLLM reads VLLM_API_KEY)
GUARDED = ("/v1", "/trace")  # the paths (and what lies under them) that need the key
OPEN_METHODS = ("OPTIONS",)  # vLLM lets a CORS preflight through: it carries no credentials by design


def api_key_from(flag: str | None) -> str | None:
    """The key the server asks for: --api-key's, else MINILLM_API_KEY's; None (or empty): no key, as before."""
    return flag or os.environ.get(ENV) or None


def refusal(missing: bool) -> dict:
    """OpenAI's 401 body (type invalid_request_error, code invalid_api_key), without the key that was sent."""
    what = "no API key was sent" if missing else "the API key sent is not this server's"
    message = (f"{what}: send it in an Authorization header, `Authorization: Bearer KEY` (the openai client: "
               "api_key=KEY; minillm load: --api-key or MINILLM_API_KEY)")  # fmt: skip
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


class ApiKeyMiddleware:
    """Pure ASGI: a guarded request without the right bearer token gets the 401 here; everything else passes."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.digest = hashlib.sha256(api_key.encode()).digest()

    def guarded(self, scope) -> bool:
        if scope["type"] != "http" or scope["method"] in OPEN_METHODS:
            return False
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        return any(path == p or path.startswith(p + "/") for p in GUARDED)

    def verdict(self, scope) -> dict | None:
        """None: let it in; else the 401 body."""
        headers = [value for name, value in scope["headers"] if name == b"authorization"]
        scheme, _, token = headers[0].partition(b" ") if headers else (b"", b"", b"")
        if scheme.lower() != b"bearer" or not token.strip():
            return refusal(missing=True)
        if not hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self.digest):
            return refusal(missing=False)
        return None

    async def __call__(self, scope, receive, send) -> None:
        body = self.verdict(scope) if self.guarded(scope) else None
        if body is None:
            return await self.app(scope, receive, send)
        content = json.dumps(body, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                   (b"www-authenticate", b'Bearer realm="minillm"')]  # fmt: skip
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": content})
