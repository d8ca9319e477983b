"""The bearer token both listeners (gRPC and HTTP) require, checked the same way by each."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

# Optional whitespace around a header value (RFC 9110, 5.5).
_WHITESPACE = b" \t"


class BearerToken:
    """Checks `authorization: Bearer <token>` headers against the configured token.

    The scheme is case-insensitive (RFC 7235); two Authorization headers are refused rather than picking one;
    the token is compared in constant time (digests, so not even its length shows). Spaces and tabs around the
    token are not part of it, as HTTP says of every header value: HTTP's server strips them before this sees
    them, gRPC's metadata keeps them, and both APIs must accept the same headers.
    """

    def __init__(self, token: str) -> None:
        self._expected = hashlib.sha256(token.encode()).digest()

    def refusal(self, sent: Sequence[str | bytes]) -> str | None:
        """Why the Authorization header values sent are refused, or None when they are accepted."""
        if not sent:
            return "missing bearer token"
        if len(sent) > 1:
            return "more than one authorization header"
        credentials = sent[0].encode() if isinstance(sent[0], str) else sent[0]
        scheme, _, token = credentials.partition(b" ")
        if scheme.lower() != b"bearer":
            return "the authorization header is not a bearer token"
        if not hmac.compare_digest(hashlib.sha256(token.strip(_WHITESPACE)).digest(), self._expected):
            return "wrong bearer token"
        return None
