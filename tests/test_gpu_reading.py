"""Reading GPU traces right (issue: a GPU-correctness read): who called each blocking sync, the
host ops of every model thread, a GPU run whose trace holds no kernels, Triton matmul
templates, `ncclDevKernel_Generic` named from its host op, and copies apart from idle time.
Hand-built traces with exact answers, then the real traces in tests/data/traces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.traces.analyse.advisor import GEMM, GRAD_SCALER_ADVICE, Rules, advice_for, classify, diagnose
from harness.traces.read.discover import group_ranks
from harness.traces.read.host_ops import caller_of, enclosing
from harness.traces.read.parse import NO_KERNELS, parse_trace
from harness.traces.run_analysis import analyze

from jobs import REAL_TRACES
from tracebuild import MAIN, STREAM, GpuRank, document, run_analysis, step, write, x

AUTOGRAD = (100, 102)  # autograd's device thread
GLOO = (100, 101)
PIN = (100, 103)  # DataLoader's pin-memory thread


def sync(ts: float, dur: float, name: str = "cudaStreamSynchronize", where: tuple = MAIN) -> dict[str, Any]:
    return x(name, "cuda_runtime", ts, dur, where)


def memcpy(
    g: GpuRank,
    launch_ts: float,
    ts: float,
    dur: float,
    direction: str = "DtoH (Device -> Pageable)",
    call: str = "cudaMemcpyAsync",
    where: tuple = MAIN,
    cat: str = "gpu_memcpy",
    call_us: float = 5,
) -> None:
    """A host call at launch_ts (on `where`) and the device copy it started, linked by correlation."""
    g.corr += 1
    g.events.append(x(call, "cuda_runtime", launch_ts, call_us, where, correlation=g.corr))
    name = f"Memcpy {direction}" if cat == "gpu_memcpy" else "Memset (Device)"
    g.events.append(x(name, cat, ts, dur, STREAM, correlation=g.corr, device=0, stream=7))


def copy_ops(ts: float, where: tuple = MAIN) -> list[dict[str, Any]]:
    """aten::to > aten::_to_copy > aten::copy_ from ts, 100 us (copy_ from ts + 10 for 80 us)."""
    return [
        x("aten::to", "cpu_op", ts, 100, where),
        x("aten::_to_copy", "cpu_op", ts + 5, 90, where),
        x("aten::copy_", "cpu_op", ts + 10, 80, where),
    ]


def item_ops(ts: float) -> list[dict[str, Any]]:
    return [x("aten::item", "cpu_op", ts, 100), x("aten::_local_scalar_dense", "cpu_op", ts + 5, 90)]


# -- 2. who called each blocking sync -------------------------------------------------------------


def test_each_sync_is_given_to_its_caller(tmp_path: Path) -> None:
    g = GpuRank()
    g.kernel("ampere_sgemm_128x64_nn", 50, 100, 50)
    ev = [
        step(1, 0, 10000),
        # DDP's forward: its logger syncs twice outside any aten op; a nonzero inside an op the
        # user called, and a synchronous copy to the device, are not the logger's
        x("DistributedDataParallel.forward", "user_annotation", 100, 1900),
        sync(110, 20, "cudaEventSynchronize"),
        sync(140, 20, "cudaEventSynchronize"),
        x("aten::index", "cpu_op", 300, 200),
        x("aten::nonzero", "cpu_op", 310, 100),
        sync(350, 30),
        *copy_ops(600),
        sync(625, 40),
        *item_ops(2500),
        sync(2520, 50),  # the user's .item()
        *copy_ops(3000),
        sync(3020, 60),  # .cpu()
        # GradScaler.step: unscale, then .item() on found_inf; a later .item() is the user's
        x("aten::_amp_foreach_non_finite_check_and_unscale_", "cpu_op", 4000, 50),
        *item_ops(4100),
        sync(4120, 70),
        *item_ops(5000),
        sync(5020, 10),
        x("aten::copy_", "cpu_op", 5500, 100),  # a synchronous cudaMemcpy is itself the sync
        x("my_timer", "user_annotation", 6000, 200),
        sync(6050, 100, "cudaDeviceSynchronize"),
        x("aten::copy_", "cpu_op", 7000, 100),
        sync(7020, 25),  # no device copy recorded: direction unknown
        # backward on autograd's thread: index_put_ copies its indices to the device
        x("autograd::engine::evaluate_function: IndexBackward0", "cpu_op", 8000, 500, AUTOGRAD),
        x("aten::_index_put_impl_", "cpu_op", 8005, 400, AUTOGRAD),
        *copy_ops(8020, AUTOGRAD),
        sync(8050, 20, where=AUTOGRAD),
        sync(20000, 500, "cudaDeviceSynchronize"),
    ]  # after the last step: not counted
    memcpy(g, 615, 700, 5, "HtoD (Pageable -> Device)")
    memcpy(g, 2510, 2530, 2)
    memcpy(g, 3015, 3030, 2)
    memcpy(g, 4110, 4130, 2)
    memcpy(g, 5510, 5520, 60, call="cudaMemcpy", call_us=80)
    memcpy(g, 8040, 8060, 2, "HtoD (Pageable -> Device)", where=AUTOGRAD)
    s = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(ev + g.events, 0))).steps[0]
    assert s.syncs_by_caller == {
        "DDP logger": 2,
        "other: aten::nonzero": 1,
        "copy to device": 2,
        "item": 2,
        "copy to host": 2,
        "GradScaler": 1,
        "other: my_timer": 1,
        "copy": 1,
    }
    assert s.sync_us_by_caller == {
        "DDP logger": 40.0,
        "other: aten::nonzero": 30.0,
        "copy to device": 60.0,
        "item": 60.0,
        "copy to host": 140.0,
        "GradScaler": 70.0,
        "other: my_timer": 100.0,
        "copy": 25.0,
    }
    assert (s.syncs, s.sync_us) == (12, 525.0)


def test_caller_walk_and_enclosing_ops() -> None:
    step_, ddp = ("ProfilerStep#3", False), ("DistributedDataParallel.forward", False)

    def caller(*chain: tuple[str, bool]) -> tuple[str, int]:
        return caller_of([n for n, _ in chain], [op for _, op in chain])

    assert caller(step_, ddp) == ("DDP logger", 1)
    assert caller(step_, ddp, ("aten::index", True), ("aten::nonzero", True)) == ("other: aten::nonzero", 3)
    # DDP's buffer broadcast is an op inside its forward, not its logger
    assert caller(step_, ddp, ("c10d::broadcast_", True)) == ("other: c10d::broadcast_", 2)
    assert caller(step_, ("aten::item", True), ("aten::_local_scalar_dense", True)) == ("item", 2)
    assert caller(step_, ("my_timer", False)) == ("other: my_timer", -1)
    assert caller(step_) == ("other", -1) and caller() == ("other", -1)
    # events by start, the longer first among equal starts; [0, 100] holds [0, 50] holds [10, 20]
    starts, ends, names = np.array([0.0, 0.0, 10.0, 60.0]), np.array([100.0, 50.0, 20.0, 70.0]), "abcd"
    assert [[names[k] for k in c] for c in enclosing(starts, ends, [5.0, 15.0, 20.0, 65.0, 100.0])] == [
        ["a", "b"],
        ["a", "b", "c"],
        ["a", "b"],
        ["a", "d"],
        [],
    ]


def idle_gpu_docs(host_events: Callable[[float], list[dict]], steps: int = 2) -> list[dict]:
    """Two ranks, 1 ms steps; in each, a 100 us matmul at t+100 and an all-reduce from t+800 to
    t+900 entered together: the device's spans run from one step's matmul to the next's (the
    last to its all-reduce's end), idle 800 of 1000 us, then 600 of 800 (78% in all), 2
    launches, no aten ops; plus `host_events(t)` on the host."""
    docs = []
    for rank in (0, 1):
        g = GpuRank()
        ev = []
        for n in range(1, steps + 1):
            t = (n - 1) * 1000.0
            ev += [step(n, t, 1000), *host_events(t)]
            g.kernel("ampere_sgemm_128x64_nn", t + 10, t + 100, 100)
            g.allreduce(t + 20, t + 800, 100)
        docs.append(document(ev + g.events, rank))
    return docs


def ddp_logger(t: float) -> list[dict]:
    return [
        x("DistributedDataParallel.forward", "user_annotation", t + 30, 300),
        *(sync(t + 40 + 30 * i, 10, "cudaEventSynchronize") for i in range(8)),
    ]


def grad_scaler(t: float) -> list[dict]:
    return [
        x("aten::_amp_foreach_non_finite_check_and_unscale_", "cpu_op", t + 400, 20),
        *item_ops(t + 450),
        sync(t + 460, 70),
    ]


def test_ddp_logger_syncs_do_not_make_a_rank_sync_bound(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, idle_gpu_docs(ddp_logger))
    for d in diagnose(a):
        assert d.evidence["syncs_by_caller"] == {"DDP logger": 8.0}
        assert d.evidence["user_syncs_per_step"] == 0.0 and d.evidence["idle_share"] == 0.7778
        assert d.evidence["user_sync_cost_share"] == 0.0
        # the device idles most of its time, and not on the training code's syncs: host-bound
        assert d.bottleneck == "host-bound"
        assert d.reason.endswith(
            "; syncs not the model's: DDP's runtime logger 8.0 per step (it times DDP's first 10 "
            "iterations and every 100th: profile later steps)"
        )


def test_grad_scaler_is_named_as_the_cause(tmp_path: Path) -> None:
    # GradScaler's sync [460, 530] blocks 70 us on an idle device, and the device then waits
    # for the host until the all-reduce at 800: of that, the 70 us of lead the host lost count:
    # 140 us of device idle in a 1000 us step (14%)
    a = run_analysis(tmp_path / "scaler", idle_gpu_docs(grad_scaler))
    for d in diagnose(a):
        assert d.evidence["syncs_by_caller"] == {"GradScaler": 1.0}
        assert d.evidence["sync_cost_ms_by_caller"] == {"GradScaler": 0.14}
        assert d.bottleneck == "sync-bound"
        assert d.reason.startswith("GradScaler syncs 1.0 times per step (its .item() on found_inf")
        assert "leaving the device idle 14% of the step" in d.reason
        assert d.advice == GRAD_SCALER_ADVICE
    # and the user's own .item() [705, 710]: 5 us blocked, 5 us of lost lead: 1% of the step;
    # weighed, not counted, it is below the bound; GradScaler's is the cause
    a = run_analysis(
        tmp_path / "both", idle_gpu_docs(lambda t: grad_scaler(t) + item_ops(t + 700) + [sync(t + 705, 5)])
    )
    for d in diagnose(a):
        assert d.evidence["syncs_by_caller"] == {"GradScaler": 1.0, "item": 1.0}
        assert d.evidence["user_sync_cost_share"] == 0.01
        assert d.bottleneck == "sync-bound" and d.reason.startswith("GradScaler syncs 1.0 times per step")
        assert d.advice == GRAD_SCALER_ADVICE


@pytest.mark.parametrize(
    ("cost_ms", "expected"),
    [
        ({"item": 0.10}, "sync-bound"),
        ({"item": 0.09}, "host-bound"),  # a sync that costs little is not the bottleneck, however many
        ({"copy to host": 0.05, "other: aten::nonzero": 0.05}, "sync-bound"),  # every user caller counts
        ({"DDP logger": 0.5}, "host-bound"),
        ({"GradScaler": 0.10}, "sync-bound"),
        ({"GradScaler": 0.05, "DDP logger": 0.5, "item": 0.05}, "host-bound"),
    ],
)
def test_sync_rule_weighs_only_the_training_codes_syncs(cost_ms: dict, expected: str) -> None:
    by_caller = {k: 1.0 for k in cost_ms}
    user = sum(v for k, v in cost_ms.items() if k not in ("GradScaler", "DDP logger"))
    ev = {
        "device": "gpu",
        "data_share": 0.0,
        "host_ops_per_step": 0,
        "us_per_op": None,
        "launches_per_step": 2,
        "syncs_per_step": sum(by_caller.values()),
        "syncs_by_caller": by_caller,
        "sync_share": 0.01,
        "sync_cost_ms_by_caller": cost_ms,
        "user_sync_cost_share": round(user / 1.0, 4),
        "own_step_ms": 1.0,
        "compute_share": 0.2,
        "exposed_transfer_share": 0.0,
        "idle_share": 0.5,
        "transfer_share": 0.0,
        "gemm_share": 1.0,
        "top_compute": [],
    }
    kind, reason = classify(ev, Rules())
    assert kind == expected, reason
    scaler_only = cost_ms == {"GradScaler": 0.10}
    assert (advice_for(kind, ev) == GRAD_SCALER_ADVICE) == scaler_only


# -- 3. host ops of every model thread -----------------------------------------------------------


def test_host_ops_of_every_model_thread(tmp_path: Path) -> None:
    # main: data phase [0, 100] with randn (not counted), linear > addmm; autograd's thread: mm,
    # mm, sum under the engine's function; gloo's worker and the pin-memory thread: not counted
    ev = [
        step(1, 0, 1000),
        x("harness:data", "user_annotation", 0, 100),
        x("aten::randn", "cpu_op", 10, 50),
        x("aten::linear", "cpu_op", 200, 100),
        x("aten::addmm", "cpu_op", 210, 80),
        x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 400, 200, AUTOGRAD),
        x("aten::mm", "cpu_op", 410, 50, AUTOGRAD),
        x("aten::mm", "cpu_op", 470, 50, AUTOGRAD),
        x("aten::sum", "cpu_op", 530, 30, AUTOGRAD),
        x("gloo:all_reduce", "user_annotation", 600, 100, GLOO),
        x("aten::copy_", "cpu_op", 610, 20, GLOO),
        x("aten::pin_memory", "cpu_op", 50, 300, PIN),
        x("aten::_pin_memory", "cpu_op", 60, 200, PIN),
        x("aten::copy_", "cpu_op", 70, 100, PIN),
        step(2, 1000, 1000),
        x("aten::add", "cpu_op", 1000, 10, AUTOGRAD),
    ]  # at the boundary: step 2's
    t = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(ev, 0, base_ns=None)))
    assert [s.host_ops for s in t.steps] == [5, 1]


# -- 5. a GPU run whose trace holds no kernels -----------------------------------------------------


def test_gpu_run_without_kernels_is_said_in_one_line(tmp_path: Path) -> None:
    ev = [step(1, 0, 1000), x("aten::mm", "cpu_op", 100, 200)]
    gpus = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9}]
    with_gpus = parse_trace(write(tmp_path / "a" / "rank0.pt.trace.json", document(ev, 0, deviceProperties=gpus)))
    assert with_gpus.warnings == [f"rank0.pt.trace.json: {NO_KERNELS}"] and with_gpus.device == "cpu"
    nccl = document(ev, 0)
    nccl["distributedInfo"]["backend"] = "nccl"
    assert parse_trace(write(tmp_path / "b" / "rank0.pt.trace.json", nccl)).warnings == [
        f"rank0.pt.trace.json: {NO_KERNELS}"
    ]
    assert parse_trace(write(tmp_path / "c" / "rank0.pt.trace.json", document(ev, 0))).warnings == []  # gloo, CPU
    a = run_analysis(tmp_path / "run", [document(ev, r, deviceProperties=gpus) for r in (0, 1)])
    assert [w for w in a.warnings if "no GPU kernels" in w] == [f"rank(s) 0-1: {NO_KERNELS}"]


# -- 8. Triton matmul templates, NCCL's Generic kernel, copies -------------------------------------


@pytest.mark.parametrize(
    ("name", "gemm"),
    [
        ("triton_tem_fused_mm_0", True),
        ("triton_tem_fused_addmm_relu_1", True),
        ("triton_tem_fused_bmm_2", True),
        ("triton_tem_fused__to_copy_addmm_gelu_t_view_9", True),
        ("triton_poi_fused_add_relu_0", False),
        ("triton_red_fused_sum_1", False),
        ("ampere_sgemm_128x64_nn", True),
    ],
)
def test_triton_matmul_templates_are_matrix_math(name: str, gemm: bool) -> None:
    assert bool(GEMM.search(name)) == gemm


def test_generic_nccl_kernel_takes_its_host_ops_args(tmp_path: Path) -> None:
    g = GpuRank()
    args = {
        "Collective name": "_allgather_base",
        "In msg nelems": 4096,
        "Out msg nelems": 8192,
        "dtype": "BFloat16",
        "Process Group Name": "3",
        "Group size": 2,
    }
    ev = [step(1, 0, 1000), x("record_param_comms", "cpu_op", 100, 50, **args)]
    g.kernel("ncclDevKernel_Generic", 120, 300, 100)  # launched inside record_param_comms
    g.kernel("ncclDevKernel_Generic", 500, 600, 100)  # launched outside any: only the name is known
    t = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(ev + g.events, 0)))
    assert [(c.name, c.pg, c.nelems, c.dtype) for c in t.comms] == [
        ("allgatherbase", "3", 4096, "BFloat16"),
        ("generic", "default", None, None),
    ]


def test_copies_are_their_own_category_not_idle(tmp_path: Path) -> None:
    # step [0, 1000]: an input copy [50, 100], a matmul [100, 300], a memset [450, 500], an
    # all-reduce [600, 700]: window [50, 700] (650 us), busy 400 us, idle 250 us in two gaps
    g = GpuRank()
    memcpy(g, 10, 50, 50, "HtoD (Pinned -> Device)")
    g.kernel("ampere_sgemm_128x64_nn", 20, 100, 200)
    memcpy(g, 30, 450, 50, call="cudaMemsetAsync", cat="gpu_memset")
    g.allreduce(40, 600, 100)
    a = run_analysis(tmp_path, [document([step(1, 0, 1000)] + g.events, 0)])
    cover = a.traces[0].steps[0].cover
    assert (cover.memcpy_us, cover.work_end_us) == (100.0, 500.0)  # the copies [50, 100] and [450, 500]
    [o] = a.overlap
    assert (o.window_us, o.compute_us, o.memcpy_us, o.comm_us, o.idle_us) == (650.0, 200.0, 100.0, 100.0, 250.0)
    assert [(gap.start_us, gap.dur_us) for gap in a.gaps if gap.kind == "idle"] == [(300.0, 150.0), (500.0, 100.0)]


def test_a_world_of_one_rank_has_no_communication(tmp_path: Path) -> None:
    # The same step in a world of one rank: NCCL's all-reduce [600, 700] exchanges nothing
    # (a local copy: busy, not communication), said once; no exposed transfer
    g = GpuRank()
    memcpy(g, 10, 50, 50, "HtoD (Pinned -> Device)")
    g.kernel("ampere_sgemm_128x64_nn", 20, 100, 200)
    g.allreduce(40, 600, 100)
    a = run_analysis(tmp_path, [document([step(1, 0, 1000)] + g.events, 0, world_size=1)])
    [o] = a.overlap
    assert (o.window_us, o.compute_us, o.memcpy_us, o.comm_us, o.exposed_comm_us, o.idle_us) == (
        650.0,
        200.0,
        150.0,
        0.0,
        0.0,
        300.0,
    )
    assert a.traces[0].comms == [] and any("a world of one rank" in w for w in a.warnings)


# -- the real traces ----------------------------------------------------------------------------

A100_DDP = REAL_TRACES / "hta_single_rank" / "nccl_data_a100_rank0of2.json.gz"


def test_real_traces_syncs_by_caller() -> None:
    """Who syncs in the real traces: the A100 DDP CNN only through DDP's logger (its window is
    iterations 4-6); DLRM and TorchRec through synchronous copies (8 and 9 to the device,
    from pageable memory; 2 and 6 to the host, TorchRec's all-to-all splits)."""
    a100 = parse_trace(A100_DDP)
    assert [s.syncs_by_caller for s in a100.steps] == [{"DDP logger": 8}] * 3
    [d] = diagnose(analyze(group_ranks([a100])))
    assert d.bottleneck != "sync-bound" and "DDP's runtime logger 8.0 per step" in d.reason
    dlrm = parse_trace(next((REAL_TRACES / "dlrm_8rank_v100").glob("worker0_*")))
    assert dlrm.steps[0].syncs_by_caller == {"copy to device": 8, "copy to host": 2}
    rec = parse_trace(REAL_TRACES / "hta_single_rank" / "torchrec_a100_rank0of16.json.gz")
    assert [s.syncs_by_caller for s in rec.steps] == [{"copy to device": 9, "copy to host": 6}] * 5


def test_real_traces_count_backward_on_autograds_thread() -> None:
    # per step: main thread + autograd's thread (any-depth aten ops)
    assert [s.host_ops for s in parse_trace(A100_DDP).steps] == [2381 + 1218] * 3
    dlrm = parse_trace(next((REAL_TRACES / "dlrm_8rank_v100").glob("worker0_*")))
    assert dlrm.steps[0].host_ops == 921 + 549


def test_real_traces_copies_leave_idle() -> None:
    t = parse_trace(A100_DDP)
    assert any(s.cover is not None and s.cover.memcpy_us > 0 for s in t.steps)
    a = analyze(group_ranks([t]))
    for o in a.overlap:
        assert o.memcpy_us > 0 and o.idle_us >= 0
        assert o.idle_us <= o.window_us - max(o.compute_us, o.memcpy_us)
