"""The generated half of the detection campaign: GPU-shaped traces from the device-queue simulator
(tests/devicesim.py) at 8 to 1024 ranks, with an exact ground truth, scored like the real runs.

One case (`draw_case`, from one random generator):
1. the job: `ranks` over hosts of 8, `steps` profiled steps; per step each rank runs a data phase
   on the host, a forward and a backward phase of kernels and an optimizer phase, under DDP or
   FSDP (`parallel`). DDP: the all-reduce of the gradients is launched once backward's last
   kernel is queued, on the comm stream, and the optimizer's kernels wait for it (DDP's
   gradients are read only once reduced). FSDP (FSDP2's streams): one layer per forward kernel;
   each layer's all-gather runs on the process group's NCCL stream and waits for the copy-out
   of the layer before it on the compute stream (FSDP2 lets one all-gather run ahead: the next
   waits for the event recorded after the previous copy-out), the first for the compute stream
   at forward's start (the root's pre-forward makes its streams wait for the optimizer); the
   layer's copy-out, on the compute stream, waits for its all-gather, and its kernels follow.
   Backward takes the layers in reverse, all-gathering each again the same way, and
   reduce-scatters each layer's gradients once its two kernels are queued (the reduce-scatter
   waits for the compute stream); the optimizer waits for the last reduce-scatter (FSDP2's
   final callback makes the compute stream wait for it). HSDP (FSDP2 on a 2-D mesh): the same
   with each host's ranks one shard group, whose all-gathers and reduce-scatters they are, and
   each reduce-scatter followed by an all-reduce of its shard over the ranks at one place on
   every host (the replicate group; none on one host). TP (Megatron's tensor parallelism with
   data parallelism across hosts): the ranks of a host are one tensor-parallel group and the
   ranks at one place on every host one data-parallel group; each layer's kernels end at an
   all-reduce over the tensor-parallel group (forward one kernel a layer, backward two), which
   the next layer's kernels wait for (its output is their input), and backward ends with the
   gradients' all-reduce over the data-parallel group (none on one host), which the optimizer
   waits for. EP (a mixture of experts with expert parallelism): the same groups, each host's
   ranks one expert-parallel group; each layer's dense kernels end at an all-to-all over it that
   dispatches the tokens to the experts, whose kernels wait for it and end at a second all-to-all
   that combines the tokens (each half a tensor-parallel all-reduce's transfer), which the next
   layer waits for; backward takes each layer the same way with twice the kernels, and ends with
   the gradients' all-reduce over the data-parallel group. PP (pipeline parallelism, `pp_layout`,
   `pp_groups`): 2 stages under 32 ranks, else 4, each stage a contiguous block of ranks that
   all-reduces its gradients at the end of backward (none where a stage has one rank); each
   pipeline (the ranks at one place in every stage) runs 1F1B (`one_f_one_b`) over twice as many
   microbatches as stages, a microbatch's forward one kernel through the stage's layers and its
   backward two, each pass receiving its input from the stage before (activations) or after
   (gradients) and sending its output on, NCCL sends and receives on a stream per peer and
   direction, each receive posted as the host gets to it (its kernel waits for the data, and the
   pass's kernels wait for it). Every collective has its own group's ranks, none all of the job's;
   with `sync_each_step` the loop reads the loss (`.item()`) at the end of each step, which
   keeps its host at most a step ahead of the device (otherwise the host runs ahead and a host
   delay may cost the job nothing);
2. noise: every kernel and host phase is drawn around its mean with a relative sd `jitter`
   (0.5-3%), and each host's clock is off by up to `skew_ms` (all ranks of a host share it);
3. the injection: none (clean), or one or two ranks whose `phase` takes `size` x the clean
   step longer, as host time (`sleep`: a slow input pipeline, Python) or as longer kernels
   (`compute`: a slower GPU), on every step from `onset`, or every `every`-th step;
4. the truth: the same program simulated without the injection (the same noise draws); the
   case's cost per step is (the end of the injected job's last collective - the clean job's) /
   steps, exact. (A delay after the last collective keeps nobody waiting; one the host hides
   by running ahead costs nothing: both are no stragglers, whatever was injected.)
Each case's traces are written to a scratch folder, read by the collector's own parser and
analysed (`harness.traces.run_analysis.analyze`, the command's analysis), then removed.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from detect.gpu_watch import watch_case
from detect.score import Seen, Truth, case_row, score

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from harness.report.floor import floor_record, floor_step  # noqa: E402
from harness.traces.read.discover import group_ranks  # noqa: E402
from harness.traces.read.parse import parse_trace  # noqa: E402
from harness.traces.run_analysis import analyze  # noqa: E402

from devicesim import COMPUTE_STREAM, Sim, write_all  # noqa: E402

GEMM = "ampere_sgemm_128x64_nn"
COPY_OUT = "void at::native::(anonymous namespace)::CatArrayBatchedCopy"  # FSDP's all-gather copy-out
COPY_OUT_US = 20.0
PHASES = ("data", "forward", "backward", "optimizer")
GPUS_PER_HOST = 8
# The ranks a generated job has; the small ones most often (cases per minute), 1024 for scale.
RANK_CHOICES = (8, 8, 16, 16, 32, 64, 128, 256)


@dataclass(frozen=True, kw_only=True)
class SimCase:
    ranks: int
    steps: int
    data_us: float  # host time of the data phase
    fwd_kernels: int
    kernel_us: float  # one forward kernel; backward has twice as many of them
    transfer_us: float  # the all-reduce's transfer
    opt_us: float  # the optimizer's kernels, in all
    sync_each_step: bool
    jitter: float  # relative sd of every duration
    skew_ms: float  # the largest clock error of a host
    kind: str  # clean, sleep or compute
    slow: tuple[int, ...]
    phase: str | None
    size: float  # the injected delay per slowed step / the clean step (estimate, see `clean_step_us`)
    every: int
    onset: int  # the first slowed step
    parallel: str = "ddp"  # ddp, fsdp, hsdp, tp, ep or pp (module docstring, 1)

    def clean_step_us(self) -> float:
        """The step's length without noise and injection when the device bounds it (an estimate
        for sizing the delay: the truth comes from the simulation)."""
        device = 3 * self.fwd_kernels * self.kernel_us + self.transfer_us + self.opt_us
        if self.parallel in ("tp", "ep"):  # EP: two all-to-alls a layer, each half the transfer
            device += 2 * self.fwd_kernels * self.tp_transfer_us()
        elif self.parallel == "pp":  # a stage's share of the gradients; 1F1B's bubble
            stages, micro = pp_layout(self.ranks)
            compute = 3 * self.fwd_kernels * self.kernel_us * (micro + stages - 1) / micro
            device = compute + self.transfer_us * (1 / stages + (stages - 1) / micro) + self.opt_us
        elif self.parallel == "hsdp":
            device += self.transfer_us / GPUS_PER_HOST  # the replicate all-reduces
        host = self.data_us + (3 * self.fwd_kernels + 4) * 5.0
        return max(device, host) if not self.sync_each_step else device + self.data_us

    def tp_transfer_us(self) -> float:
        """One tensor-parallel all-reduce's transfer: a layer's activations, half the gradients'
        transfer shared over the layers (module docstring, 1)."""
        return self.transfer_us / (2 * self.fwd_kernels)

    def slowed(self, rank: int, phase: str, step: int) -> bool:
        return (
            self.kind != "clean"
            and rank in self.slow
            and phase == self.phase
            and step >= self.onset
            and (step - self.onset) % self.every == 0
        )


SHAPES = ("ddp", "fsdp", "tp", "hsdp", "ep", "pp")


def draw_case(rng: random.Random, ranks: int | None = None, shapes: tuple[str, ...] = SHAPES) -> SimCase:
    """One case's parameters (module docstring); a fifth of the cases are clean. `shapes`: the
    parallelisms drawn (DDP twice as often as FSDP, a quarter of the cases TP where drawn, half
    of the FSDP ones HSDP where drawn, half of the TP ones EP where drawn, a quarter of the DDP
    ones PP where drawn)."""
    n = ranks or rng.choice(RANK_CHOICES)
    steps = 8
    kind = "clean" if rng.random() < 0.2 else rng.choice(("sleep", "compute"))
    slow: tuple[int, ...] = ()
    if kind != "clean":
        slow = tuple(sorted(rng.sample(range(n), 2 if rng.random() < 0.25 else 1)))
    every = 1 if rng.random() < 0.6 else rng.choice((2, 3))
    case = SimCase(
        ranks=n,
        steps=steps,
        data_us=rng.uniform(300.0, 3000.0),
        fwd_kernels=rng.randint(3, 6),
        kernel_us=rng.uniform(300.0, 1500.0),
        transfer_us=rng.uniform(200.0, 2000.0),
        opt_us=rng.uniform(200.0, 1000.0),
        sync_each_step=rng.random() < 0.7,
        jitter=rng.uniform(0.005, 0.03),
        skew_ms=rng.choice((0.0, 0.5, 2.0, 5.0)),
        kind=kind,
        slow=slow,
        phase=rng.choice(PHASES) if kind != "clean" else None,
        size=rng.uniform(0.05, 1.0) if kind != "clean" else 0.0,
        every=every,
        onset=rng.randint(1, 3),
        parallel="fsdp" if rng.random() < 1 / 3 else "ddp",  # drawn last: earlier seeds' other draws stay
    )
    # drawn after: without TP, a seed draws what it drew before TP was added
    if "tp" in shapes and rng.random() < 0.25:
        case = replace(case, parallel="tp")
    if "hsdp" in shapes and case.parallel == "fsdp" and rng.random() < 0.5:  # after TP's, likewise
        case = replace(case, parallel="hsdp")
    if "ep" in shapes and case.parallel == "tp" and rng.random() < 0.5:  # after HSDP's, likewise
        case = replace(case, parallel="ep")
    if "pp" in shapes and case.parallel == "ddp" and rng.random() < 0.25:  # after EP's, likewise
        case = replace(case, parallel="pp")
    if case.parallel not in shapes:
        case = replace(case, parallel=next((p for p in ("ddp", "fsdp") if p in shapes), shapes[0]))
    return case


def simulate(case: SimCase, noise_seed: int, inject: bool) -> tuple[Sim, float]:
    """The case's job (module docstring, 1-3); (the simulator run, the end of its last collective)."""
    rng = random.Random(noise_seed)
    sim = Sim(world_size=case.ranks)
    delay_us = case.size * case.clean_step_us()

    def noisy(us: float) -> float:
        return max(us * rng.gauss(1.0, case.jitter), 1.0)

    for r in range(case.ranks):
        h = sim.rank(r)
        last_compute = None  # the last op launched on the compute stream (FSDP's first all-gather waits for it)
        for n in range(1, case.steps + 1):
            extra = {p: inject and case.slowed(r, p, n) for p in PHASES}
            slow_kernels = {p: delay_us if extra[p] and case.kind == "compute" else 0.0 for p in PHASES}
            with h.step(n):
                with h.range("data"):
                    h.cpu(noisy(case.data_us), "aten::copy_")
                    if extra["data"] and case.kind == "sleep":
                        h.sleep(delay_us)
                    if slow_kernels["data"]:  # a GPU-side input transform, slowed
                        last_compute = h.launch("void at::native::vectorized_elementwise_kernel", slow_kernels["data"])
                if case.parallel in ("fsdp", "hsdp"):
                    reduced = _fsdp_passes(h, case, noisy, slow_kernels, extra, delay_us, last_compute)
                elif case.parallel == "tp":
                    reduced = _tp_passes(h, case, noisy, slow_kernels, extra, delay_us)
                elif case.parallel == "ep":
                    reduced = _ep_passes(h, case, noisy, slow_kernels, extra, delay_us)
                elif case.parallel == "pp":
                    reduced = _pp_passes(h, case, noisy, slow_kernels, extra, delay_us)
                else:
                    reduced = _ddp_passes(h, case, noisy, slow_kernels, extra, delay_us)
                with h.range("optimizer"):
                    # the optimizer reads the reduced gradients: its stream waits for the last collective
                    last_compute = h.launch(
                        "void at::native::multi_tensor_apply_kernel",
                        noisy(case.opt_us) + slow_kernels["optimizer"],
                        after=reduced,
                    )
                    if extra["optimizer"] and case.kind == "sleep":
                        h.sleep(delay_us)
                if case.sync_each_step:
                    h.item()
        h.sync(kind="device")
    # the last collective ends on every rank at once: what any rank did after it kept nobody waiting
    end = max(op.end_us for t in sim.truth() for op in t.ops if op.coll is not None)
    return sim, end


