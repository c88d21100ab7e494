"""Communication that is not named ncclKernel (comm_kernels.py): every family's kernels are
collectives, not compute; names that only look like communication are said; --comm-kernel adds
the user's own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.traces.read.comm_kernels import classify, looks_like_comm

from jobs import REPO
from tracebuild import GpuRank, document, run_analysis, step, write

NAMES = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "NCCL", "allreduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "NCCL", "allgather"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "NCCL", "generic"),
    ("ncclSymkDevKernel_ReduceScatter_LD_sum_bf16(ncclSymkDevWorkArgs4K)", "NCCL", "reducescatter"),
    ("mscclKernel_Sum_float_LL(ncclDevComm*, mscclAlgo*, mscclWork*)", "MSCCL", "msccl"),
    ("void deep_ep::intranode::dispatch<8, 768>(int4*, float*, int*)", "DeepEP", "dispatch"),
    ("void deep_ep::internode_ll::combine<false, 7168>(void*, int*)", "DeepEP", "combine"),
    ("void dpsk::ep::intranode::notify_dispatch(int const*, int*)", "DeepEP", "notifydispatch"),
    ("void mscclpp::collective::allreducePacket<float>(float*)", "MSCCL++", "allreduce"),
    ("void rdxn_on_stream_kernel<float, (rdxn_ops)0>(int, float*)", "NVSHMEM", "reduce"),
    ("void fcollect_on_stream_kernel<int>(int*)", "NVSHMEM", "allgather"),
    ("nvshmemi_proxy_rma_entrypoint(void*)", "NVSHMEM", "nvshmem"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*)", "custom all-reduce", "allreduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<float, 8>(AllReduceParams)", "custom all-reduce", "allreduce"),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel<float, 16, 8>(float**)", "custom all-reduce", "allreduce"),
    ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*)", "custom all-reduce", "allgather"),
    ("c10d::symmetric_memory::barrier_kernel(unsigned int**, int)", "custom all-reduce", "barrier"),
    ("void userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int, int)", "userbuffers", "reducescatter"),
]


@pytest.mark.parametrize(("kernel", "family", "collective"), NAMES)
def test_each_family_is_communication(kernel: str, family: str, collective: str) -> None:
    found = classify(kernel)
    assert found is not None and (found.family, found.collective) == (family, collective)


def test_other_kernels_are_not() -> None:
    for kernel in (
        "ampere_sgemm_128x64_nn",
        "void deep_ep::layout::get_dispatch_layout<256>(long*)",
        "void at::native::vectorized_elementwise_kernel<4>(int)",
        "moe_align_block_size_kernel",
    ):
        assert classify(kernel) is None
    assert looks_like_comm("my_fused_allreduce_rmsnorm") and not looks_like_comm("ampere_sgemm_128x64_nn")
    user = re.compile(r"my_fused_(allreduce)")
    found = classify("my_fused_allreduce_rmsnorm", user)
    assert found is not None and (found.family, found.collective) == ("--comm-kernel", "allreduce")


DISPATCH = "void deep_ep::intranode::dispatch<8, 768>(int4*, float*, int*)"
COMBINE = "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*)"


def ep_docs(custom: str | None = None) -> list[dict]:
    """Two expert-parallel ranks, two 1 ms steps; per step: a 500 us GEMM, then DeepEP's
    dispatch (rank 0 enters at +500, rank 1 at +600, both end at +800), a 50 us expert GEMM at
    +800, combine [+900, +1000]; `custom`: one more kernel of that name [+850, +900]."""
    docs = []
    for rank, enter in ((0, 500.0), (1, 600.0)):
        g = GpuRank()
        ev = []
        for n, t in ((1, 0.0), (2, 1000.0)):
            ev.append(step(n, t, 1000.0))
            g.kernel("ampere_sgemm_128x64_nn", t + 1, t, enter)
            g.kernel(DISPATCH, t + 2, t + enter, 800.0 - enter)
            g.kernel("ampere_sgemm_64x64_nn", t + 3, t + 800.0, 50.0)
            if custom:
                g.kernel(custom, t + 4, t + 850.0, 50.0)
            g.kernel(COMBINE, t + 5, t + 900.0, 100.0)
        docs.append(document(ev + g.events, rank))
    return docs


def test_deep_ep_is_communication_not_matched_across_ranks(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, ep_docs())
    # which ranks DeepEP's kernels work with is not in the trace: they are not matched
    assert a.instances == [] and a.stragglers.verdict == "inconclusive"
    assert sorted({(c.name, c.pg) for t in a.traces for c in t.comms}) == [
        ("combine", "DeepEP"),
        ("dispatch", "DeepEP"),
    ]
    r1 = [o for o in a.overlap if o.rank == 1]
    # rank 1, per 1 ms span: compute 600 + 50, communication 200 + 100 (none of it compute), all
    # of it exposed, and with no wait known, transfer
    assert [(o.compute_us, o.comm_us, o.exposed_comm_us, o.exposed_transfer_us) for o in r1] == [
        (650.0, 300.0, 300.0, 300.0)
    ] * 2


def test_lookalike_kernels_are_said_and_counted_with_comm_kernel(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    for r, doc in enumerate(ep_docs(custom="my_fused_allreduce_rmsnorm_kernel")):
        write(folder / f"rank{r}.pt.trace.json", doc)
    plain = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(folder), "-o", str(tmp_path / "a"), "-q"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    doc = json.loads((tmp_path / "a" / "report.json").read_text())
    assert any(
        "look like communication are counted as compute: `my_fused_allreduce_rmsnorm_kernel` (0.10 ms)" in w
        and "--comm-kernel" in w
        for w in doc["warnings"]
    ), doc["warnings"]
    told = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.collect",
            str(folder),
            "-o",
            str(tmp_path / "b"),
            "-q",
            "--comm-kernel",
            "my_fused_(allreduce)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert told.returncode == 0, told.stderr
    doc = json.loads((tmp_path / "b" / "report.json").read_text())
    assert doc["ranks"][0]["comm_ms"] == pytest.approx(2 * 0.45)  # dispatch 300, its own 50, combine 100
    assert not any("look like communication" in w for w in doc["warnings"])
    bad = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(folder), "--comm-kernel", "("],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--comm-kernel: '(' is not a regular expression" in bad.stderr
