"""The device-queue simulator (devicesim.py): exact times on small programs, and its documents
read by the collector's parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.traces.read.parse import parse_trace

from devicesim import D2H, H2D, DeadlockError, Sim, collective_names, write_all

GEMM = "ampere_sgemm_128x64_nn"
EW = "vectorized_elementwise_kernel"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def spans(doc: dict[str, Any], **match: Any) -> list[tuple[str, float, float]]:
    """(name, start, end) of the ph X events whose fields equal `match`, in document order."""
    return [
        (e["name"], e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())
    ]


def times(truth_ops: list[Any]) -> list[tuple[str, float, float]]:
    return [(o.name, o.start_us, o.end_us) for o in truth_ops]


def test_one_stream_runs_in_launch_order() -> None:
    sim = Sim(world_size=1)
    h = sim.rank(0)
    a = h.launch("a", 100.0)  # call [0, 5]: starts 0 + 5 latency
    b = h.launch("b", 50.0)  # call [5, 10]: the stream is busy until 105
    h.sleep(200.0)  # host at 210, the stream idle since 155
    c = h.launch("c", 10.0)
    doc = sim.run()[0]
    assert [(a.start_us, a.end_us), (b.start_us, b.end_us), (c.start_us, c.end_us)] == [
        (5.0, 105.0),
        (105.0, 155.0),
        (215.0, 225.0),
    ]
    assert spans(doc, cat="kernel") == [("a", 5.0, 105.0), ("b", 105.0, 155.0), ("c", 215.0, 225.0)]
    assert spans(doc, cat="cuda_runtime") == [
        ("cudaLaunchKernel", 0.0, 5.0),
        ("cudaLaunchKernel", 5.0, 10.0),
        ("cudaLaunchKernel", 210.0, 215.0),
    ]
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert [k["args"] for k in kernels] == [{"correlation": i, "device": 0, "stream": 7} for i in (1, 2, 3)]
    assert (kernels[0]["pid"], kernels[0]["tid"]) == (0, 7)
    flows = [(e["ph"], e["id"], e["pid"], e["tid"], e["ts"]) for e in doc["traceEvents"] if e.get("cat") == "ac2g"]
    assert sorted(flows) == sorted(
        [
            ("s", 1, 1000, 1000, 0.0),
            ("f", 1, 0, 7, 5.0),
            ("s", 2, 1000, 1000, 5.0),
            ("f", 2, 0, 7, 105.0),
            ("s", 3, 1000, 1000, 210.0),
            ("f", 3, 0, 7, 215.0),
        ]
    )
    timed = [e["ts"] for e in doc["traceEvents"] if e["ph"] != "M"]
    assert timed == sorted(timed)
    assert all(e["ph"] == "M" for e in doc["traceEvents"][:5])


def test_host_runs_ahead_of_the_device() -> None:
    """Per step: 10 us of host op, two launches (5 us each); the kernels take 350 us, so the
    host's steps are 20 us long and the device runs ever further behind until .item()."""
    sim = Sim(world_size=1)
    h = sim.rank(0)
    for n in (1, 2, 3):
        with h.step(n), h.range("forward"):
            h.cpu(10.0, "aten::linear")
            h.launch(GEMM, 300.0)
            h.launch(EW, 50.0)
    h.item()
    doc = sim.run()[0]
    (t,) = sim.truth()
    assert [(s.number, s.start_us, s.end_us) for s in t.steps] == [(1, 0.0, 20.0), (2, 20.0, 40.0), (3, 40.0, 60.0)]
    assert times(t.ops) == [
        (GEMM, 15.0, 315.0),
        (EW, 315.0, 365.0),
        (GEMM, 365.0, 665.0),
        (EW, 665.0, 715.0),
        (GEMM, 715.0, 1015.0),
        (EW, 1015.0, 1065.0),
        (D2H, 1065.0, 1067.0),
    ]
    assert [o.step for o in t.ops] == [1, 1, 2, 2, 3, 3, None]
    assert [o.launch_us for o in t.ops] == [10.0, 15.0, 30.0, 35.0, 50.0, 55.0, 60.0]
    step1_device_end = max(o.end_us for o in t.ops if o.step == 1)
    assert min(o.start_us for o in t.ops if o.step == 2) == step1_device_end == 365.0
    assert [(s.call, s.start_us, s.end_us) for s in t.syncs] == [("cudaStreamSynchronize", 65.0, 1067.0)]
    assert t.host_end_us == 1067.0
    assert spans(doc, cat="user_annotation") == [
        ("ProfilerStep#1", 0.0, 20.0),
        ("forward", 0.0, 20.0),
        ("ProfilerStep#2", 20.0, 40.0),
        ("forward", 20.0, 40.0),
        ("ProfilerStep#3", 40.0, 60.0),
        ("forward", 40.0, 60.0),
    ]