def _ddp_passes(
    h: Any, case: SimCase, noisy: Any, slow_kernels: dict[str, float], extra: dict[str, bool], delay_us: float
) -> Any:
    """Forward and backward under DDP (module docstring, 1); the all-reduce's handle."""
    last = reduced = None
    for phase, count in (("forward", case.fwd_kernels), ("backward", 2 * case.fwd_kernels)):
        with h.range(phase):
            for _ in range(count):
                last = h.launch(GEMM, noisy(case.kernel_us) + slow_kernels[phase] / count)
            if extra[phase] and case.kind == "sleep":
                h.sleep(delay_us)
            if phase == "backward":
                reduced = h.collective("allreduce", case.transfer_us, after=last)
    return reduced


def _fsdp_passes(
    h: Any,
    case: SimCase,
    noisy: Any,
    slow_kernels: dict[str, float],
    extra: dict[str, bool],
    delay_us: float,
    last_compute: Any,
) -> Any:
    """Forward and backward under FSDP or HSDP (module docstring, 1); the last reduce-scatter's
    handle (HSDP: the last all-reduce's, where there is one).
    Each all-gather moves a layer's parameters, a reduce-scatter its gradients: the all-reduce's
    transfer split over the layers, twice over (all-gather then reduce-scatter)."""
    layers = case.fwd_kernels
    transfer_us = case.transfer_us / layers
    gate = last_compute  # what the next all-gather waits for on the compute stream
    reduced = None
    shard: dict[str, Any] = {}  # FSDP: the default group
    replicate: dict[str, Any] | None = None
    if case.parallel == "hsdp":
        host_ranks, place_ranks = tp_groups(case.ranks, h.rank)
        host_pg, place_pg = group_names(case.ranks, h.rank)
        shard = {"pg": host_pg, "ranks": host_ranks}
        if len(place_ranks) > 1:
            replicate = {"pg": place_pg, "ranks": place_ranks}
    for phase, per_layer in (("forward", 1), ("backward", 2)):
        count = layers * per_layer
        with h.range(phase):
            for layer in range(layers):
                if layer == layers // 2 and extra[phase] and case.kind == "sleep":
                    h.sleep(delay_us)  # host time between two layers (a slow Python hook, say)
                gathered = h.collective("allgather", transfer_us, after=gate, **shard)
                copy_out = h.launch(COPY_OUT, COPY_OUT_US, after=gathered)
                gate = copy_out
                for _ in range(per_layer):
                    last = h.launch(GEMM, noisy(case.kernel_us) + slow_kernels[phase] / count)
                if phase == "backward":
                    reduced = h.collective("reduce_scatter", transfer_us, after=last, **shard)
                    if replicate is not None:
                        reduced = h.collective("allreduce", transfer_us / GPUS_PER_HOST, after=reduced, **replicate)
    return reduced


