"""Which GPU kernels are communication: the families of communication libraries, by kernel name.

Communication is not always NCCL-named. A kernel of any family below is a collective on its rank
(a `CommOp`), never compute; `--comm-kernel REGEX` adds the user's own. Kernel names are matched
as CUPTI reports them (demangled, a template kernel's with a leading `void ` and its template and
parameter lists), that prefix and `(anonymous namespace)::` dropped. Only NCCL/RCCL kernels
launched by c10d carry the collective's args (`Collective name`, `Process Group Name`, ...); for
every other family the name is all there is: the collective is named from it and its process
group is the family's name. Which ranks such a kernel works with is not in the trace (a vLLM
all-reduce among 2 of a node's 8 GPUs, DeepEP among an expert-parallel group), so these are not
matched across ranks (`UNMATCHED`): their time is communication, exposed or hidden, and having no
known wait, what is exposed counts as transfer; they take no part in the clocks' alignment or
the straggler analysis, which NCCL's and gloo's collectives carry.

The families (`FAMILIES`), with kernel names as they appear, and the collective each names:
- NCCL, RCCL: `ncclKernel_AllReduce_RING_LL_Sum_float` (NCCL <= 2.18, RCCL on ROCm 5),
  `ncclDevKernel_AllGather_RING_LL`, `ncclDevKernel_SendRecv`, `ncclDevKernel_Generic(_4)` (newer
  NCCL, RCCL): from the args, else the name's second token (`Generic`: the host's
  `record_param_comms` op that launched it);
- NCCL symmetric kernels: `ncclSymDevKernel_AllReduce_RSxLD_AGxST_sum_f32` (2.27),
  `ncclSymkDevKernel_AllGather_LL`: the name's second token;
- MSCCL: `mscclKernel_Sum_float_LL`: msccl;
- MSCCL++: `mscclpp::collective::allreducePacket<...>` (the leaf's collective),
  `mscclpp::executionKernel<...>` (mscclpp);
- DeepEP: `deep_ep::intranode::dispatch<...>`, `deep_ep::internode_ll::combine<...>`,
  `deep_ep::intranode::notify_dispatch` (also under `dpsk::ep::` and MSCCL++'s port
  `mscclpp::ep::`): the leaf name (dispatch, combine, notify_dispatch, ...);
- NVSHMEM: `rdxn_on_stream_kernel<...>` (reduce), `fcollect_on_stream_kernel<...>` (allgather),
  `alltoall_on_stream_kernel`, `barrier_on_stream_kernel_threadgroup`, `nvshmemi_*` (nvshmem);
- custom all-reduce kernels: vLLM and SGLang `vllm::cross_device_reduce_1stage<...>`,
  `quickreduce::allreduce_prototype_twoshot`; TensorRT-LLM and FlashInfer
  `oneShotAllReduceKernel`, `twoShotAllReduceKernel`, `allreduce_fusion_kernel_oneshot_lamport`,
  `moeAllToAllKernel`; torch's symmetric memory `one_shot_all_reduce_kernel`,
  `multimem_all_gather_kernel`, `c10d::symmetric_memory::barrier_kernel`, and its intra-node
  `hybridCubeMeshAllReduceKernel`: allreduce, allgather, alltoall, barrier;
- TransformerEngine userbuffers: `userbuffers_fp16_sum_inplace_gpu_rr_rs<...>` (reducescatter),
  `..._ag` (allgather), `kuserbuffers_pullsend` (userbuffers).

Sources: NCCL 2.18.1 and 2.27.3 library symbols and `src/device/generate.py`; ROCm/rccl
`src/device/common.cu`; deepseek-ai/DeepEP `csrc/kernels/*.cu`; microsoft/mscclpp
`src/ext/collectives`; NVSHMEM 3.3 host library symbols; vllm `csrc/custom_all_reduce.cuh`;
TensorRT-LLM `customAllReduceKernels.cu`; flashinfer `include/flashinfer/comm`; pytorch
`c10d/symm_mem/CUDASymmetricMemoryOps.cu`, `intra_node_comm.cu`; TransformerEngine
`comm_gemm_overlap/userbuffers/userbuffers.cu`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VOID = re.compile(r"^(?:void\s+)?(?:\(anonymous namespace\)::)?")


@dataclass(frozen=True)
class Family:
    """One library's communication kernels: `pattern` finds them (searched in the name with
    VOID's prefix dropped); its group `coll`, when it has one, names the collective; else
    `collective` does."""

    name: str
    pattern: re.Pattern[str]
    collective: str = ""


def _f(name: str, pattern: str, collective: str = "") -> Family:
    return Family(name, re.compile(pattern), collective)


FAMILIES: tuple[Family, ...] = (
    Family("NCCL", re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel(?:Debug)?_(?P<coll>[A-Za-z]+)", re.IGNORECASE)),
    _f("NCCL", r"^ncclSymk?DevKernel_(?P<coll>[A-Za-z]+)"),
    _f("MSCCL", r"^mscclKernel_", "msccl"),
    _f(
        "DeepEP",
        r"^(?:deep_ep|dpsk::ep|mscclpp::ep)::(?:intranode|internode|internode_ll|elastic)::"
        r"(?P<coll>[A-Za-z_]+?)(?:_impl)?(?:<|\(|$)",
    ),
    _f("MSCCL++", r"^mscclpp::(?:\w+::)*(?P<coll>allreduce|allgather|alltoallv?|reducescatter|broadcast)", ""),
    _f("MSCCL++", r"^mscclpp::(?:\w+::)*executionKernel", "mscclpp"),
    _f("NVSHMEM", r"^(?P<coll>rdxn|fcollect|broadcast|alltoall|barrier|sync)_on_stream_kernel"),
    _f("NVSHMEM", r"^(?:call_)?nvshmemi?_", "nvshmem"),
    _f("custom all-reduce", r"^(?:vllm::)?cross_device_reduce_\dstage|^quickreduce::allreduce", "allreduce"),
    _f(
        "custom all-reduce",
        r"(?:^|::)(?:oneShot|twoShot|hybridCubeMesh)AllReduceKernel\b|allreduce_fusion_kernel_|"
        r"(?:^|::)twoshot_allreduce_kernel|(?:^|::)(?:one_shot|two_shot|multimem(?:_one_shot)?)"
        r"_all_reduce_kernel",
        "allreduce",
    ),
    _f("custom all-reduce", r"(?:^|::)multimem_all_gather_kernel", "allgather"),
    _f("custom all-reduce", r"(?:^|::)moeAllToAll\w*Kernel|(?:^|::)allToAllV", "alltoall"),
    _f("custom all-reduce", r"^c10d::symmetric_memory::(?P<coll>\w+?)_kernel"),
    _f("userbuffers", r"^k?userbuffers_\w*?_(?P<coll>rs|ag)(?:_|<|\(|$)"),
    _f("userbuffers", r"^k?userbuffers_", "userbuffers"),
)
# The user's own (--comm-kernel): a family of its own, named so in the process group.
USER_FAMILY = "--comm-kernel"
# The process groups of the families without group args: not matched across ranks.
UNMATCHED = frozenset({f.name for f in FAMILIES if f.name != "NCCL"} | {USER_FAMILY})
SHORT = {"rs": "reducescatter", "ag": "allgather", "rdxn": "reduce", "fcollect": "allgather"}
# Names that say communication although no family above holds them: said in a warning, not
# counted (a name is not proof; --comm-kernel makes it count).
LOOKS_LIKE_COMM = re.compile(
    r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv|broadcast|"
    r"nccl|rccl|nvshmem|mscclpp|cross_device|symmetric_memory|userbuffers",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Found:
    family: str
    collective: str  # letters only, lower case (`canonical_collective`)


def plain(kernel: str) -> str:
    return VOID.sub("", kernel, count=1)


# Point-to-point ops by the names their args give them (a send, a receive; torch's
# batch_isend_irecv), canonical: each goes to one peer, so its position among its group's ops on
# a rank pairs it with nothing on another (a ring of sends and receives, as context parallelism's,
# puts every rank's first receive at one position). Not matched across ranks (matching.py), and
# no release of a rank (runup.py: a rank waiting at one waits for its one peer, not its group).
# (`sendrecv`, a SendRecv kernel named by its name alone, is also how NCCL runs an all-to-all.)
BATCH_P2P = "batchisendirecv"  # a batch of them (parse._point_to_point_batch names NCCL's so)
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", BATCH_P2P})


def canonical_collective(name: str) -> str:
    """`all_reduce`, `AllReduce`, `allreduce` -> `allreduce` (letters only, lower case): how the
    collector names a collective, whatever named it (args, a kernel, a gloo range, a recorder entry)."""
    return re.sub(r"[^a-z]", "", name.lower())


def classify(kernel: str, user: re.Pattern[str] | None = None) -> Found | None:
    """The family and collective of a communication kernel, None for any other kernel. The
    user's pattern (`--comm-kernel`) is tried first: its first group, if it has one and it
    matched, names the collective, else "comm"."""
    name = plain(kernel)
    if user is not None:
        m = user.search(kernel) or user.search(name)
        if m:
            group = next((g for g in m.groups() if g), None) if m.groups() else None
            return Found(USER_FAMILY, canonical_collective(group) or "comm" if group else "comm")
    for f in FAMILIES:
        m = f.pattern.search(name)
        if m:
            coll = m.groupdict().get("coll")
            if coll:
                coll = SHORT.get(coll, coll)
            return Found(f.name, canonical_collective(coll or f.collective) or canonical_collective(f.name))
    return None


def looks_like_comm(kernel: str) -> bool:
    """A kernel no family holds whose name still says communication."""
    return LOOKS_LIKE_COMM.search(kernel) is not None