def test_sync_blocks_until_the_queue_drains() -> None:
    sim = Sim(world_size=1)
    h = sim.rank(0)
    h.launch(GEMM, 100.0)  # [5, 105]
    h.cpu(10.0, "aten::add")  # [5, 15]
    h.sync()  # [15, 105]
    h.cpu(10.0, "aten::mul")  # [105, 115]
    h.sync()  # nothing left to wait for: the fixed cost, [115, 117]
    h.launch("x", 50.0, stream=7)  # call [117, 122]: [122, 172]
    h.launch("y", 200.0, stream=13)  # call [122, 127]: [127, 327]
    h.sync()  # stream 7 only: [127, 172]
    h.sync(kind="device")  # every stream: [172, 327]
    doc = sim.run()[0]
    (t,) = sim.truth()
    assert [(s.call, s.start_us, s.end_us) for s in t.syncs] == [
        ("cudaStreamSynchronize", 15.0, 105.0),
        ("cudaStreamSynchronize", 115.0, 117.0),
        ("cudaStreamSynchronize", 127.0, 172.0),
        ("cudaDeviceSynchronize", 172.0, 327.0),
    ]
    assert spans(doc, cat="cpu_op") == [("aten::add", 5.0, 15.0), ("aten::mul", 105.0, 115.0)]
    assert times(t.ops)[1:] == [("x", 122.0, 172.0), ("y", 127.0, 327.0)]
    assert t.host_end_us == 327.0


def test_collective_ends_together_on_every_rank() -> None:
    sim = Sim(world_size=2)
    sim.rank(0).collective("allreduce", 100.0)
    r1 = sim.rank(1)
    r1.sleep(30.0)
    r1.collective("allreduce", 100.0)
    docs = sim.run()
    t0, t1 = sim.truth()
    assert times(t0.ops) == [(ALLREDUCE, 5.0, 135.0)]
    assert times(t1.ops) == [(ALLREDUCE, 35.0, 135.0)]
    k0, k1 = (spans(d, cat="kernel") for d in docs)
    assert (k0[0][2] - k0[0][1]) - (k1[0][2] - k1[0][1]) == 30.0
    assert spans(docs[1], cat="cpu_op") == [("c10d::allreduce_", 30.0, 35.0), ("record_param_comms", 30.0, 35.0)]
    kernel = next(e for e in docs[0]["traceEvents"] if e.get("cat") == "kernel")
    assert (kernel["pid"], kernel["tid"]) == (0, 20)
    assert kernel["args"] == {
        "correlation": 1,
        "device": 0,
        "stream": 20,
        "Collective name": "allreduce",
        "Process Group Name": "0",
        "In msg nelems": 1000,
        "Out msg nelems": 1000,
        "dtype": "Float",
        "Group size": 2,
        "Process Group Ranks": "[0, 1]",
    }
    rpc = next(e for e in docs[0]["traceEvents"] if e["name"] == "record_param_comms")
    assert rpc["args"] == {k: v for k, v in kernel["args"].items() if k not in ("correlation", "device", "stream")}
    assert collective_names("reduce_scatter", "BFloat16") == (
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "c10d::reduce_scatter_",
    )