def tp_groups(ranks: int, r: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rank r's tensor-parallel group (its host's ranks) and data-parallel group (the ranks at its
    place on every host), as sorted rank tuples."""
    host, place = divmod(r, GPUS_PER_HOST)
    first = host * GPUS_PER_HOST
    tp = tuple(range(first, min(first + GPUS_PER_HOST, ranks)))
    dp = tuple(range(place, ranks, GPUS_PER_HOST))
    return tp, dp


def group_names(ranks: int, r: int) -> tuple[str, str]:
    """The names of rank r's `tp_groups`, by number, as every rank creates them in one order:
    1 + host for a host's group, 1 + hosts + place for a place's."""
    hosts = -(-ranks // GPUS_PER_HOST)
    return str(1 + r // GPUS_PER_HOST), str(1 + hosts + r % GPUS_PER_HOST)


def _tp_passes(
    h: Any, case: SimCase, noisy: Any, slow_kernels: dict[str, float], extra: dict[str, bool], delay_us: float
) -> Any:
    """Forward and backward under TP (module docstring, 1); what the optimizer waits for (the
    gradients' all-reduce, or on one host backward's last all-reduce)."""
    tp, dp = tp_groups(case.ranks, h.rank)
    tp_pg, dp_pg = group_names(case.ranks, h.rank)
    layers = case.fwd_kernels
    reduced = None
    for phase, per_layer in (("forward", 1), ("backward", 2)):
        count = layers * per_layer
        with h.range(phase):
            for layer in range(layers):
                if layer == layers // 2 and extra[phase] and case.kind == "sleep":
                    h.sleep(delay_us)  # host time between two layers
                for _ in range(per_layer):
                    last = h.launch(GEMM, noisy(case.kernel_us) + slow_kernels[phase] / count, after=reduced)
                    reduced = None
                reduced = h.collective("allreduce", case.tp_transfer_us(), pg=tp_pg, ranks=tp, after=last)
            if phase == "backward" and len(dp) > 1:
                reduced = h.collective("allreduce", case.transfer_us, pg=dp_pg, ranks=dp, after=reduced)
    return reduced


def _ep_passes(
    h: Any, case: SimCase, noisy: Any, slow_kernels: dict[str, float], extra: dict[str, bool], delay_us: float
) -> Any:
    """Forward and backward under expert parallelism (module docstring, 1); what the optimizer
    waits for. Groups as TP's: the expert-parallel group is the host's ranks."""
    ep, dp = tp_groups(case.ranks, h.rank)
    ep_pg, dp_pg = group_names(case.ranks, h.rank)
    layers = case.fwd_kernels
    reduced = None
    for phase, per_layer in (("forward", 1), ("backward", 2)):
        count = 2 * layers * per_layer  # a layer's dense kernels, then its experts'
        with h.range(phase):
            for layer in range(layers):
                if layer == layers // 2 and extra[phase] and case.kind == "sleep":
                    h.sleep(delay_us)  # host time between two layers
                for _ in ("dense, then dispatch", "experts, then combine"):
                    for _ in range(per_layer):
                        us = noisy(case.kernel_us / 2) + slow_kernels[phase] / count
                        last = h.launch(GEMM, us, after=reduced)
                        reduced = None
                    reduced = h.collective("alltoall", case.tp_transfer_us() / 2, pg=ep_pg, ranks=ep, after=last)
            if phase == "backward" and len(dp) > 1:
                reduced = h.collective("allreduce", case.transfer_us, pg=dp_pg, ranks=dp, after=reduced)
    return reduced


def pp_layout(ranks: int) -> tuple[int, int]:
    """A pipeline-parallel job's (stages, microbatches): 2 stages under 32 ranks, else 4; twice
    as many microbatches as stages (1F1B's bubble then costs (stages - 1) / microbatches of the
    step)."""
    stages = 2 if ranks < 32 else 4
    return stages, 2 * stages


def pp_groups(ranks: int, r: int) -> tuple[tuple[int, ...], tuple[int, ...], str, str]:
    """Rank r's data-parallel group (its stage's ranks, a contiguous block), its pipeline (the
    ranks at its place in every stage's block) and the two groups' names (by number, as every rank
    creates them in one order: 1 + stage, then 1 + stages + place)."""
    stages, _ = pp_layout(ranks)
    per_stage = ranks // stages
    stage, place = divmod(r, per_stage)
    dp = tuple(range(stage * per_stage, (stage + 1) * per_stage))
    pipe = tuple(range(place, ranks, per_stage))
    return dp, pipe, str(1 + stage), str(1 + stages + place)


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B's order of a stage's passes: ("forward" | "backward", microbatch): as many forwards
    as stages after it first (the warm-up), then one forward and one backward in turn, then the
    backwards left."""
    warmup = min(stages - 1 - stage, microbatches)
    order = [("forward", m) for m in range(warmup)]
    for k in range(microbatches - warmup):
        order += [("forward", warmup + k), ("backward", k)]
    return order + [("backward", m) for m in range(microbatches - warmup, microbatches)]


# The pipeline's point-to-point streams: one per peer and direction, so that each stream's ops
# meet one peer's in order (NCCL runs each peer's sends and receives on a stream of its own).
RECV_PREV, RECV_NEXT, SEND_NEXT, SEND_PREV = 21, 22, 23, 24


def _pp_passes(
    h: Any, case: SimCase, noisy: Any, slow_kernels: dict[str, float], extra: dict[str, bool], delay_us: float
) -> Any:
    """Forward and backward under pipeline parallelism (module docstring, 1); what the optimizer
    waits for (the stage's gradients' all-reduce, or with one rank a stage its last kernel)."""
    stages, micro = pp_layout(case.ranks)
    dp, pipe, dp_pg, pipe_pg = pp_groups(case.ranks, h.rank)
    stage = pipe.index(h.rank)
    prev_rank = pipe[stage - 1] if stage else None
    next_rank = pipe[stage + 1] if stage + 1 < stages else None
    layer_us = case.fwd_kernels * case.kernel_us / micro  # a microbatch through the stage's layers
    hop_us = case.transfer_us / (2 * micro)  # one microbatch's activations (or their gradients)
    slept = {"forward": False, "backward": False}
    last = None
    for phase, _m in one_f_one_b(stage, stages, micro):
        per_pass = 1 if phase == "forward" else 2
        source, sink = (prev_rank, next_rank) if phase == "forward" else (next_rank, prev_rank)
        with h.range(phase):
            if extra[phase] and case.kind == "sleep" and not slept[phase]:
                h.sleep(delay_us)  # host time before the phase's first pass (a slow Python hook, say)
                slept[phase] = True
            got = None
            if source is not None:
                stream = RECV_PREV if phase == "forward" else RECV_NEXT
                got = h.p2p("recv", source, hop_us, pg=pipe_pg, ranks=pipe, stream=stream)
            for _ in range(per_pass):
                us = noisy(layer_us) + slow_kernels[phase] / (micro * per_pass)
                last = h.launch(GEMM, us, after=got)
                got = None
            if sink is not None:
                stream = SEND_NEXT if phase == "forward" else SEND_PREV
                h.p2p("send", sink, hop_us, pg=pipe_pg, ranks=pipe, stream=stream, after=last)
    if len(dp) > 1:
        return h.collective("allreduce", case.transfer_us / stages, pg=dp_pg, ranks=dp, after=last)
    return last


def documents(case: SimCase, sim: Sim, skew_seed: int) -> list[dict[str, Any]]:
    """The simulated documents with one host name and one clock error per host."""
    rng = random.Random(skew_seed)
    hosts = -(-case.ranks // GPUS_PER_HOST)
    skew_us = [rng.uniform(-case.skew_ms, case.skew_ms) * 1e3 if h else 0.0 for h in range(hosts)]
    docs = []
    for r, doc in enumerate(sim.run()):
        h = r // GPUS_PER_HOST
        shift = skew_us[h]
        events = doc["traceEvents"]
        if shift:
            events = [dict(e, ts=e["ts"] + shift) if isinstance(e.get("ts"), (int, float)) else e for e in events]
        docs.append({**doc, "traceEvents": events, "host_name": f"node{h:03d}"})
    return docs


def simulate_with_truth(case: SimCase, seed: int, cost_steps: int) -> tuple[Sim, Truth, float]:
    """The case's job simulated as injected, its truth and its clean step (us): the job also
    simulated without the injection (the same noise), the cost per step = how much later the
    last all-reduce ends, over `cost_steps` steps, as a share of the clean step."""
    clean, clean_end = simulate(case, seed, inject=False)
    sim, end = (clean, clean_end) if case.kind == "clean" else simulate(case, seed, inject=True)
    clean_step = clean_end / case.steps
    truth = Truth(
        kind="clean" if case.kind == "clean" else "straggler",
        ranks=list(case.slow),
        phase=case.phase,
        cost_share=round((end - clean_end) / cost_steps / clean_step, 4),
    )
    return sim, truth, clean_step


def run_case(case: SimCase, seed: int, scratch: Path) -> dict[str, Any]:
    """Simulate, analyse and score one case; its row for the campaign's JSON, with the live
    watch's run of the same job (detect/gpu_watch.py) under "watch"."""
    sim, truth, clean_step = simulate_with_truth(case, seed, case.steps)
    folder = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    try:
        paths = write_all(documents(case, sim, seed + 1), folder, "rank{rank}.pt.trace.json")
        a = analyze(group_ranks([parse_trace(p) for p in paths]))
        floor = floor_record(a.stragglers)
        said = floor_step(floor, a.stragglers.verdict)
        seen = Seen(
            verdict=a.stragglers.verdict,
            stragglers={s.rank: s.phase for s in a.stragglers.stragglers},
            late_ms={r.rank: r.late_ms for r in a.stragglers.ranks if r.rank in case.slow or r.straggler},
            threshold_ms=a.stragglers.threshold_ms,
            floor_share=floor.share if floor and said else None,
            latest_rank=floor.latest_rank if floor else None,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in case.__dict__.items()}
    params["seed"] = seed
    params["clean_step_ms"] = round(clean_step / 1e3, 3)
    row = case_row({"campaign": "generated", **params}, truth, seen, score(truth, seen))
    hosts = {r: f"node{r // GPUS_PER_HOST:03d}" for r in range(case.ranks)}
    row["watch"] = watch_case(case, seed, simulate_with_truth, hosts, COMPUTE_STREAM)
    return row
