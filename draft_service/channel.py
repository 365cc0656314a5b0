"""The link between an engine replica and its draft actor: one Unix socket between two processes on one node (the
actor sits in the replica's own placement-group bundle), carrying request/reply messages.

Why not Ray calls: a Ray actor call's round trip costs many times a socket's, a sizeable share of a draft round at
batch 1. Ray's compiled graphs are as fast but their reader polls: an idle
actor kept a whole core busy.

Messages are pickled with protocol 5 and their buffers (numpy arrays: tap rows, draft probabilities) travel out of
band: small ones on the socket, large ones through a shared-memory arena (a memfd, passed over the socket when it
is created or grown), since the socket moves large buffers far below memory speed. Each side writes only its own
arena and the protocol is strictly request then reply, so a reader has copied a message out before the writer can
reuse the arena.
"""
from __future__ import annotations

import mmap
import os
import pickle
import uuid
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.reduction import recv_handle, send_handle

INLINE_BYTES = 1 << 16  # buffers at least this large go through the arena


class Channel:
    def __init__(self, conn: Connection):
        self.conn = conn
        self.out_arena: mmap.mmap | None = None
        self.in_arena: mmap.mmap | None = None

    @classmethod
    def connect(cls, address: str, authkey: bytes) -> Channel:
        return cls(Client(address, family="AF_UNIX", authkey=authkey))

    def send(self, obj) -> None:
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        large = sum(r.nbytes for r in raws if r.nbytes >= INLINE_BYTES)
        capacity = len(self.out_arena) if self.out_arena is not None else 0
        new_arena = large > capacity
        if new_arena:
            fd = os.memfd_create("dspark-draft-arena")
            size = max(large, 2 * capacity)
            os.ftruncate(fd, size)
            if self.out_arena is not None:
                self.out_arena.close()
            self.out_arena = mmap.mmap(fd, size)
        layout, offset = [], 0
        for r in raws:
            if r.nbytes >= INLINE_BYTES:
                self.out_arena[offset:offset + r.nbytes] = r
                layout.append((offset, r.nbytes))
                offset += r.nbytes
            else:
                layout.append((None, r.nbytes))
        self.conn.send((head, layout, new_arena))
        if new_arena:
            send_handle(self.conn, fd, None)  # the pid is only used on Windows
            os.close(fd)
        for r in raws:
            if 0 < r.nbytes < INLINE_BYTES:
                self.conn.send_bytes(r)

    def recv(self, timeout: float | None = None):
        if timeout is not None and not self.conn.poll(timeout):
            raise TimeoutError(f"no reply from the draft actor within {timeout} s")
        head, layout, new_arena = self.conn.recv()
        if new_arena:
            fd = recv_handle(self.conn)
            if self.in_arena is not None:
                self.in_arena.close()
            self.in_arena = mmap.mmap(fd, os.fstat(fd).st_size)
            os.close(fd)
        buffers = []
        for offset, n in layout:
            if offset is None:
                buf = bytearray(n)
                if n:
                    self.conn.recv_bytes_into(buf)
            else:
                with memoryview(self.in_arena) as view:
                    buf = bytearray(view[offset:offset + n])  # a copy: the sender reuses its arena
            buffers.append(buf)
        return pickle.loads(head, buffers=buffers)

    def close(self) -> None:
        self.conn.close()
        for arena in (self.out_arena, self.in_arena):
            if arena is not None:
                arena.close()
        self.out_arena = self.in_arena = None


def listen(authkey: bytes) -> tuple[Listener, str]:
    """A listener and its address, in Linux's abstract socket namespace: no file to clean up when the process dies."""
    address = f"\0dspark-draft-{uuid.uuid4().hex}"
    return Listener(address, family="AF_UNIX", authkey=authkey), address
