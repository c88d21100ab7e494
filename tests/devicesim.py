"""A device-queue simulator for the collector's tests: per rank, a host program in; per rank, a
Kineto-shaped trace document out, every time in it exactly known.

A test records each rank's program (`Sim.rank(r)` -> `HostRank`, its calls and `with` blocks in
the order the training loop's host thread would make them), then `Sim.run()` resolves every time
and writes the documents. The model (times in microseconds, floats; per rank one host thread,
the main thread, and one GPU, device index 0):
1. Host clock: each rank's starts at `start_us` (default 0). `cpu(us, name)` is a `cpu_op` event
   [t, t + us] on the main thread and advances t; `sleep(us)` advances t with no event;
   `op(name)`, `range(name)` and `step(n)` are context managers whose event (`cpu_op`, or
   `user_annotation`: a record_function range, `ProfilerStep#n` for a step) spans from entry to
   exit; they nest (steps do not nest in one another).
2. `launch(name, dur_us, stream=7, kind=..., after=None, args=None)`: a `cuda_runtime` call
   (`cudaLaunchKernel`; `cudaMemcpyAsync` for kind "memcpy", `cudaMemsetAsync` for "memset") of
   `launch_cost_us` at host t, with `args.correlation` a fresh id (per rank, increasing; every
   cuda_runtime call takes one), then t += launch_cost_us. The device op starts at
   max(the call's start + launch_latency_us, the end of the op before it on its stream, the end
   of `after`: a handle of an earlier op of the same rank on any stream, a CUDA event wait) and
   lasts dur_us. Its event: `cat` kernel / gpu_memcpy / gpu_memset, pid = device 0, tid = stream,
   args = {"correlation", "device": 0, "stream", **args}; an `ac2g` flow pair joins the call
   (ph "s") and the op (ph "f", bp "e"), id = correlation. The handle (`DeviceOp`) knows its
   `start_us`/`end_us` once `run()` is done.
3. `collective(coll, transfer_us, ...)`: a `cpu_op` `c10d::<coll>_` (`collective_names`) around a
   `cpu_op` `record_param_comms` (the collective's args) around the launch of an NCCL kernel
   (`ncclDevKernel_<Coll>_..._RING_LL(...)`, on the comm stream 20 by default) with the same args:
   "Collective name", "Process Group Name", "In/Out msg nelems", "dtype", "Group size",
   "Process Group Ranks". Its kernel starts on each rank by the queue rule of 2 and ends on every
   participating rank at (the latest start over them) + transfer_us. The k-th call of a process
   group on each rank is one instance: its ranks must agree on the collective, the group's ranks
   and transfer_us (`ValueError` at the call otherwise); a rank that never makes the call leaves
   the others waiting (a deadlock, 7).
3b. `p2p(kind, peer, transfer_us, ...)`: a send to `peer` or a receive from it, launched as 3
   (`c10d::send` / `c10d::recv_`, an `ncclDevKernel_SendRecv` kernel, args as 3 with "Dst Rank"
   on a send and "Src Rank" on a receive, global ranks, as torch writes them); the k-th send
   from a to b and the k-th receive on b from a are one instance of ranks (a, b), which ends as
   a collective's does (NCCL's point-to-point kernels meet).
4. Blocking calls, each at least `sync_cost_us` (host t -> max(t + sync_cost_us, the latest end
   it waits for)), t moved to its end: `sync()` = `cudaStreamSynchronize` on every op launched
   so far on the stream (kind "device": `cudaDeviceSynchronize`, all streams; kind "event":
   `cudaEventSynchronize` on one handle). `item()` = `cpu_op` aten::item > aten::_local_scalar_dense
   around a `cudaMemcpyAsync` launch (a 2 us "Memcpy DtoH (Device -> Pageable)" on stream 7) and a
   `cudaStreamSynchronize` until it ends. `to_device(bytes_us)` (`.to("cuda")` from pageable
   memory) = aten::to > aten::_to_copy > aten::copy_ around one blocking `cudaMemcpy` from t until
   its "Memcpy HtoD (Pageable -> Device)" (bytes_us, queued on stream 7 behind its work) ends.
   The wrapping cpu ops start and end with the calls inside them (no host time of their own).
5. `gpu_step_annotations=True`: per step with device work, a `gpu_user_annotation`
   `ProfilerStep#n` on the device (pid 0, tid = the stream of the step's first op) from the
   earliest start to the latest end of the ops launched inside the step (as Kineto writes).
6. The document per rank: schemaVersion, deviceProperties (one H100), distributedInfo (nccl, rank,
   world size), baseTimeNanoseconds, host_name when given, and traceEvents: `ph: M` process and
   thread names first (ts = the earliest event's), then the events by ts (an outer event before
   an inner one starting with it). Main thread: pid = tid = main_base + rank (default MAIN_BASE,
   1000, + rank). `seq_args=True`: every collective's args carry "Seq", its position in its
   process group (as torch and Kineto write it from 2026). `sync_rows=True`: each stream or
   device sync also writes CUDA's "Stream Sync" row (`cuda_sync`) over its wait, on the virtual
   thread stream + SYNC_THREAD named "stream N (sync)" (Kineto from 2026).
2b. `graph(kernels, stream)`: a CUDA graph's replay: one `cudaGraphLaunch` call (launch_cost_us)
   whose kernels run back to back on the stream from its start + launch_latency_us, each with
   the call's correlation id, "graph id" and "graph node id".
9. `open_window(doc, first, last)`: a rank's document cut as a profiler window that opened as
   its host entered ProfilerStep#first and closed as it left ProfilerStep#last.
7. Record, then resolve: the calls only record operations; `run()` resolves them in a small
   discrete-event loop until nothing moves: each rank's host runs as far as it can (only a
   blocking call can stop it, until every end it waits for is known); an op's start is known
   once its launch, its stream predecessor's end and its `after`'s end are; a plain op's end is
   its start + dur; a collective's end once every participant's start is. Anything left then
   (a host still blocked, an op that never ends) raises `DeadlockError` naming who waits for what.
8. Ground truth: `Sim.truth()` per rank: device ops (name, kind, stream, launch step, launch,
   start, end), host step intervals, blocking calls, ranges; `write_all` writes the documents.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tracebuild import write

MAIN_BASE = 1000  # rank r's main thread: pid = tid = MAIN_BASE + r
DEVICE = 0
COMPUTE_STREAM = 7
COMM_STREAM = 20
DEFAULT_BASE_NS = 1_700_000_000_000_000_000
D2H = "Memcpy DtoH (Device -> Pageable)"
H2D = "Memcpy HtoD (Pageable -> Device)"
ITEM_COPY_US = 2.0  # the DtoH copy of one scalar
PARAM_COMMS = "record_param_comms"
NCCL_SIGNATURE = "(ncclDevComm*, unsigned long, ncclWork*)"
H100 = {
    "id": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "totalGlobalMem": 84929347584,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 132,
    "sharedMemPerMultiprocessor": 233472,
}

CATEGORY = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
LAUNCH_CALL = {"kernel": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}
SYNC_CALL = {"stream": "cudaStreamSynchronize", "device": "cudaDeviceSynchronize", "event": "cudaEventSynchronize"}
GRAPH_CALL = "cudaGraphLaunch"
SYNC_THREAD = 1_000_000  # 2026: a stream's "Stream Sync" rows on the virtual thread stream + this
DTYPE_SUFFIX = {
    "Float": "f32",
    "Half": "f16",
    "BFloat16": "bf16",
    "Double": "f64",
    "Int": "i32",
    "Long": "i64",
    "Byte": "u8",
    "Char": "i8",
}
# canonical collective -> (NCCL kernel core, "{t}": the dtype's suffix; the c10d op)
COLLECTIVES = {
    "allreduce": ("AllReduce_Sum_{t}", "c10d::allreduce_"),
    "reduce": ("Reduce_Sum_{t}", "c10d::reduce_"),
    "broadcast": ("Broadcast", "c10d::broadcast_"),
    "allgather": ("AllGather", "c10d::allgather_"),
    "allgatherbase": ("AllGather", "c10d::_allgather_base_"),
    "allgatherintotensorcoalesced": ("AllGather", "c10d::allgather_into_tensor_coalesced_"),
    "reducescatter": ("ReduceScatter_Sum_{t}", "c10d::reduce_scatter_"),
    "reducescatterbase": ("ReduceScatter_Sum_{t}", "c10d::_reduce_scatter_base_"),
    "reducescattertensorcoalesced": ("ReduceScatter_Sum_{t}", "c10d::reduce_scatter_tensor_coalesced_"),
    "alltoall": ("SendRecv", "c10d::alltoall_"),
    "alltoallbase": ("SendRecv", "c10d::alltoall_base_"),
    "barrier": ("AllReduce_Sum_u8", "c10d::barrier"),
}
P2P_KERNEL = f"ncclDevKernel_SendRecv{NCCL_SIGNATURE}"  # NCCL runs a send and a receive as one kernel


class DeadlockError(RuntimeError):
    """`Sim.run()` could not finish: a host blocked, or an op that never ends; the message says which."""


@functools.cache
def collective_names(coll: str, dtype: str = "Float") -> tuple[str, str]:
    """(NCCL kernel name, c10d op name) for a collective as named in "Collective name":
    `allreduce` -> ncclDevKernel_AllReduce_Sum_f32_RING_LL(...), c10d::allreduce_; an unknown
    one -> ncclDevKernel_<CamelCase>_RING_LL(...), c10d::<coll>_."""
    key = re.sub(r"[^a-z]", "", coll.lower())
    core, c10d = COLLECTIVES.get(key, (None, None))
    if core is None:
        core = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", coll) if part)
        c10d = f"c10d::{coll}_"
    core = core.format(t=DTYPE_SUFFIX.get(dtype, "f32"))
    return f"ncclDevKernel_{core}_RING_LL{NCCL_SIGNATURE}", c10d


@dataclass(eq=False, slots=True)
class DeviceOp:
    """One op queued on a device stream: the handle `launch`/`collective` return. launch_us,
    start_us and end_us are None until `Sim.run()` resolves them."""

    rank: int
    name: str
    kind: str  # kernel / memcpy / memset
    stream: int
    dur_us: float | None  # None: a collective's kernel (its end comes from its instance)
    after: DeviceOp | None
    args: dict[str, Any]
    corr: int
    step: int | None  # the step open on the host when it was launched
    prev: DeviceOp | None = None  # the op before it on its stream
    instance: _Instance | None = None
    launch_us: float | None = None
    start_us: float | None = None
    end_us: float | None = None
    stage_us: float = 0.0  # host work inside the launching call before the op can start (a pageable copy)

    def describe(self) -> str:
        what = repr(self.name) if self.instance is None else self.instance.describe()
        return f"rank {self.rank}'s {what} on stream {self.stream}"


@dataclass(eq=False, slots=True)
class _Instance:
    """The k-th collective of a process group: one kernel per participating rank."""

    pg: str
    seq: int
    coll: str
    ranks: tuple[int, ...]
    transfer_us: float
    members: dict[int, DeviceOp] = field(default_factory=dict)
    started: int = 0  # members whose kernel has started
    latest_start_us: float = -math.inf

    def describe(self) -> str:
        return f"{self.coll} #{self.seq} of process group {self.pg!r}"

    def start(self, start_us: float) -> None:
        """One member's kernel starts (a member starts only once launched, so once the group's
        every member has started, every one has called): then every kernel ends at the latest
        start + transfer. Counted, not rescanned: a rescan per start is quadratic in the ranks."""
        self.started += 1
        self.latest_start_us = max(self.latest_start_us, start_us)
        if self.started == len(self.ranks):
            end = self.latest_start_us + self.transfer_us
            for m in self.members.values():
                m.end_us = end


@dataclass(eq=False, slots=True)
class _Span:
    """A host event with extent: a cpu op or an annotation, on the main thread."""

    name: str
    cat: str
    args: dict[str, Any]
    start_us: float | None = None
    end_us: float | None = None


@dataclass(eq=False, slots=True)
class _Call:
    """A cuda_runtime call on the main thread; `op`: the device op it launches (None for a sync)."""

    name: str
    corr: int
    op: DeviceOp | None
    step: int | None
    start_us: float | None = None
    end_us: float | None = None
    more: list[DeviceOp] = field(default_factory=list)  # a CUDA graph's other kernels (`graph`)


@dataclass(slots=True)
class _Advance:
    us: float


@dataclass(slots=True)
class _Open:
    span: _Span


@dataclass(slots=True)
class _Close:
    span: _Span


@dataclass(slots=True)
class _Launch:
    call: _Call


@dataclass(slots=True)
class _Block:
    """A blocking call: from host t until every op of `waits` has ended (at least sync_cost_us)."""

    call: _Call
    waits: list[DeviceOp]
    reason: str  # sync / item / to_device


class OpTruth(NamedTuple):  # a tuple, not a frozen dataclass: millions are made at 1024 ranks
    name: str
    kind: str
    stream: int
    step: int | None  # the step its launch was made in
    corr: int
    launch_us: float
    start_us: float
    end_us: float
    coll: str | None = None  # collectives: "Collective name", process group, its position in the group
    pg: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class StepTruth:
    number: int
    start_us: float
    end_us: float


@dataclass(frozen=True)
class SyncTruth:
    call: str  # cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy
    reason: str  # sync / item / to_device
    step: int | None
    start_us: float
    end_us: float


@dataclass(frozen=True)
class RangeTruth:
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class RankTruth:
    rank: int
    ops: list[OpTruth]  # in launch order
    steps: list[StepTruth]
    syncs: list[SyncTruth]
    host_end_us: float  # the host clock once its program is done
    ranges: list[RangeTruth] = field(default_factory=list)  # `range()`s, in the order they opened


class HostRank:
    """One rank's host program, recorded (see the module docstring for what each call models)."""

    def __init__(self, sim: Sim, rank: int, start_us: float) -> None:
        self.sim, self.rank, self.start_us = sim, rank, start_us
        self.program: list[_Advance | _Open | _Close | _Launch | _Block] = []
        self.ops: list[DeviceOp] = []
        self.streams: dict[int, list[DeviceOp]] = {}
        self.spans: list[_Span] = []
        self.calls: list[_Call] = []
        self.blocks: list[_Block] = []
        self.steps: list[tuple[int, _Span]] = []
        self._step: int | None = None
        self._corr = 0
        self._pg_calls: dict[str, int] = {}
        # resolution state
        self.t = start_us
        self.pc = 0
        self.heads: dict[int, int] = {}

    @property
    def main(self) -> tuple[int, int]:
        return self.sim.main_base + self.rank, self.sim.main_base + self.rank

    # -- recording -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.sim.resolved:
            raise RuntimeError("Sim.run() was called already: record everything before running")

    def _open(self, name: str, cat: str, args: dict[str, Any] | None = None) -> _Span:
        self._check_open()
        span = _Span(name, cat, dict(args or {}))
        self.spans.append(span)
        self.program.append(_Open(span))
        return span

    @contextmanager
    def _span(self, name: str, cat: str, args: dict[str, Any] | None = None) -> Iterator[_Span]:
        span = self._open(name, cat, args)
        try:
            yield span
        finally:
            self.program.append(_Close(span))

    @contextmanager
    def step(self, n: int) -> Iterator[None]:
        """`ProfilerStep#n` (user_annotation) from entry to exit; device ops launched inside belong to step n."""
        if self._step is not None:
            raise ValueError(f"rank {self.rank}: step {n} opened inside step {self._step}")
        with self._span(f"ProfilerStep#{n}", "user_annotation") as span:
            self.steps.append((n, span))
            self._step = n
            try:
                yield
            finally:
                self._step = None

    @contextmanager
    def range(self, name: str) -> Iterator[None]:
        """A record_function range (user_annotation) from entry to exit."""
        with self._span(name, "user_annotation"):
            yield

    @contextmanager
    def op(self, name: str, args: dict[str, Any] | None = None) -> Iterator[None]:
        """A cpu op from entry to exit (what it encloses: launches, other ops, syncs)."""
        with self._span(name, "cpu_op", args):
            yield

    def cpu(self, us: float, name: str, args: dict[str, Any] | None = None) -> None:
        """Host busy `us` inside a cpu op named `name`."""
        span = self._open(name, "cpu_op", args)
        self.program += (_Advance(us), _Close(span))

    def sleep(self, us: float) -> None:
        """Host busy `us` with no event (time.sleep, Python between ops)."""
        self._check_open()
        self.program.append(_Advance(us))

    def _next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def _queue(
        self,
        name: str,
        dur_us: float | None,
        stream: int,
        kind: str,
        after: DeviceOp | None,
        args: dict[str, Any] | None,
        call: str,
    ) -> _Call:
        """Record a device op on `stream` and the host call that launches it (not yet in the program)."""
        self._check_open()
        if kind not in CATEGORY:
            raise ValueError(f"kind {kind!r}: one of {sorted(CATEGORY)}")
        if after is not None and after.rank != self.rank:
            raise ValueError(f"rank {self.rank}: after= is rank {after.rank}'s op; a CUDA event waits on its own GPU")
        corr = self._next_corr()
        op = DeviceOp(self.rank, name, kind, stream, dur_us, after, dict(args or {}), corr, self._step)
        queue = self.streams.setdefault(stream, [])
        op.prev = queue[-1] if queue else None
        queue.append(op)
        self.ops.append(op)
        c = _Call(call, corr, op, self._step)
        self.calls.append(c)
        return c

    def launch(
        self,
        name: str,
        dur_us: float,
        stream: int = COMPUTE_STREAM,
        kind: str = "kernel",
        after: DeviceOp | None = None,
        args: dict[str, Any] | None = None,
    ) -> DeviceOp:
        """Launch a device op asynchronously (module docstring, 2); returns its handle."""
        call = self._queue(name, dur_us, stream, kind, after, args, LAUNCH_CALL.get(kind, ""))
        self.program.append(_Launch(call))
        assert call.op is not None
        return call.op

    def graph(
        self, kernels: Sequence[tuple[str, float]], stream: int = COMPUTE_STREAM, graph_id: int = 1
    ) -> list[DeviceOp]:
        """Replay a CUDA graph (module docstring, 2b): one `cudaGraphLaunch` call whose kernels
        `(name, dur_us)` run back to back on `stream`, each with the call's correlation id and
        args "graph id" and "graph node id" (its place in the graph); returns their handles."""
        (name, dur), *rest = kernels
        call = self._queue(name, dur, stream, "kernel", None, {"graph id": graph_id, "graph node id": 0}, GRAPH_CALL)
        assert call.op is not None
        queue = self.streams[stream]
        for k, (name, dur) in enumerate(rest, 1):
            op = DeviceOp(
                self.rank,
                name,
                "kernel",
                stream,
                dur,
                None,
                {"graph id": graph_id, "graph node id": k},
                call.corr,
                self._step,
            )
            op.prev = queue[-1]
            queue.append(op)
            self.ops.append(op)
            call.more.append(op)
        self.program.append(_Launch(call))
        return [call.op, *call.more]

    def collective(
        self,
        coll: str,
        transfer_us: float,
        nelems: int = 1000,
        dtype: str = "Float",
        pg: str = "0",
        stream: int = COMM_STREAM,
        after: DeviceOp | None = None,
        name: str | None = None,
        ranks: Sequence[int] | None = None,
    ) -> DeviceOp:
        """Launch an NCCL collective (module docstring, 3). `ranks`: the process group's ranks
        (default all); `name`: the kernel's name (default `collective_names`)."""
        self._check_open()
        members = self.sim.all_ranks if ranks is None else tuple(sorted(ranks))
        if ranks is not None and self.rank not in members:
            raise ValueError(f"rank {self.rank} calls {coll} on process group {pg!r} of ranks {list(members)}")
        seq = self._pg_calls.get(pg, 0)
        self._pg_calls[pg] = seq + 1
        instance = self.sim._instance(self.rank, pg, seq, coll, members, transfer_us)
        kernel, c10d = collective_names(coll, dtype)
        return self._launch_comm(instance, name or kernel, c10d, coll, pg, members, nelems, dtype, stream, after, {})

    def _launch_comm(
        self,
        instance: _Instance,
        kernel: str,
        c10d: str,
        coll: str,
        pg: str,
        members: tuple[int, ...],
        nelems: int,
        dtype: str,
        stream: int,
        after: DeviceOp | None,
        extra_args: dict[str, Any],
    ) -> DeviceOp:
        """The host ops and the kernel of one member of `instance` (module docstring, 3)."""
        comm_args = {
            "Collective name": coll,
            "Process Group Name": pg,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "dtype": dtype,
            "Group size": len(members),
            "Process Group Ranks": self.sim.ranks_text(members),
            **({"Seq": instance.seq} if self.sim.seq_args else {}),
            **extra_args,
        }
        outer = self._open(c10d, "cpu_op")
        inner = self._open(PARAM_COMMS, "cpu_op", comm_args)
        call = self._queue(kernel, None, stream, "kernel", after, comm_args, LAUNCH_CALL["kernel"])
        assert call.op is not None
        call.op.instance = instance
        instance.members[self.rank] = call.op
        self.program += (_Launch(call), _Close(inner), _Close(outer))
        return call.op

    def p2p(
        self,
        kind: str,
        peer: int,
        transfer_us: float,
        pg: str = "0",
        ranks: Sequence[int] | None = None,
        stream: int = COMM_STREAM,
        after: DeviceOp | None = None,
        nelems: int = 1000,
        dtype: str = "Float",
        batched: bool = False,
    ) -> DeviceOp:
        """Launch an NCCL point-to-point op (module docstring, 3b): `kind` "send" to `peer` or
        "recv" from it, on process group `pg` of `ranks` (default all). `batched`: as
        `batch_isend_irecv` of this one op launches it, its kernel with no args under a cpu_op
        `nccl:coalesced` and no `record_param_comms` around the launch (torch's ncclGroupEnd runs
        after the op's own record scope ended: pytorch/pytorch#194693)."""
        if kind not in ("send", "recv"):
            raise ValueError(f"p2p kind must be send or recv, not {kind!r}")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} sends to or receives from itself")
        members = self.sim.all_ranks if ranks is None else tuple(sorted(ranks))
        if self.rank not in members or peer not in members:
            raise ValueError(
                f"rank {self.rank}: {kind} with rank {peer} on process group {pg!r} of ranks {list(members)}"
            )
        src, dst = (self.rank, peer) if kind == "send" else (peer, self.rank)
        key = f"{pg}:{src}->{dst}"  # the k-th send from src to dst meets the k-th receive on dst from src
        seq = self._pg_calls.get(key, 0)
        self._pg_calls[key] = seq + 1
        instance = self.sim._instance(self.rank, key, seq, "p2p", tuple(sorted((src, dst))), transfer_us)
        if batched:
            outer = self._open("nccl:coalesced", "cpu_op")
            call = self._queue(P2P_KERNEL, None, stream, "kernel", after, {}, LAUNCH_CALL["kernel"])
            assert call.op is not None
            call.op.instance = instance
            instance.members[self.rank] = call.op
            self.program += (_Launch(call), _Close(outer))
            return call.op
        c10d = "c10d::send" if kind == "send" else "c10d::recv_"
        peer_arg = {"Dst Rank": dst} if kind == "send" else {"Src Rank": src}  # torch writes the peer's only
        return self._launch_comm(instance, P2P_KERNEL, c10d, kind, pg, members, nelems, dtype, stream, after, peer_arg)

    def _block(self, call: _Call, waits: list[DeviceOp], reason: str) -> None:
        b = _Block(call, waits, reason)
        self.blocks.append(b)
        self.program.append(b)

    def _sync_call(self, name: str) -> _Call:
        """A cuda_runtime sync call (it launches nothing; it takes a correlation id all the same)."""
        c = _Call(name, self._next_corr(), None, self._step)
        self.calls.append(c)
        return c

    def sync(self, kind: str = "stream", stream: int = COMPUTE_STREAM, on: DeviceOp | None = None) -> None:
        """Block the host (module docstring, 4): kind "stream" until every op launched so far on
        `stream` ends, "device" on every stream, "event" until the op `on` ends."""
        self._check_open()
        if kind not in SYNC_CALL:
            raise ValueError(f"sync kind {kind!r}: one of {sorted(SYNC_CALL)}")
        if kind == "stream":
            queue = self.streams.get(stream)
            waits = queue[-1:] if queue else []
        elif kind == "device":
            waits = [q[-1] for q in self.streams.values()]
        else:
            if on is None or on.rank != self.rank:
                raise ValueError(f"rank {self.rank}: sync(kind='event') needs on= an op of this rank")
            waits = [on]
        self._block(self._sync_call(SYNC_CALL[kind]), waits, "sync")

    def item(self, stream: int = COMPUTE_STREAM) -> None:
        """`.item()` on a device tensor: a 2 us DtoH copy queued on `stream`, waited for."""
        with self._span("aten::item", "cpu_op"), self._span("aten::_local_scalar_dense", "cpu_op"):
            call = self._queue(D2H, ITEM_COPY_US, stream, "memcpy", None, None, LAUNCH_CALL["memcpy"])
            self.program.append(_Launch(call))
            assert call.op is not None
            self._block(self._sync_call(SYNC_CALL["stream"]), [call.op], "item")

    def to_device(self, bytes_us: float, stream: int = COMPUTE_STREAM, stage_us: float = 0.0) -> None:
        """`.to("cuda")` from pageable memory: one blocking cudaMemcpy whose HtoD copy (bytes_us)
        runs after `stream`'s queued work and after `stage_us` of the host copying the data into
        a pinned staging buffer inside the call (the device idle meanwhile, unless queued work
        keeps it busy)."""
        with (
            self._span("aten::to", "cpu_op"),
            self._span("aten::_to_copy", "cpu_op"),
            self._span("aten::copy_", "cpu_op"),
        ):
            call = self._queue(H2D, bytes_us, stream, "memcpy", None, None, "cudaMemcpy")
            assert call.op is not None
            call.op.stage_us = stage_us
            self._block(call, [call.op], "to_device")

    # -- resolution ------------------------------------------------------------------------

    def _advance_host(self) -> bool:
        """Run the host program as far as it goes; whether anything moved."""
        sim, moved = self.sim, False
        while self.pc < len(self.program):
            ins = self.program[self.pc]
            if isinstance(ins, _Advance):
                self.t += ins.us
            elif isinstance(ins, _Open):
                ins.span.start_us = self.t
            elif isinstance(ins, _Close):
                ins.span.end_us = self.t
            elif isinstance(ins, _Launch):
                call = ins.call
                call.start_us = self.t
                assert call.op is not None
                call.op.launch_us = self.t
                for op in call.more:
                    op.launch_us = self.t
                self.t += sim.launch_cost_us
                call.end_us = self.t
            else:
                call = ins.call
                if call.start_us is None:  # the call begins (a blocking cudaMemcpy launches its copy now)
                    call.start_us = self.t
                    if call.op is not None:
                        call.op.launch_us = self.t
                    moved = True
                if any(w.end_us is None for w in ins.waits):
                    return moved
                call.end_us = max([self.t + sim.sync_cost_us] + [w.end_us for w in ins.waits])
                self.t = call.end_us
            self.pc += 1
            moved = True
        return moved

    def _advance_device(self) -> bool:
        """Start and end the ops at the head of each stream as far as their inputs are known."""
        latency, moved = self.sim.launch_latency_us, False
        for stream, queue in self.streams.items():
            i = self.heads.get(stream, 0)
            while i < len(queue):
                op = queue[i]
                if op.start_us is None:
                    if op.launch_us is None or (op.after is not None and op.after.end_us is None):
                        break
                    op.start_us = max(
                        op.launch_us + op.stage_us + latency,
                        op.prev.end_us if op.prev is not None else -math.inf,
                        op.after.end_us if op.after is not None else -math.inf,
                    )
                    moved = True
                    if op.instance is None:
                        op.end_us = op.start_us + op.dur_us
                    else:
                        op.instance.start(op.start_us)
                if op.end_us is None:
                    break
                i += 1
            self.heads[stream] = i
        return moved

    def done(self) -> bool:
        return self.pc == len(self.program) and all(op.end_us is not None for op in self.ops)

    # -- output ----------------------------------------------------------------------------

    def truth(self) -> RankTruth:
        ops = [
            OpTruth(
                op.name,
                op.kind,
                op.stream,
                op.step,
                op.corr,
                op.launch_us,
                op.start_us,
                op.end_us,
                None if op.instance is None else op.instance.coll,
                None if op.instance is None else op.instance.pg,
                None if op.instance is None else op.instance.seq,
            )
            for op in self.ops
        ]
        steps = [StepTruth(n, s.start_us, s.end_us) for n, s in self.steps]
        syncs = [SyncTruth(b.call.name, b.reason, b.call.step, b.call.start_us, b.call.end_us) for b in self.blocks]
        ranges = [
            RangeTruth(s.name, s.start_us, s.end_us)
            for s in self.spans
            if s.cat == "user_annotation" and not s.name.startswith("ProfilerStep#")
        ]
        return RankTruth(self.rank, ops, steps, syncs, self.t, ranges)

    def document(self) -> dict[str, Any]:
        """This rank's Kineto-shaped trace (module docstring, 6)."""
        sim = self.sim
        pid, tid = self.main
        timed: list[dict[str, Any]] = []
        for s in self.spans:
            timed.append(_x(s.name, s.cat, s.start_us, s.end_us - s.start_us, pid, tid, s.args))
        for c in self.calls:
            timed.append(
                _x(c.name, "cuda_runtime", c.start_us, c.end_us - c.start_us, pid, tid, {"correlation": c.corr})
            )
            if c.op is not None:
                timed.append(
                    {"ph": "s", "id": c.corr, "pid": pid, "tid": tid, "ts": c.start_us, "cat": "ac2g", "name": "ac2g"}
                )
        sync_streams: set[int] = set()
        if sim.sync_rows:
            for b in self.blocks:
                if b.call.name in (SYNC_CALL["stream"], SYNC_CALL["device"]):
                    for w in {w.stream for w in b.waits} or {COMPUTE_STREAM}:
                        sync_streams.add(w)
                        args = {"device": DEVICE, "stream": w}
                        start, end = b.call.start_us, b.call.end_us
                        timed.append(_x("Stream Sync", "cuda_sync", start, end - start, DEVICE, w + SYNC_THREAD, args))
        for op in self.ops:
            args = {"correlation": op.corr, "device": DEVICE, "stream": op.stream, **op.args}
            timed.append(_x(op.name, CATEGORY[op.kind], op.start_us, op.end_us - op.start_us, DEVICE, op.stream, args))
            timed.append(
                {
                    "ph": "f",
                    "id": op.corr,
                    "pid": DEVICE,
                    "tid": op.stream,
                    "ts": op.start_us,
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
        if sim.gpu_step_annotations:
            for n, _ in self.steps:
                mine = [op for op in self.ops if op.step == n]
                if mine:
                    start = min(op.start_us for op in mine)
                    end = max(op.end_us for op in mine)
                    timed.append(
                        _x(f"ProfilerStep#{n}", "gpu_user_annotation", start, end - start, DEVICE, mine[0].stream, {})
                    )
        order = sorted(range(len(timed)), key=lambda i: (timed[i]["ts"], -timed[i].get("dur", 0.0), i))
        events = [timed[i] for i in order]
        t0 = events[0]["ts"] if events else self.start_us
        meta = [
            _meta("process_name", pid, 0, t0, name="python3"),
            _meta("process_labels", pid, 0, t0, labels="CPU"),
            _meta("thread_name", pid, tid, t0, name=f"thread {tid} (python3)"),
        ]
        if self.streams:
            meta += [
                _meta("process_name", DEVICE, 0, t0, name="python3"),
                _meta("process_labels", DEVICE, 0, t0, labels=f"GPU {DEVICE}"),
            ]
            meta += [_meta("thread_name", DEVICE, s, t0, name=f"stream {s}") for s in sorted(self.streams)]
            meta += [
                _meta("thread_name", DEVICE, s + SYNC_THREAD, t0, name=f"stream {s} (sync)")
                for s in sorted(sync_streams)
            ]
        doc: dict[str, Any] = {
            "schemaVersion": 1,
            "deviceProperties": [dict(H100, name=sim.device_name)],
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": sim.world_size},
            "baseTimeNanoseconds": sim.base_ns,
            "traceEvents": meta + events,
        }
        if sim.host_name is not None:
            doc["host_name"] = sim.host_name
        return doc

    def stuck(self) -> str | None:
        """Why this rank's host cannot go on (None: it finished its program)."""
        if self.pc == len(self.program):
            return None
        ins = self.program[self.pc]
        assert isinstance(ins, _Block)
        waiting = next(w for w in ins.waits if w.end_us is None)
        return (
            f"rank {self.rank}'s host is blocked in {ins.call.name} from {self.t} us waiting for {_why(waiting, set())}"
        )


def _why(op: DeviceOp, seen: set[int]) -> str:
    """Why `op` has no end yet, following what it waits for."""
    if id(op) in seen:
        return f"{op.describe()} (a cycle)"
    seen.add(id(op))
    if op.launch_us is None:
        return f"{op.describe()}, never launched (its host is blocked before it)"
    if op.prev is not None and op.prev.end_us is None:
        return f"{op.describe()}, queued behind {_why(op.prev, seen)}"
    if op.after is not None and op.after.end_us is None:
        return f"{op.describe()}, waiting (after=) for {_why(op.after, seen)}"
    inst = op.instance
    assert inst is not None
    missing = [r for r in inst.ranks if r not in inst.members]
    if missing:
        return f"{op.describe()}, which rank(s) {missing} never call"
    late = [m for m in inst.members.values() if m.start_us is None]
    return f"{op.describe()}, waiting for " + "; ".join(_why(m, seen) for m in late)


def _x(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _meta(kind: str, pid: int, tid: int, ts: float, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": args}


class Sim:
    """The ranks' host programs (`rank`), resolved into trace documents by `run` (module docstring)."""

    def __init__(
        self,
        world_size: int = 2,
        launch_latency_us: float = 5.0,
        launch_cost_us: float = 5.0,
        gpu_step_annotations: bool = False,
        base_ns: int = DEFAULT_BASE_NS,
        host_name: str | None = None,
        sync_cost_us: float = 2.0,
        device_name: str = H100["name"],
        main_base: int = MAIN_BASE,
        seq_args: bool = False,
        sync_rows: bool = False,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size {world_size}: at least 1")
        self.world_size = world_size
        self.launch_latency_us, self.launch_cost_us, self.sync_cost_us = launch_latency_us, launch_cost_us, sync_cost_us
        self.gpu_step_annotations = gpu_step_annotations
        self.base_ns, self.host_name, self.device_name = base_ns, host_name, device_name
        self.main_base, self.seq_args, self.sync_rows = main_base, seq_args, sync_rows
        self.hosts: dict[int, HostRank] = {}
        self.instances: dict[tuple[str, int], _Instance] = {}
        self.pg_ranks: dict[str, tuple[int, ...]] = {}
        self.all_ranks = tuple(range(world_size))  # one tuple for every default group: compared by identity
        self._ranks_text: dict[tuple[int, ...], str] = {}
        self.resolved = False
        self._docs: list[dict[str, Any]] | None = None
        self._truths: list[RankTruth] | None = None

    def rank(self, r: int, start_us: float | None = None) -> HostRank:
        """Rank r's host program (made on the first call; its clock starts at start_us, default 0)."""
        if not 0 <= r < self.world_size:
            raise ValueError(f"rank {r} outside world size {self.world_size}")
        h = self.hosts.get(r)
        if h is None:
            h = self.hosts[r] = HostRank(self, r, 0.0 if start_us is None else float(start_us))
        elif start_us is not None and float(start_us) != h.start_us:
            raise ValueError(f"rank {r} was made with start_us={h.start_us}, not {start_us}")
        return h

    def ranks_text(self, ranks: tuple[int, ...]) -> str:
        """A group's "Process Group Ranks" argument, made once per group (1024 ranks: ~6 kB)."""
        text = self._ranks_text.get(ranks)
        if text is None:
            text = self._ranks_text[ranks] = str(list(ranks))
        return text

    def _instance(
        self, rank: int, pg: str, seq: int, coll: str, ranks: tuple[int, ...], transfer_us: float
    ) -> _Instance:
        """The k-th collective of `pg`, made by the first rank to call it; the others must agree."""
        known = self.pg_ranks.setdefault(pg, ranks)
        if known is not ranks and known != ranks:
            raise ValueError(f"rank {rank}: process group {pg!r} has ranks {list(known)}, called with {list(ranks)}")
        inst = self.instances.get((pg, seq))
        if inst is None:
            inst = self.instances[(pg, seq)] = _Instance(pg, seq, coll, ranks, transfer_us)
            return inst
        if inst.coll != coll:
            first = min(inst.members)
            raise ValueError(
                f"collective #{seq} of process group {pg!r}: rank {first} calls {inst.coll}, "
                f"rank {rank} calls {coll} (every rank must call the same sequence)"
            )
        if inst.transfer_us != transfer_us:
            first = min(inst.members)
            raise ValueError(
                f"{inst.describe()}: rank {first} gives transfer_us={inst.transfer_us}, rank {rank} {transfer_us}"
            )
        return inst

    def run(self) -> list[dict[str, Any]]:
        """Resolve every time (module docstring, 7) and return the documents, index = rank."""
        if self._docs is None:
            self._resolve()
            self._docs = [self.hosts[r].document() for r in range(self.world_size)]
        return self._docs

    def _resolve(self) -> None:
        """Resolve every time (module docstring, 7), once; a deadlock raises DeadlockError."""
        if self._truths is not None:
            return
        self.resolved = True
        hosts = [self.rank(r) for r in range(self.world_size)]
        moved = True
        while moved:
            moved = False
            for h in hosts:
                moved |= h._advance_host()
                moved |= h._advance_device()
        if not all(h.done() for h in hosts):
            why = [s for s in (h.stuck() for h in hosts) if s is not None]
            if not why:
                why = [f"an op never ends: {_why(op, set())}" for h in hosts for op in h.ops if op.end_us is None][:1]
            raise DeadlockError("deadlock: " + "; ".join(why))
        self._truths = [h.truth() for h in hosts]

    def truth(self) -> list[RankTruth]:
        """The exact answers, per rank (index = rank); resolves the simulation when not yet
        resolved (the documents are made only by `run`)."""
        self._resolve()
        assert self._truths is not None
        return self._truths


def write_all(docs: list[dict[str, Any]], folder: Path, template: str = "rank{rank}.pt.trace.json.gz") -> list[Path]:
    """Write each rank's document to folder / template.format(rank=r) (gzip for .gz); the paths, by rank."""
    return [write(Path(folder) / template.format(rank=r), doc) for r, doc in enumerate(docs)]


def open_window(doc: dict[str, Any], first: int, last: int | None = None) -> dict[str, Any]:
    """`doc` as a profiler window that opened as the host entered ProfilerStep#first (and closed as
    it left ProfilerStep#last; None: the end), as Kineto records one (module docstring, 9):
    1. host events (main thread: its ops, ranges, launches and flow starts) outside [open, close]
       are gone;
    2. device ops (and their flow ends) that started before the window opened are gone; those
       launched before it that started after stay, their launch not in the trace (the tail of the
       step before, still queued when the window opened); those launched after it closed are gone."""
    events = doc["traceEvents"]

    def step_mark(n: int) -> dict[str, Any]:
        return next(e for e in events if e.get("cat") == "user_annotation" and e.get("name") == f"ProfilerStep#{n}")

    opened = step_mark(first)["ts"]
    closed = math.inf if last is None else step_mark(last)["ts"] + step_mark(last)["dur"]
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    kept = []
    for e in events:
        if e.get("ph") == "M":
            kept.append(e)
        elif e.get("pid") != DEVICE:  # the host's
            if opened <= e["ts"] <= closed:
                kept.append(e)
        elif e["ts"] >= opened and launched.get(e.get("args", {}).get("correlation", e.get("id")), 0.0) <= closed:
            kept.append(e)
    return {**doc, "traceEvents": kept}
