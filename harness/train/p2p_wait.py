"""How long the training loop's thread is held at point-to-point ops, per phase of the step.

A pipeline stage waits at its receives for its neighbour by design (the pipeline's bubble), and
longer for a slow neighbour: its phase times then carry the neighbour's slowness. The time held
there, per phase, tells the two apart (the collector measures it from the trace:
harness/collect/read/runup.p2p_wait; this is the same quantity in the step log, for the watch
and the scalars, with no trace).

Where the waiting happens: torch.distributed's blocking `send` and `recv` call their Work's
`wait()` from Python, as does a loop on the handles `isend`, `irecv` and `batch_isend_irecv`
return. While a Run is open, `Work.wait` (the class's, so that no handle torch gives back is
replaced) is wrapped: a wait on a point-to-point Work (its op type SEND, RECV or
RECVANYSOURCE; under NCCL `batch_isend_irecv` gives one COALESCED Work per batch, counted when
the batch came from `torch.distributed.batch_isend_irecv`, which is wrapped too to note it) in
the thread that marks the steps is timed:
1. CPU (gloo): the wait blocks the thread until the transfer is done: its wall time;
2. GPU (NCCL): the wait makes the current stream wait for the transfer and returns at once:
   a CUDA event on the current stream before it and one after; the device time between them
   is the stream's stall (ProcessGroupNCCL starts the op only after the stream's work before
   the call, so a receive waited on at once stalls the stream from its start to its end),
   resolved with the step's other events (timing.py);
3. the time goes to the phase open when the wait returned (a wait outside a step or after the
   step's last phase counts nowhere).
What it does not see: waits done in C++ (DDP's reducer, a backend's own threads) and handles a
module bound before the Run opened (`from torch.distributed import batch_isend_irecv`: its
COALESCED batches are not told from a coalesced collective, and are left out). Cost: a Python
call and an op-type read per wait of any kind while on (~1 us), two CUDA events per
point-to-point wait on GPU.
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


class P2PWaitTimer:
    """Hands this process's waits at point-to-point ops to `on_wait` while installed (CPU: the
    wait's ms; GPU: the CUDA events before and after it, StepClock.add_p2p_wait); one at a
    time per process."""

    def __init__(self, cuda: bool, on_wait: Callable[[float | tuple[Any, Any]], None]) -> None:
        self.cuda = cuda
        self.on_wait = on_wait
        self.thread = threading.get_ident()
        self._batches: dict[int, Any] = {}  # id -> Work of batch_isend_irecv's, held until waited
        op_type = getattr(torch._C._distributed_c10d, "OpType", None)
        # Work._get_op_type() gives the OpType's number, not the enum
        self._p2p = {int(getattr(op_type, n)) for n in P2P_OP_NAMES if hasattr(op_type, n)}
        self._batch = int(getattr(op_type, BATCH_OP_NAME)) if hasattr(op_type, BATCH_OP_NAME) else None
        self._installed: tuple[Any, Any] | None = None

    def install(self) -> bool:
        """Wrap `Work.wait` and `batch_isend_irecv`; False where this torch has no Work op types
        or another timer is installed."""
        global _active
        if _active is not None or not self._p2p or not dist.is_available():
            return False
        work_wait, batch = dist.Work.wait, dist.batch_isend_irecv
        timer = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if _active is not timer or threading.get_ident() != timer.thread or not timer._counts(work):
                return work_wait(work, *args, **kwargs)
            return timer._timed(work_wait, work, args, kwargs)

        def batch_isend_irecv(p2p_op_list: Any) -> Any:
            works = batch(p2p_op_list)
            if _active is timer and threading.get_ident() == timer.thread:
                timer._note_batch(works)
            return works

        dist.Work.wait = wait  # type: ignore[method-assign,assignment]
        dist.batch_isend_irecv = batch_isend_irecv
        self._installed = (work_wait, batch)
        _active = self
        return True

    def uninstall(self) -> None:
        """Put torch's own back (where nothing replaced ours since)."""
        global _active
        if self._installed is None:
            return
        work_wait, batch = self._installed
        dist.Work.wait = work_wait  # type: ignore[method-assign]
        dist.batch_isend_irecv = batch
        self._installed = None
        self._batches.clear()
        if _active is self:
            _active = None

    def _note_batch(self, works: Any) -> None:
        """Hold batch_isend_irecv's COALESCED Works (NCCL's) until waited; gloo's are SEND and
        RECV Works, counted by their type. A batch never waited on is dropped after
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

    def _counts(self, work: Any) -> bool:
        try:
            kind = int(work._get_op_type())
        except Exception:  # noqa: BLE001 - a Work without an op type: not one of ours to time
            return False
        if kind in self._p2p:
            return True
        return kind == self._batch and self._batches.pop(id(work), None) is not None

    def _timed(self, work_wait: Callable[..., Any], work: Any, args: Any, kwargs: Any) -> Any:
        if self.cuda:
            before = torch.cuda.Event(enable_timing=True)
            before.record()
            out = work_wait(work, *args, **kwargs)
            after = torch.cuda.Event(enable_timing=True)
            after.record()
            self.on_wait((before, after))
            return out
        t0 = time.perf_counter()
        try:
            return work_wait(work, *args, **kwargs)
        finally:
            self.on_wait((time.perf_counter() - t0) * 1e3)


_active: P2PWaitTimer | None = None
