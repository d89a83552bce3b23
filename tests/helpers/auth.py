"""Access control in tests: auth files with freshly minted keys, a JWT issuer with its
own RSA keys, and a tiny HTTP server that publishes its key set."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from app.auth.apikeys import mint

ISSUER = "https://issuer.test"
AUDIENCE = "llog-test"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Keys:
    """API keys minted for principals, and the auth-file lines that hold their hashes."""

    tokens: dict[str, str] = field(default_factory=dict)
    entries: dict[str, str] = field(default_factory=dict)

    def new(self, principal: str) -> str:
        token, stored = mint()
        self.tokens[principal] = token
        self.entries[principal] = str(stored)
        return token


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class Issuer:
    """An RSA signing key with a key id, its public JWKS, and tokens it signs."""

    def __init__(self, issuer: str = ISSUER, audience: str = AUDIENCE) -> None:
        self.issuer = issuer
        self.audience = audience
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex[:8]

    def jwk(self) -> dict[str, Any]:
        jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        jwk.update(kid=self.kid, alg="RS256", use="sig")
        return jwk

    def token(self, sub: str, *, kid: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"sub": sub, "iss": self.issuer, "aud": self.audience,
                                   "iat": now, "exp": now + 300}
        payload.update(claims)
        return jwt.encode({k: v for k, v in payload.items() if v is not None},
                          self.private, algorithm="RS256",
                          headers={"kid": kid or self.kid})


def jwks(*issuers: Issuer) -> dict[str, Any]:
    return {"keys": [i.jwk() for i in issuers]}


class JwksServer:
    """Serves a key set at ``/jwks.json``; ``document`` may be changed while it runs."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                body = json.dumps(server.document).encode()
                self.send_response(200 if self.path == "/jwks.json" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/jwks.json"

    @contextlib.contextmanager
    def running(self) -> Iterator[JwksServer]:
        thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._httpd.shutdown()
            self._httpd.server_close()
            thread.join(timeout=10)
