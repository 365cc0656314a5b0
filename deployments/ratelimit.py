"""Per-client token buckets for the ingress (LLMServingConfig.rate_limit).

A bucket holds up to `burst` tokens and refills at `rate` tokens per second; a request takes one token or, when
the bucket is empty, is refused with the number of seconds until one is back (the Retry-After header). Buckets are
kept per client key in least-recently-seen order and the oldest is dropped beyond `max_clients`, so a flood of
distinct clients costs bounded memory (a dropped client comes back with a full bucket).
"""
from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict


class TokenBuckets:
    def __init__(self, rate: float, burst: int, max_clients: int = 100_000):
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate must be > 0, burst and max_clients >= 1")
        self.rate, self.burst, self.max_clients = float(rate), float(burst), max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, last refill time)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, now: float | None = None) -> float:
        """Take one token for `key`: 0.0 when allowed, else the seconds until a token is available (nothing taken).
        Not thread-safe: the ingress calls it from its event loop only."""
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait


def retry_after_header(wait_s: float) -> str:
    """Retry-After in whole seconds (RFC 9110), at least 1."""
    return str(max(1, math.ceil(wait_s)))


def client_key(headers, client_host: str | None, key: str, trust_forwarded_for: bool) -> str:
    """The bucket key of a request: its API key (hashed: buckets never hold secrets) or its client address."""
    if key == "api_key":
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return "key:" + hashlib.sha256(token.strip().encode("utf-8", "replace")).hexdigest()[:32]
    if trust_forwarded_for:
        forwarded = headers.get("x-forwarded-for", "")
        first = forwarded.split(",")[0].strip()
        if first:
            return "ip:" + first[:64]
    return "ip:" + (client_host or "unknown")
