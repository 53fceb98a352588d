"""Per-fit bearer token, checked by Flight server middleware before any call body is read.

Clients send the header ``authorization: Bearer <token>``; the server compares it with
``hmac.compare_digest`` (constant time). ``start_call`` runs when gRPC accepts the call,
before the handler reads a request body, so an unauthenticated ``DoPut`` never gets its
record batches parsed.
"""

from __future__ import annotations

import hmac
import secrets

import pyarrow.flight as flight

HEADER = "authorization"
SCHEME = "Bearer "


def new_token() -> str:
    """A fresh random token: 32 random bytes as 64 hex characters (``secrets.token_hex(32)``)."""
    return secrets.token_hex(32)


def auth_headers(token: str) -> list[tuple[bytes, bytes]]:
    """The call headers a client sends for ``token``."""
    return [(HEADER.encode(), (SCHEME + token).encode())]


class BearerTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Rejects every call whose ``authorization`` header is not ``Bearer <token>``.

    Raises (to the client):
        flight.FlightUnauthenticatedError: header missing, malformed, or a wrong token.
    """

    def __init__(self, token: str) -> None:
        super().__init__()
        if not token:
            raise ValueError("token must be a non-empty string. Received: an empty token")
        self._expected = (SCHEME + token).encode()
        self.refused = 0  # calls refused so far

    def start_call(self, info, headers):
        values = headers.get(HEADER) or headers.get(HEADER.encode()) or []
        if len(values) != 1:
            self.refused += 1
            raise flight.FlightUnauthenticatedError(
                f"every call must carry exactly one header '{HEADER}: Bearer <token>'. Received: {len(values)} such headers"
            )
        value = values[0]
        value = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        if not hmac.compare_digest(value, self._expected):
            self.refused += 1
            raise flight.FlightUnauthenticatedError(
                f"header '{HEADER}' must hold this fit's bearer token. Received: a wrong or malformed token"
            )
        return None
