"""The replica <-> draft actor channel: messages arrive intact whatever their buffers' sizes, large buffers go
through the shared-memory arena (grown on demand), and a received buffer is the receiver's own copy."""
from __future__ import annotations

import threading
from multiprocessing import Pipe

import numpy as np
import torch

from draft_service.actor import Packed
from draft_service.channel import INLINE_BYTES, Channel


def test_messages_of_every_size_arrive_intact_and_are_the_receivers_own():
    a, b = Pipe()  # a Unix socket pair, as Listener/Client give
    proxy, actor = Channel(a), Channel(b)
    rng = np.random.default_rng(0)
    sizes = [0, 10, INLINE_BYTES - 1, INLINE_BYTES, 3_000_000, 100, 9_000_000, 2_000_000]
    messages = [("step", [f"k{n}"], (rng.integers(0, 255, n, dtype=np.uint8), {"n": n}, None)) for n in sizes]
    messages.append(("mixed", [], [rng.random(5000), rng.random(200_000), rng.random(7)]))

    def echo():  # the actor's side: strictly one reply per request
        for _ in messages:
            actor.send(actor.recv())

    t = threading.Thread(target=echo)
    t.start()
    got, arenas = [], []
    for m in messages:
        proxy.send(m)
        got.append(proxy.recv(timeout=30))
        arenas.append(None if proxy.in_arena is None else len(proxy.in_arena))
    t.join()
    # Every array equals what was sent, including the early ones whose arena bytes later messages overwrote.
    for want, have in zip(messages, got):
        assert have[:2] == want[:2]
        for x, y in zip(have[2], want[2]):
            assert np.array_equal(x, y) if isinstance(y, np.ndarray) else x == y
            if isinstance(x, np.ndarray):
                assert x.flags.writeable
    assert arenas[:4] == [None, None, None, INLINE_BYTES] and arenas[4] == 3_000_000 and arenas[6] >= 9_000_000
    assert arenas[7] == arenas[6]  # a smaller message reuses the arena
    proxy.close()
    actor.close()


def test_a_timeout_is_an_error_not_a_hang():
    a, b = Pipe()
    receiver = Channel(b)
    try:
        receiver.recv(timeout=0.05)
    except TimeoutError as exc:
        assert "no reply" in str(exc)
    else:
        raise AssertionError("recv returned without a message")
    Channel(a).close()
    receiver.close()


def test_packed_tensors_cross_the_channel_exactly():
    a, b = Pipe()
    sender, receiver = Channel(a), Channel(b)
    probs = torch.rand(16, 7, 12288)  # a sampled round's p_d: through the arena
    taps = torch.randn(3, 1728).to(torch.bfloat16)
    t = threading.Thread(target=sender.send, args=((Packed.of(probs), Packed.of(taps)),))
    t.start()
    p, q = receiver.recv(timeout=30)
    t.join()
    assert torch.equal(p.tensor(), probs) and torch.equal(q.tensor(), taps) and q.tensor().dtype == torch.bfloat16
