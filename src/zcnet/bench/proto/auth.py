"""The handshake's challenge-response: HMAC-SHA256 over a fresh challenge, compared in constant
time, so the token never crosses the wire."""

from __future__ import annotations

import hashlib
import hmac
import secrets

CHALLENGE_BYTES = 32


def new_challenge() -> str:
    return secrets.token_hex(CHALLENGE_BYTES)


def auth_mac(token: bytes, challenge: str) -> str:
    return hmac.new(token, b"zcnet-auth-v1:" + challenge.encode(), hashlib.sha256).hexdigest()


def check_mac(token: bytes, challenge: str, mac: str) -> bool:
    return hmac.compare_digest(auth_mac(token, challenge).encode(), mac.encode())