def test_after_makes_the_comm_stream_wait() -> None:
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        k = h.launch(GEMM, 300.0)  # [5, 305]
        h.collective("allreduce", 100.0, after=k)  # launched at 5: would start at 10, waits for the gemm
        h.launch(EW, 50.0)  # launched at 10: behind the gemm on stream 7, beside the all-reduce
        h.collective("allreduce", 100.0)  # launched at 15: behind the first all-reduce on stream 20
    for t in sim.truth():
        assert times(t.ops) == [
            (GEMM, 5.0, 305.0),
            (ALLREDUCE, 305.0, 405.0),
            (EW, 305.0, 355.0),
            (ALLREDUCE, 405.0, 505.0),
        ]
        assert [(o.coll, o.pg, o.seq) for o in t.ops if o.coll] == [("allreduce", "0", 0), ("allreduce", "0", 1)]


def test_item_and_to_device(tmp_path: Path) -> None:
    sim = Sim(world_size=1)
    h = sim.rank(0)
    with h.step(1):
        h.launch(GEMM, 100.0)  # [5, 105]
        h.item()  # at 5: the DtoH copy queued behind the gemm, [105, 107]
        h.launch(GEMM, 100.0)  # call [107, 112]: [112, 212]
        h.to_device(20.0)  # at 112: cudaMemcpy; its HtoD copy waits for the gemm, [212, 232]
    doc = sim.run()[0]
    (t,) = sim.truth()
    assert [(s.call, s.reason, s.start_us, s.end_us) for s in t.syncs] == [
        ("cudaStreamSynchronize", "item", 10.0, 107.0),
        ("cudaMemcpy", "to_device", 112.0, 232.0),
    ]
    assert times(t.ops) == [(GEMM, 5.0, 105.0), (D2H, 105.0, 107.0), (GEMM, 112.0, 212.0), (H2D, 212.0, 232.0)]
    assert spans(doc, cat="cpu_op") == [
        ("aten::item", 5.0, 107.0),
        ("aten::_local_scalar_dense", 5.0, 107.0),
        ("aten::to", 112.0, 232.0),
        ("aten::_to_copy", 112.0, 232.0),
        ("aten::copy_", 112.0, 232.0),
    ]
    assert spans(doc, cat="cuda_runtime") == [
        ("cudaLaunchKernel", 0.0, 5.0),
        ("cudaMemcpyAsync", 5.0, 10.0),
        ("cudaStreamSynchronize", 10.0, 107.0),
        ("cudaLaunchKernel", 107.0, 112.0),
        ("cudaMemcpy", 112.0, 232.0),
    ]
    assert spans(doc, cat="gpu_memcpy") == [(D2H, 105.0, 107.0), (H2D, 212.0, 232.0)]
    (path,) = write_all([doc], tmp_path)
    (step,) = parse_trace(path).steps
    assert (step.syncs, step.sync_us) == (2, 217.0)
    assert step.syncs_by_caller == {"item": 1, "copy to device": 1}
    assert step.sync_us_by_caller == {"item": 97.0, "copy to device": 120.0}


def test_event_wait_and_start_offset() -> None:
    sim = Sim(world_size=1, launch_latency_us=2.0, launch_cost_us=3.0, sync_cost_us=1.0)
    h = sim.rank(0, start_us=1000.0)
    k = h.launch(GEMM, 40.0, stream=13)  # call [1000, 1003]: [1002, 1042]
    h.launch("fill", 4.0, kind="memset")  # call [1003, 1006]: [1005, 1009]
    h.sync(kind="event", on=k)  # [1006, 1042]
    doc = sim.run()[0]
    (t,) = sim.truth()
    assert times(t.ops) == [(GEMM, 1002.0, 1042.0), ("fill", 1005.0, 1009.0)]
    assert [(s.call, s.start_us, s.end_us) for s in t.syncs] == [("cudaEventSynchronize", 1006.0, 1042.0)]
    assert spans(doc, cat="cuda_runtime")[1] == ("cudaMemsetAsync", 1003.0, 1006.0)
    assert spans(doc, cat="gpu_memset") == [("fill", 1005.0, 1009.0)]


