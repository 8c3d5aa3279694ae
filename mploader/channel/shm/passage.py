"""How a block a worker made reaches the main process: its descriptor, over a Unix socket.

Blocks are anonymous memory files (``memfd_create``): no name in ``/dev/shm`` that could fill a
container's small tmpfs, be opened by someone else, or be left behind.  The only way to another
process is the descriptor itself.  Each :class:`~mploader.channel.shm.channel.MainChannel` owns
one ``SOCK_SEQPACKET`` socket pair, a *passage*: the main process reads the one end
(:class:`BlockInbox`), every worker of the channel writes to the other (:class:`BlockSender`),
which reaches the worker inherited across ``fork`` or pickled in its spec for spawn, forkserver
and the zygote (multiprocessing hands it over with ``SCM_RIGHTS``).

Wire format: one record per block, ``(worker_pid, block_id, size)`` as three unsigned 64-bit
integers, with the block's descriptor attached (``SCM_RIGHTS``).  A worker sends a block's record
*before* the first payload that refers to it leaves on its result pipe, and a Unix socket queues
a record on the receiving end before ``sendmsg`` returns: so by the time the main process decodes
that payload, the record is waiting, and :meth:`BlockInbox.take` never blocks.

Nothing can leak: a record never read (its worker died, its payload was discarded, the block was
evicted before the main process needed it) holds its descriptor in the socket's queue or in the
inbox, and both are closed with the channel; when every process of a loader is killed at once,
the kernel closes the sockets and the memory is gone with the last mapping.
"""

from __future__ import annotations

import array
import os
import socket
import struct
import weakref

from mploader.channel.shm.errors import BlockVanishedError

_RECORD = struct.Struct("=QQQ")  # worker pid, block id, block size
_RECEIVE_FLAGS = socket.MSG_DONTWAIT | getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_ANCILLARY_BYTES = socket.CMSG_SPACE(array.array("i").itemsize)  # room for one descriptor


def open_passage() -> tuple[BlockInbox, socket.socket]:
    """A new passage: the main process's inbox, and the socket every worker sends on (for the
    workers' specs; the inbox keeps it open for workers started later)."""
    receiving, sending = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return BlockInbox(receiving, sending), sending


class BlockSender:
    """A worker's end: hands each new block's descriptor to the main process."""

    def __init__(self, sending: socket.socket) -> None:
        self._socket = sending
        self._pid = os.getpid()

    def send(self, block_id: int, size: int, descriptor: int) -> None:
        """Send the block's record; the caller closes its ``descriptor`` afterwards."""
        socket.send_fds(self._socket, [_RECORD.pack(self._pid, block_id, size)], [descriptor])

    def close(self) -> None:
        self._socket.close()


class BlockInbox:
    """The main process's end: the descriptors workers sent, by ``(worker_pid, block_id)``."""

    def __init__(self, receiving: socket.socket, sending: socket.socket) -> None:
        self._socket = receiving
        # Kept for workers started later (a new generation, a restart); None in a forked child,
        # where the same object may be the forked worker's own sending end.
        self._sending: socket.socket | None = sending
        self._arrived: dict[tuple[int, int], tuple[int, int]] = {}  # -> (descriptor, size)
        self._ended: set[int] = set()  # pids whose records are closed on arrival
        _inboxes.add(self)

    def take(self, worker_pid: int, block_id: int, size: int) -> int:
        """The descriptor of ``block_id``, which is the caller's to close from now on."""
        key = (worker_pid, block_id)
        if key not in self._arrived:
            self._receive_waiting()
        descriptor, sent_size = self._arrived.pop(key, (-1, 0))
        if descriptor < 0:
            raise BlockVanishedError(
                f"the descriptor of shared-memory block {block_id:#x} of worker pid {worker_pid} "
                f"never arrived: its payload came before it, which a worker never sends"
            )
        if sent_size != size:
            os.close(descriptor)
            raise BlockVanishedError(
                f"shared-memory block {block_id:#x} of worker pid {worker_pid} was sent as "
                f"{sent_size} bytes but its payload says {size}"
            )
        return descriptor

    def drop(self, worker_pid: int, block_ids: tuple[int, ...]) -> None:
        """Blocks the worker evicted: if their records were never taken, close them (a record
        still queued is read first: it was sent before the payload that says the block went)."""
        self._receive_waiting()
        for block_id in block_ids:
            self._close(self._arrived.pop((worker_pid, block_id), None))

    def drop_worker(self, worker_pid: int) -> None:
        """The worker ended: close the records of its blocks never taken, now and to come."""
        self._ended.add(worker_pid)
        self._receive_waiting()
        for key in [key for key in self._arrived if key[0] == worker_pid]:
            self._close(self._arrived.pop(key))

    def close(self) -> None:
        """Close both ends and every record never taken (the kernel closes those still queued).
        Idempotent."""
        _inboxes.discard(self)
        self._socket.close()
        if self._sending is not None:
            self._sending.close()
        for record in self._arrived.values():
            self._close(record)
        self._arrived.clear()

    def _receive_waiting(self) -> None:
        while True:
            try:
                # recvmsg, not socket.recv_fds, which ignores its flags (CPython 3.11)
                data, ancillary, _, _ = self._socket.recvmsg(_RECORD.size, _ANCILLARY_BYTES,
                                                             _RECEIVE_FLAGS)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # closed
                return
            if not data:
                return
            descriptors = _descriptors_in(ancillary)
            if len(data) != _RECORD.size or len(descriptors) != 1:
                for descriptor in descriptors:
                    os.close(descriptor)
                continue
            worker_pid, block_id, size = _RECORD.unpack(data)
            if worker_pid in self._ended:
                os.close(descriptors[0])
                continue
            self._close(self._arrived.pop((worker_pid, block_id), None))
            self._arrived[(worker_pid, block_id)] = (descriptors[0], size)

    @staticmethod
    def _close(record: tuple[int, int] | None) -> None:
        if record is not None:
            os.close(record[0])

    def close_in_child(self) -> None:
        """In a forked child: the inbox is the parent's; drop our copies of its descriptors
        without touching the parent's records."""
        self._socket.close()
        self._sending = None
        for descriptor, _ in self._arrived.values():
            try:
                os.close(descriptor)
            except OSError:
                pass
        self._arrived.clear()


def _descriptors_in(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    descriptors = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors.frombytes(data[: len(data) - len(data) % descriptors.itemsize])
    return list(descriptors)


# Every open inbox of this process, whose receiving end a forked child closes: a child (a forked
# worker among them) never reads the parent's records, and its copy would keep the descriptors
# queued in the socket alive for as long as the child runs.
_inboxes: weakref.WeakSet[BlockInbox] = weakref.WeakSet()


def _close_inherited_inboxes() -> None:
    for inbox in list(_inboxes):
        inbox.close_in_child()
    _inboxes.clear()


os.register_at_fork(after_in_child=_close_inherited_inboxes)
