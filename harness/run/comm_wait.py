"""How long the training loop's thread is held waiting for communication, per phase of the step:
at point-to-point ops apart from collectives.

A pipeline stage waits at its receives for its neighbour by design (the pipeline's bubble), and
longer for a slow neighbour: its phase times then carry the neighbour's slowness. A rank that
all-reduces its gradients or metrics inside a phase of its own work (a stage's gradient
all-reduce after its last backward pass, a loss logged every step) waits there for its slowest
peer. The time held at each, per phase, tells a slow rank from the ranks it holds up (the
collector measures the same from the trace: harness/traces/read/runup.p2p_wait; this is the
step log's, for the watch and the scalars, with no trace).

Where the waiting happens: torch.distributed's blocking calls (`send`, `recv`, a collective
without `async_op`) call their Work's `wait()` from Python, as does a loop on the handles that
`isend`, `irecv`, `batch_isend_irecv` and `async_op=True` return. While a Run is open,
`Work.wait` (the class's, so that no handle torch gives back is replaced) is wrapped; a wait in
the thread that marks the steps is timed:
1. CPU (gloo): the wait blocks the thread until the op is done: its wall time;
2. GPU (NCCL): the wait makes the current stream wait for the op and returns at once: a CUDA
   event on the current stream before it and one after; the device time between them is the
   stream's stall (ProcessGroupNCCL starts an op only after the stream's work before the call,
   so an op waited on at once stalls the stream from its start to its end), resolved with the
   step's other events (timing.py);
3. the time goes to the phase open when the wait returned (a wait outside a step or after the
   step's last phase counts nowhere), as point-to-point where the Work's op type is SEND, RECV
   or RECVANYSOURCE, or under NCCL the one COALESCED Work of a `batch_isend_irecv` batch
   (`torch.distributed.batch_isend_irecv` is wrapped too, to note its batches), else as a
   collective's.
Each send and receive is noted too, in the order issued (`ProcessGroup.send` and `recv`, which
every one of them above calls from Python, wrapped likewise), a receive with its source as a
global rank: a pipeline stage's first point-to-point op in a step is a receive of its
activations from the stage before it, a first stage's a send, so the step's first op gives each
rank its place in the pipeline (the watch compares a stage's ranks with each other,
watch_rule.stages), whatever the loop's phases are called.
What it does not see: waits done in C++ (DDP's reducer, FSDP's stream waits, a backend's own
threads) and batches from a `batch_isend_irecv` a module bound before the Run opened (`from
torch.distributed import batch_isend_irecv`: NCCL's COALESCED Work is then not told from a
coalesced collective's). Cost: a Python call and an op-type read per wait (bench/RESULTS.md,
"Detection", timing each wait on communication), two CUDA events per wait on GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

P2P_OP_NAMES = ("SEND", "RECV", "RECVANYSOURCE")
BATCH_OP_NAME = "COALESCED"  # NCCL's one Work per batch_isend_irecv batch
# batches held for their wait at most (a pipeline holds a few per stage and micro-batch)
MAX_BATCHES_HELD = 1024

# What a timed wait hands on: its ms (CPU) or the CUDA events before and after it (GPU), and
# whether it was a point-to-point op's (else a collective's).
Wait = float | tuple[Any, Any]


class CommWaitTimer:
    """Hands this process's waits on communication to `on_wait(wait, p2p)` while installed
    (StepClock.add_comm_wait) and its sends and receives to `on_p2p`; one at a time per
    process."""

    def __init__(
        self,
        cuda: bool,
        on_wait: Callable[[Wait, bool], None],
        on_p2p: Callable[[int | None], None] = lambda src: None,
    ) -> None:
        self.cuda = cuda
        self.on_wait = on_wait
        self.on_p2p = on_p2p  # each send (None) and receive (its source, a global rank): StepClock.add_p2p_op
        self.thread = threading.get_ident()
        self._batches: dict[int, Any] = {}  # id -> Work of batch_isend_irecv's, held until waited
        op_type = getattr(torch._C._distributed_c10d, "OpType", None)
        # Work._get_op_type() gives the OpType's number, not the enum
        self._p2p = {int(getattr(op_type, n)) for n in P2P_OP_NAMES if hasattr(op_type, n)}
        self._batch = int(getattr(op_type, BATCH_OP_NAME)) if hasattr(op_type, BATCH_OP_NAME) else None
        self._installed: tuple[Any, Any, Any, Any] | None = None

    def install(self) -> bool:
        """Wrap `Work.wait`, `batch_isend_irecv`, `ProcessGroup.send` and `ProcessGroup.recv`;
        False where this torch has no Work op types or another timer is installed."""
        global _active
        if _active is not None or not self._p2p or not dist.is_available():
            return False
        work_wait, batch = dist.Work.wait, dist.batch_isend_irecv
        pg_send, pg_recv = dist.ProcessGroup.send, dist.ProcessGroup.recv
        timer = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if _active is not timer or threading.get_ident() != timer.thread:
                return work_wait(work, *args, **kwargs)
            p2p = timer._is_p2p(work)
            if p2p is None:
                return work_wait(work, *args, **kwargs)
            return timer._timed(work_wait, work, args, kwargs, p2p)

        def batch_isend_irecv(p2p_op_list: Any) -> Any:
            works = batch(p2p_op_list)
            if _active is timer and threading.get_ident() == timer.thread:
                timer._note_batch(works)
            return works

        def send(group: Any, *args: Any, **kwargs: Any) -> Any:
            work = pg_send(group, *args, **kwargs)
            if _active is timer and threading.get_ident() == timer.thread:
                timer.on_p2p(None)
            return work

        def recv(group: Any, tensors: Any, src: int, *args: Any, **kwargs: Any) -> Any:
            work = pg_recv(group, tensors, src, *args, **kwargs)
            if _active is timer and threading.get_ident() == timer.thread:
                timer._note_source(group, src)
            return work

        dist.Work.wait = wait  # type: ignore[method-assign,assignment]
        dist.batch_isend_irecv = batch_isend_irecv
        dist.ProcessGroup.send = send  # type: ignore[method-assign,assignment]
        dist.ProcessGroup.recv = recv  # type: ignore[method-assign,assignment]
        self._installed = (work_wait, batch, pg_send, pg_recv)
        _active = self
        return True

    def uninstall(self) -> None:
        """Put torch's own back."""
        global _active
        if self._installed is None:
            return
        work_wait, batch, pg_send, pg_recv = self._installed
        dist.Work.wait = work_wait  # type: ignore[method-assign]
        dist.batch_isend_irecv = batch
        dist.ProcessGroup.send = pg_send  # type: ignore[method-assign]
        dist.ProcessGroup.recv = pg_recv  # type: ignore[method-assign]
        self._installed = None
        self._batches.clear()
        if _active is self:
            _active = None

    def _note_source(self, group: Any, src: int) -> None:
        """A receive's source as a global rank (a group's ranks are numbered within it)."""
        try:
            source = dist.get_global_rank(group, int(src))
        except Exception:  # noqa: BLE001 - a group torch cannot map (not registered): its source unknown
            source = -1
        self.on_p2p(source)

    def _note_batch(self, works: Any) -> None:
        """Hold batch_isend_irecv's COALESCED Works (NCCL's) until waited; gloo's are SEND and
        RECV Works, told by their type. A batch never waited on is dropped after
        MAX_BATCHES_HELD newer ones."""
        for w in works or ():
            try:
                coalesced = int(w._get_op_type()) == self._batch
            except Exception:  # noqa: BLE001 - no op type: nothing to note
                continue
            if coalesced:
                self._batches[id(w)] = w
        while len(self._batches) > MAX_BATCHES_HELD:
            self._batches.pop(next(iter(self._batches)))

    def _is_p2p(self, work: Any) -> bool | None:
        """Whether `work` is a point-to-point op's (True) or a collective's (False); None for a
        Work without an op type, which is not timed."""
        try:
            kind = int(work._get_op_type())
        except Exception:  # noqa: BLE001 - a Work without an op type: not one to time
            return None
        if kind in self._p2p:
            return True
        return kind == self._batch and self._batches.pop(id(work), None) is not None

    def _timed(self, work_wait: Callable[..., Any], work: Any, args: Any, kwargs: Any, p2p: bool) -> Any:
        if self.cuda:
            before = torch.cuda.Event(enable_timing=True)
            before.record()
            out = work_wait(work, *args, **kwargs)
            after = torch.cuda.Event(enable_timing=True)
            after.record()
            self.on_wait((before, after), p2p)
            return out
        t0 = time.perf_counter()
        try:
            return work_wait(work, *args, **kwargs)
        finally:
            self.on_wait((time.perf_counter() - t0) * 1e3, p2p)


_active: CommWaitTimer | None = None