def test_gpu_step_annotations(tmp_path: Path) -> None:
    sim = Sim(world_size=1, gpu_step_annotations=True)
    h = sim.rank(0)
    for n in (1, 2):
        with h.step(n):
            h.launch(GEMM, 300.0)
            h.launch(EW, 50.0, stream=13)
    h.sync(kind="device")
    doc = sim.run()[0]
    # step 1: gemm [5, 305], ew [10, 60]; step 2: gemm [305, 605], ew [60, 110] (stream 13 is free)
    assert spans(doc, cat="gpu_user_annotation") == [("ProfilerStep#1", 5.0, 305.0), ("ProfilerStep#2", 60.0, 605.0)]
    assert {e["tid"] for e in doc["traceEvents"] if e.get("cat") == "gpu_user_annotation"} == {7}
    (path,) = write_all([doc], tmp_path)
    assert [(s.number, s.start_us, s.end_us) for s in parse_trace(path).steps] == [(1, 0.0, 10.0), (2, 10.0, 20.0)]


def test_deadlock_and_mismatch_are_named() -> None:
    sim = Sim(world_size=2)
    sim.rank(0).collective("allreduce", 100.0)
    sim.rank(0).sync(stream=20)
    sim.rank(1).cpu(10.0, "aten::add")
    with pytest.raises(
        DeadlockError,
        match=r"rank 0's host is blocked in cudaStreamSynchronize .*"
        r"allreduce #0 of process group '0'.*rank\(s\) \[1\] never call",
    ):
        sim.run()

    sim = Sim(world_size=2)
    sim.rank(0).collective("allreduce", 100.0)
    with pytest.raises(
        ValueError,
        match=r"collective #0 of process group '0': rank 0 calls allreduce, "
        r"rank 1 calls broadcast",
    ):
        sim.rank(1).collective("broadcast", 100.0)

    # the two groups' kernels queued in opposite orders on one stream: each waits for the other
    sim = Sim(world_size=2)
    sim.rank(0).collective("allreduce", 10.0, pg="a")
    sim.rank(0).collective("allreduce", 10.0, pg="b")
    sim.rank(1).collective("allreduce", 10.0, pg="b")
    sim.rank(1).collective("allreduce", 10.0, pg="a")
    with pytest.raises(DeadlockError, match="never ends"):
        sim.run()


def test_documents_parse(tmp_path: Path) -> None:
    sim = Sim(world_size=2, host_name="node7")
    for r in range(2):
        h = sim.rank(r, start_us=0.0)
        for n in (1, 2, 3):
            with h.step(n):
                with h.range("forward"):
                    h.cpu(20.0, "aten::linear")
                    k = h.launch(GEMM, 300.0)
                    h.launch(EW, 50.0)
                h.launch("Memcpy HtoD (Pageable -> Device)", 20.0, kind="memcpy")
                if r == 1:
                    h.sleep(30.0)
                h.collective("allreduce", 100.0, nelems=1000, after=k)
                h.item()
                h.sleep(3000.0)
    docs = sim.run()
    assert docs[1]["distributedInfo"] == {"backend": "nccl", "rank": 1, "world_size": 2}
    assert docs[0]["host_name"] == "node7" and docs[0]["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    paths = write_all(docs, tmp_path)
    assert [p.name for p in paths] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for rank, (path, truth) in enumerate(zip(paths, sim.truth())):
        trace = parse_trace(path)
        assert (trace.rank, trace.device, trace.host) == (rank, "gpu", "node7")
        assert [(s.number, s.start_us, s.end_us) for s in trace.steps] == [
            (s.number, s.start_us, s.end_us) for s in truth.steps
        ]
        assert len(trace.comms) == 3
        want = [(o.start_us, o.end_us, o.step) for o in truth.ops if o.coll]
        assert [(c.start_us, c.end_us, c.step) for c in trace.comms] == want
        assert [(c.name, c.pg, c.seq, c.nelems, c.dtype) for c in trace.comms] == [
            ("allreduce", "0", i, 1000, "Float") for i in range(3)
        ]
        assert [s.syncs_by_caller for s in trace.steps] == [{"item": 1}] * 3
    ends = [[c.end_us for c in parse_trace(p).comms] for p in paths]
    assert ends[0] == ends[1]
