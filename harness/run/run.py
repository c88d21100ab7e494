"""`harness.Run`: every in-job feature of the harness for any training loop.

    import harness
    with harness.Run(run_name="mine", log_dir="profiler_logs", steps=1000, model=model, optimizer=opt) as run:
        for batch in loader:
            with run.step():
                ...  # phases found by themselves (auto_phases.py), or `with run.phase("data"): ...`

Used after the process group exists (rank and world size come from torch.distributed), or with
none for one rank. What it gives the loop, as `python -m harness.train` gives the lab (which runs
on it): per-rank traces on the profiler's schedule with the names torch-tb-profiler and the
collector read, phase ranges as record_function and NVTX, step timing by CUDA events (no
per-step sync), `steps/rank<R>.jsonl`, `status/`, TensorBoard scalars, the live straggler watch
and its triggered captures, a Flight Recorder dump when a rank fails or hangs, memory and CPU
samples per step, in-job trace summaries, `run.json` and the final table; a write that fails
never stops training. Settings: `run_config.py` (keyword arguments, a TOML file, HARNESS_*
variables).

A loop that does not mark its steps (no `step()` / `begin_step()`) still gets its profiler
traces of the whole run; one without phases gets whole steps; each said once at the end.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from harness.paths import RUN_FILE, run_file, scalars_dir, steps_path, watch_path
from harness.run import flight
from harness.run.auto_phases import AutoPhases, PhaseSink
from harness.run.comm_wait import CommWaitTimer
from harness.run.grads_ready import GradientsReady
from harness.run.metrics import Metrics, metrics_target
from harness.run.profiling import TraceRecorder
from harness.run.ranges import phase_range
from harness.run.run_config import RunConfig, load_run_config
from harness.run.run_info import (
    RunIdentity,
    agree_identity,
    check_output_everywhere,
    gather,
    host_name,
    write_run_json,
)
from harness.run.run_status import RankStatus, Terminated, sigterm_deferred
from harness.run.settings import LaunchEnv
from harness.run.stats import StepLog, SystemSampler, format_rank_table
from harness.run.timing import StepClock
from harness.scalars import ScalarWriter, step_scalars
from harness.traces.read.watch_log import watch_line, watch_record
from harness.tracker_summary import SummaryRecord, flat
from harness.watch.exchange import Watch
from harness.write_faults import FaultLog

if TYPE_CHECKING:
    from harness.debug.worker import LiveState

PROG = "harness"


def launch_env(device: torch.device) -> LaunchEnv:
    """This process's place in the job: from torch.distributed when a process group exists,
    else from the launcher's variables (one rank without them)."""
    base = LaunchEnv.from_environ(cuda=device.type == "cuda")
    if not (dist.is_available() and dist.is_initialized()):
        return LaunchEnv(
            rank=0,
            local_rank=base.local_rank,
            world_size=1,
            distributed=False,
            cuda=base.cuda,
            accelerate_fsdp=False,
            local_world_size=1,
            device_count=base.device_count,
        )
    return LaunchEnv(
        rank=dist.get_rank(),
        local_rank=base.local_rank,
        world_size=dist.get_world_size(),
        distributed=True,
        cuda=base.cuda,
        accelerate_fsdp=base.accelerate_fsdp,
        local_world_size=base.local_world_size,
        device_count=base.device_count,
    )


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


# How often the finished steps' records are written, not after every step: a step's bookkeeping
# run right after its kernels, its code out of the CPU's caches, costs several times what a batch
# of them costs (bench/RESULTS.md, "Harness and profiler overhead", (i)). A tenth of a second
# bounds what a rank killed without warning leaves unwritten and how late the metrics and the
# debug page are, both read once a second; a step longer than it is written at its end.
RECORDS_EVERY_S = 0.1


class Run(PhaseSink):
    """One rank's part of a profiled run (module docstring). Settings as keyword arguments
    (`run_config.py`: the names of `harness.train`'s flags), `config=` a TOML file, HARNESS_*
    variables; `device`: the one the loop computes on (default: the current CUDA device, else
    the CPU). `model` (the module the loop calls: wrapped in DDP, FSDP or torch.compile as it is
    called) and `optimizer` (one or a list): the step's phases are found from hooks on them
    (auto_phases.py), no `run.phase()` needed."""

    def __init__(
        self,
        *,
        config: str | Path | None = None,
        device: torch.device | str | None = None,
        settings: RunConfig | None = None,
        record: dict[str, Any] | None = None,
        flight_recorder: bool | None = None,
        prog: str = PROG,
        quiet: bool = False,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
        **options: Any,
    ) -> None:
        # settings/record/flight_recorder/prog: for `harness.train`, which runs on this class with
        # its own validated config, its whole config in run.json and its own name in messages;
        # quiet: no table at the end (the overhead benchmark's repeated runs)
        self.cfg = settings if settings is not None else load_run_config(config, options)
        self.device = torch.device(device) if device is not None else default_device()
        self.record = record
        self.prog = prog
        self.quiet = quiet
        self._flight = flight_recorder
        self.step_number = -1  # the step open or last closed
        self.progress = flight.Progress()  # where the loop is, for a Flight Recorder dump
        self.extra_row: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] | None = None
        self.run_json: Path | None = None
        self._in_step = False
        self._polled_at = -1.0
        # (name, its range: none where nothing records it, found by auto_phases)
        self._phase: tuple[str, AbstractContextManager[None] | None, bool] | None = None
        self._auto: AutoPhases | None = None
        self._auto_targets = (model, optimizer)
        self._annotate = False
        self._steps_marked = 0
        self._phases_marked = 0
        self._started = False
        self._closed = False
        self._sigterm_before: Any = None
        self._grads: GradientsReady | None = None
        self._comm: CommWaitTimer | None = None
        self._live: LiveState | None = None  # what the debug server reads (--debug-server)

    # -- start and end -----------------------------------------------------------------------

    def __enter__(self) -> Run:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.close(exc)

    def start(self) -> Run:
        """Agree on the run folder with every rank, open the outputs and start the profiler."""
        if self._started:
            raise RuntimeError("harness.Run: start() was already called")
        self._started = True
        cfg = self.cfg
        self.env = env = launch_env(self.device)
        check_output_everywhere(cfg.output)
        self.ident = ident = agree_identity(cfg.output, cfg.job.name, env)
        self.host = host = host_name()
        backend = dist.get_backend() if env.distributed else None
        self.flight_on = (
            self._flight
            if self._flight is not None
            else env.distributed and any(os.environ.get(v) not in (None, "", "0") for v in flight.BUFFER_VARS)
        )
        if self.flight_on and backend is not None:
            flight.point_nccl_dumps(ident.dir, backend)
        self.backend = backend
        # Profiler-side outputs never stop training: their write failures are said once and recorded.
        self.faults = faults = FaultLog(rank=env.rank)
        self.scalars = ScalarWriter(scalars_dir(ident.dir, env.rank), faults=faults) if cfg.output.scalars else None
        self.log = StepLog(steps_path(ident.dir, env.rank), faults)
        self.status = RankStatus(ident.dir, rank=env.rank, host=host, attempt=ident.attempt, faults=faults)
        self.clock = StepClock(cuda=self.device.type == "cuda")
        self.sampler = SystemSampler(self.device)
        self._nvtx = self.device.type == "cuda"
        metadata = {
            "run_id": ident.run_id,
            "run_name": ident.name,
            "attempt": ident.attempt,
            "rank": env.rank,
            "local_rank": env.local_rank,
            "world_size": env.world_size,
            "host": host,
            "mode": (self.record or {}).get("workload", {}).get("mode", cfg.job.name),
            "parallel": cfg.job.parallel,
        }
        self.recorder = TraceRecorder(
            cfg.profiler,
            run_dir=ident.dir,
            rank=env.rank,
            host=host,
            cuda=self.device.type == "cuda",
            metadata=metadata,
            faults=faults,
            collective_groups=bool(self.flight_on and backend and "gloo" in backend),
        )
        target = metrics_target(
            cfg.output.metrics_port,
            cfg.output.metrics_addr,
            cfg.output.metrics_file,
            env.rank,
            env.local_rank,
            env.world_size,
        )
        labels = {"run": ident.name, "rank": str(env.rank), "local_rank": str(env.local_rank), "host": host}
        self.metrics = Metrics.start(labels, target, faults) if target is not None else None
        if self.metrics:
            self.recorder.on_summary = self.metrics.window
            self.metrics.tracing_source = self._tracing_counts
        self.watch: Watch | None = None
        self._catch_sigterm()
        try:
            # Connecting the watch's group talks to every peer and can fail like a collective.
            self.watch = Watch(
                cfg.watch,
                steps=cfg.job.steps,
                warmup_steps=cfg.job.warmup_steps,
                parallel=cfg.job.parallel,
                collective_timeout_s=cfg.job.collective_timeout,
                rank=env.rank,
                world_size=env.world_size,
                host=host,
                cpu=self.device.type == "cpu",
                run_dir=ident.dir,
                recorder=self.recorder,
                scalars=self.scalars,
                faults=faults,
                metrics=self.metrics,
                flight_on=self.flight_on,
                backend=backend,
            )
            # the watch reads a CPU rank's own work in the phases that hold collectives from its CPU time
            self.clock.thread_time = self.watch.on and self.device.type == "cpu"
            self.clock.spans = self.watch.read_arrivals
            if env.distributed:  # each phase's waiting for communication: phases_p2p_ms, phases_collective_wait_ms
                self._comm = CommWaitTimer(self.device.type == "cuda", self.clock.add_comm_wait, self.clock.add_p2p_op)
                self._comm.install()
            self.recorder.__enter__()
        except BaseException as exc:
            self.close(exc)
            raise
        if cfg.debug.debug_server:
            self._start_debug_server()
        model, optimizer = self._auto_targets
        if model is not None or optimizer is not None:
            self.auto_phases(model, optimizer)
        return self

    def _start_debug_server(self) -> None:
        """torch's debug server with the harness's page and capture action (harness/debug/); where
        it cannot start, said once, and the job goes on without it."""
        cfg, env = self.cfg.debug, self.env
        if not env.distributed:
            self.faults.note("debug server: needs a torchrun job (a process group); the job goes on without it")
            return
        from harness.debug import frontend, worker

        try:
            store = frontend.job_store()
            self._live = worker.LiveState(self, frontend.job_secret(store, env.rank), store)
            worker.open_state(self._live)
            server = frontend.start(
                port=cfg.debug_port,
                host=cfg.debug_addr,
                run_dir=self.ident.dir,
                rank=env.rank,
                max_captures=cfg.max_debug_captures,
                warmup=self.cfg.profiler.warmup,
            )
        except Exception as exc:  # noqa: BLE001 - a debug aid never stops training
            worker.open_state(None)
            self._live = None
            self.faults.note(f"debug server: not started ({exc}); the job goes on without it")
            return
        if env.rank == 0:
            token = f"; its token is in {server.token_file}" if server.token_file else ""
            print(
                f"{self.prog}: debug server: http://{server.host}:{server.port}{frontend.PAGE} (docs/steer.md){token}",
                flush=True,
            )

    def _stop_debug_server(self) -> None:
        if self._live is None:
            return
        from harness.debug import frontend, worker

        worker.open_state(None)
        frontend.stop(self.env.rank)

    @property
    def in_step(self) -> bool:
        """Whether a step is open (between begin_step and end_step)."""
        return self._in_step

    def auto_phases(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    ) -> None:
        """Find the step's phases from hooks (auto_phases.py): on `model`, the module the loop
        calls (wrapped in DDP, FSDP or torch.compile as it is called), on backward, and on
        `optimizer` (one or a list). Call it once after start() (`Run(model=..., optimizer=...)`
        does), again for a model or optimizer made later. Phases marked by hand win inside their
        ranges. On a GPU under DDP it also lets the watch see the model's last gradients
        (watch_gradients)."""
        if not self._started:
            raise RuntimeError("harness.Run: auto_phases() after start()")
        if self._auto is None:
            self._auto = AutoPhases(self)
        if model is not None:
            self._auto.attach_model(model)
            self.watch_gradients(model)
        optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer] if optimizer else []
        for opt in optimizers:
            self._auto.attach_optimizer(opt)

    # the automatic phases' side (auto_phases.PhaseSink)

    def auto_ready(self) -> bool:
        return self._in_step and (self._phase is None or self._phase[2])

    def auto_begin(self, name: str) -> None:
        if self._phase is not None and self._phase[2] and self._phase[0] == name:
            return  # already open (the optimizer's preparation, then its step): one range
        self._open_phase(name, auto=True)

    def auto_end(self, name: str) -> None:
        if self._phase is not None and self._phase[2] and self._phase[0] == name:
            self.end_phase()

    def watch_gradients(self, model: torch.nn.Module) -> bool:
        """Let the live watch see this rank slow inside backward on a GPU under DDP: an event when
        the model's last gradient of each backward is ready (grads_ready.py) splits the phase
        into the rank's own work and its wait for the all-reduce (timing.py's
        phases_own_device_ms), which ends together on every rank. Call it once after start()
        with the model (wrapped or not); True where hooked. Nothing on CPU (the watch reads CPU
        time and arrivals there), with the watch off, under FSDP (its all-gathers hold the
        compute stream inside backward, so the last gradient includes waiting too), or for a
        model with a parameter off the device the step clock times (its events could not be
        compared with the clock's)."""
        if not self._started:
            raise RuntimeError("harness.Run: watch_gradients() after start()")
        watch = self.watch
        if self._grads is not None or self.device.type != "cuda" or not (watch and watch.on):
            return False
        if self.cfg.job.parallel != "ddp":
            return False
        clock_device = torch.device("cuda", torch.cuda.current_device())  # where StepClock records
        if any(p.device != clock_device for p in model.parameters() if p.requires_grad):
            return False
        grads = GradientsReady(self.clock.mark_own_end)
        if not grads.attach(model):
            return False
        self._grads = grads
        return True

    def note(self, **fields: Any) -> None:
        """Fields added to this rank's row in run.json (e.g. the final loss)."""
        self.extra_row.update(fields)

    def close(self, exc: BaseException | None = None) -> None:
        """End the run: the last step records, the profiler's last window, the watch, the files;
        then, without `exc`, every rank's row to run.json and the table (rank 0). With `exc` (the
        loop failed, hung or was stopped), the rank's status says how and where, and its Flight
        Recorder is dumped where it is on."""
        if self._closed or not self._started:
            return
        self._closed = True
        try:
            if exc is None:
                self._finish()
            else:
                self._fail(exc)
        finally:
            self._restore_sigterm()

    def _finish(self) -> None:
        if self._in_step:
            self.end_step()
        self._unhook()
        self._write(self.clock.drain())
        if self.cfg.profiler.cuda_profiler_api and self.device.type == "cuda" and self._steps_marked:
            torch.cuda.profiler.stop()
        self.recorder.__exit__(None, None, None)
        self._stop_debug_server()
        watch = self.watch
        assert watch is not None
        watch.close()
        self._close_outputs()
        self.status.end("finished", self._last_step(), tracing=self._tracing())
        notes = self._notes()
        recorder = self.recorder
        row = {
            "rank": self.env.rank,
            "local_rank": self.env.local_rank,
            "host": self.host,
            **self.log.totals.statistics(),
            "traces": [p.name for p in recorder.written if p.exists()],
            "trace_summaries": [p.name for p in recorder.summaries],
            "trace_summary_s": round(recorder.summary_s, 3),
            "steps_file": str(self.log.path.relative_to(self.ident.dir)),
            "skipped_windows": recorder.skipped,
            "unwritten_step_records": self.log.unwritten,
            "write_failures": self._failures(),
            **self.sampler.gpu_health.summary(),
            **self.extra_row,
        }
        self.rows = rows = gather(row)
        if self.env.rank == 0:
            config = self.record if self.record is not None else self.cfg.to_dict()
            try:
                self.run_json = write_run_json(
                    self.ident,
                    config,
                    self.env,
                    self.device,
                    rows,
                    watch.summary(),
                    parallel=self.cfg.job.parallel,
                    debug_server=self._live.summary() if self._live else None,
                )
            except OSError as exc:
                self.faults.report(
                    RUN_FILE, exc, "the per-rank table below is the run's only summary", run_file(self.ident.dir)
                )
            if not self.quiet:
                report(self.prog, self.ident, rows, self.run_json, watch.summary(), notes)

    def summary(self, *, numbers_only: bool = False) -> dict[str, Any]:
        """The run's figures in the keys `harness.summary` gives a report (tracker_summary.py),
        from what the job measured itself, once it is closed (the callbacks log it to W&B and
        MLflow at the end of training; docs/own-job.md):
        1. verdict: "straggler" where the live watch flagged a rank, "balanced" where it judged an
           interval and flagged none, else "inconclusive"; the straggler is its latest flag, with
           the lateness it was flagged at; noise_bound_ms its latest interval's bound;
        2. step_ms_p50 and _p90: the median over the ranks of each rank's steady p50 and p90;
           data_share: the median over the ranks of their data phase over their step;
        3. peaks: the largest over the ranks; exposed_comm_share: None (the traces measure it:
           `harness.summary` of the collector's report has it).
        Raises RuntimeError before the run is closed."""
        rows, watch = self.rows, getattr(self, "watch", None)  # (made by start)
        if rows is None or watch is None:
            raise RuntimeError("Run.summary() reads the finished run: call it after the run is closed")
        flags = watch.flags
        last = flags[-1] if flags else None
        if flags:
            verdict = "straggler"
        else:
            verdict = "balanced" if watch.intervals else "inconclusive"

        def median_of(key: str) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return statistics.median(values) if values else None

        def peak(key: str) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return max(values) if values else None

        shares = [
            r["mean_data_ms"] / r["mean_step_ms"]
            for r in rows
            if r.get("mean_data_ms") is not None and r.get("mean_step_ms")
        ]
        record = SummaryRecord(
            verdict=verdict,
            stragglers=len({f["rank"] for f in flags}),
            straggler_rank=last["rank"] if last else None,
            straggler_host=last.get("host") if last else None,
            straggler_phase=last.get("phase") if last else None,
            straggler_late_ms=last.get("late_ms") if last else None,
            step_ms_p50=median_of("p50_step_ms"),
            step_ms_p90=median_of("p90_step_ms"),
            exposed_comm_share=None,
            data_share=statistics.median(shares) if shares else None,
            peak_gpu_allocated_bytes=peak("peak_gpu_allocated_bytes"),
            peak_rss_bytes=peak("peak_rss_bytes"),
            noise_bound_ms=watch.bound_ms,
            ranks=len(rows),
        )
        return flat(record, numbers_only)

    def _fail(self, exc: BaseException) -> None:
        self._unhook()
        with sigterm_deferred():  # torchrun's SIGTERM after a peer failed must not cut this short
            try:
                # the finished steps' records that wait for RECORDS_EVERY_S: no sync (the device
                # may be what failed), so a step whose device work never completed stays out
                self._write(self.clock.poll())
            except Exception:  # noqa: BLE001 - a broken device's events: what is written stays
                pass
            try:
                self.recorder.__exit__(type(exc), exc, None)
            except Exception:  # noqa: BLE001 - the rank is failing already: its trace is best effort
                pass
            self._stop_debug_server()
            if self.watch is not None:
                self.watch.close()
            self._close_outputs()
            state = "hung" if flight.is_timeout(exc) else "failed"
            where = {"step": self.progress.step, "phase": self.progress.phase}
            dump = None
            if self.flight_on and self.backend is not None:
                dump = flight.write_dump(
                    self.ident.dir,
                    rank=self.env.rank,
                    world_size=self.env.world_size,
                    backend=self.backend,
                    reason=dump_reason(state, exc),
                    progress=self.progress,
                    host=self.host,
                    faults=self.faults,
                )
            self.status.end(
                state,
                self._last_step(),
                exc,
                tracing=self._tracing(),
                where=where,
                flight=str(dump.relative_to(self.ident.dir)) if dump else None,
            )

    # -- steps and phases --------------------------------------------------------------------

    @contextmanager
    def step(self, **fields: Any) -> Iterator[Run]:
        """One training step: `with run.step(): ...` (`fields` go into its step record)."""
        self.begin_step()
        yield self
        self.end_step(**fields)

    def begin_step(self) -> int:
        """A step starts (for loops whose start and end are separate hooks); its number."""
        if self._in_step:
            raise RuntimeError("harness.Run: begin_step() while a step is open; end_step() first")
        self._in_step = True
        self.step_number += 1
        self._steps_marked += 1
        step = self.step_number
        if self.cfg.profiler.cuda_profiler_api and self.device.type == "cuda" and step == self.cfg.job.warmup_steps:
            torch.cuda.profiler.start()  # Nsight told to wait for it skips start-up and warm-up
        self._profiler_state = self.recorder.state
        self._annotate = self._profiler_state == "record"
        self.progress.step, self.progress.phase = step, None
        self.clock.start(step, runq=self._profiler_state in ("warmup", "record"))  # runq: read beside traced steps only
        if self._grads is not None:
            self._grads.new_step()
        if self._auto is not None:
            self._auto.step_starts()
        return step

    def end_step(self, **fields: Any) -> None:
        """The step ends: its record (timed once its device work is done: no sync), the
        profiler's step, the watch's exchange when due. The finished records are written (step
        log, scalars, metrics, the watch's rows, the debug page) every RECORDS_EVERY_S, before
        the watch's exchange, and at the end."""
        if not self._in_step:
            raise RuntimeError("harness.Run: end_step() without begin_step()")
        self.end_phase()
        self._in_step = False
        step = self.step_number
        self.clock.finish(self.sampler.sample, profiler=self._profiler_state, **fields)
        self.recorder.step()
        watch = self.watch
        due = bool(watch and watch.due(step))
        now = time.monotonic()
        if not due and now - self._polled_at < RECORDS_EVERY_S:
            return  # its record waits in the clock with the steps after it
        self._polled_at = now
        records = self.clock.poll()
        self._write(records)
        for rec in records:
            if watch:
                watch.add(rec)
            if self._live:
                self._live.add(rec)
        if watch and due:
            self.progress.phase = "watch exchange"  # a hung peer leaves this rank waiting here
            watch.after_step(step)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase of the step (`data`, `forward`, ... or any name): a record_function range while
        the profiler records (NVTX on CUDA), and the step record's time for it: from the end of
        the phase before it (or the step's start) to its own end."""
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase()

    def begin_phase(self, name: str) -> None:
        """A phase starts (for loops whose phases begin and end in separate hooks); a phase still
        open ends first."""
        self._open_phase(name, auto=False)

    def _open_phase(self, name: str, auto: bool) -> None:
        if self._phase is not None:
            self.end_phase()
        self.progress.phase = name
        self._phases_marked += 1
        rng = None
        if self._annotate or self._nvtx:  # a range only where the profiler records or Nsight may trace
            rng = phase_range(name, annotate=self._annotate, nvtx=self._nvtx)
            rng.__enter__()
        self._phase = (name, rng, auto)

    def end_phase(self) -> None:
        """The open phase ends (nothing without one)."""
        if self._phase is None:
            return
        name, rng, _ = self._phase
        self._phase = None
        if rng is not None:
            rng.__exit__(None, None, None)
        if self._in_step:
            self.clock.mark(name)

    def discard_step(self) -> None:
        """Drop the open step without a record (a framework's loop that ended between a step's
        hooks: its last step never ran); the profiler's step is not advanced."""
        if self._phase is not None:
            _, rng, _ = self._phase
            self._phase = None
            if rng is not None:
                rng.__exit__(None, None, None)
        if self._in_step:
            self._in_step = False
            self.clock.discard()
            self._steps_marked -= 1

    # -- inside ------------------------------------------------------------------------------

    def _unhook(self) -> None:
        if self._auto is not None:
            self._auto.remove()
            self._auto = None
        if self._comm is not None:
            self._comm.uninstall()
            self._comm = None
        if self._grads is not None:
            self._grads.detach()
            self._grads = None

    def _write(self, records: list[dict[str, Any]]) -> None:
        """The finished steps' records, in order: completed with the rank's fields, then written
        (the step log in one append) and passed to the scalars and metrics."""
        job = self.cfg.job
        for rec in records:
            rec.update(
                rank=self.env.rank, host=self.host, samples=job.samples_per_step, warmup=rec["step"] < job.warmup_steps
            )
        self.log.write(records)
        for rec in records:
            if self.scalars:
                self.scalars.add(rec["step"], step_scalars(rec))
            if self.metrics:
                self.metrics.step(rec)

    def _notes(self) -> list[str]:
        """What the loop did not mark, said once (what the run has without it)."""
        if not self._steps_marked:
            return [
                "no step was marked (with run.step(): or begin_step()/end_step()): the profiler traced by its "
                "schedule's steps never advanced, and no step log, watch or table was made"
            ]
        if not self._phases_marked:
            return ["no phase was marked (with run.phase(name):): steps are timed whole"]
        return []

    def _close_outputs(self) -> None:
        """Write what waits in memory; say what could not be written at all."""
        self.sampler.close()
        if self.metrics:
            self.metrics.close()
        if not self.log.close():
            self.faults.note(
                f"{self.log.unwritten} step record(s) could not be written to {self.log.path}; the "
                "run's summary (run.json, the table) still counts them"
            )
        if self.scalars and not self.scalars.close():
            self.faults.note(f"TensorBoard scalars could not all be written to {self.scalars.path}")

    def _failures(self) -> list[dict[str, Any]]:
        """Each distinct write failure once: {what, reason, count}."""
        counts: dict[tuple[str, str], int] = {}
        for e in self.faults.events:
            counts[(e["what"], e["reason"])] = counts.get((e["what"], e["reason"]), 0) + 1
        return [{"what": w, "reason": r, "count": n} for (w, r), n in counts.items()]

    def _tracing_counts(self) -> tuple[int, int, int]:
        """(windows written, windows skipped, write failures), for the metrics when they are read."""
        recorder = self.recorder
        return len(recorder.written), len(recorder.skipped), len(self.faults.events)

    def _tracing(self) -> dict[str, Any]:
        return {**self.recorder.tracing, "write_failures": self._failures()}

    def _last_step(self) -> int | None:
        return self.log.totals.last_step

    def _catch_sigterm(self) -> None:
        """SIGTERM (torchrun stopping the ranks after one failed) raises `Terminated` in the loop,
        so the rank records why it stops; only where nobody else handles it, in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):

            def handler(signum: int, frame: Any) -> None:
                raise Terminated(signum)

            self._sigterm_before = signal.signal(signal.SIGTERM, handler)

    def _restore_sigterm(self) -> None:
        if self._sigterm_before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm_before)
            self._sigterm_before = None


def enable_flight_recorder(entries: int = 2000, backend: str | None = None) -> None:
    """Turn torch's Flight Recorder on, before `init_process_group` (it reads its settings when
    the first process group is made): a `harness.Run` then dumps it to `<run>/flight/` when the
    rank fails, hangs in a collective or is stopped, and the collector reports who never
    entered which collective. `backend`: "nccl" also has NCCL's watchdog dump on a timeout
    (default: nccl where CUDA is present). A variable the user set is left as it is."""
    flight.enable(entries, backend or ("nccl" if torch.cuda.is_available() else "gloo"))


def dump_reason(state: str, exc: BaseException) -> str:
    """Why a rank dumps its Flight Recorder, in a few words: `hung` (a collective timed out),
    `terminated` (a signal), or `failed: <exception type>`."""
    if isinstance(exc, (Terminated, KeyboardInterrupt)):
        return "terminated"
    return state if state == "hung" else f"failed: {type(exc).__name__}"


def report(
    prog: str,
    ident: RunIdentity,
    rows: list[dict],
    run_json: Path | None,
    watch: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> None:
    """The run's end on rank 0: the per-rank table and where everything is."""
    n_traces = sum(len(r["traces"]) for r in rows)
    print(f"\n{prog}: run {ident.name} finished ({len(rows)} rank(s), steady state, warm-up excluded)")
    print(format_rank_table(rows))
    for note in notes or []:
        print(f"note:    {note}")
    print(f"traces:  {ident.dir}/ ({n_traces} file(s), one per rank per profiler window)")
    n_summaries = sum(len(r.get("trace_summaries", [])) for r in rows)
    if n_summaries:
        worst_s = max(r.get("trace_summary_s", 0.0) for r in rows)
        print(
            f"summaries: {n_summaries} in-job trace summaries (<trace>.summary.json; condensing took at most "
            f"{worst_s:.2f} s on a rank); the collector reads them instead of the traces"
        )
    for r in rows:
        for w in r.get("skipped_windows", []):
            windows = f"window {w['first']}" if w["first"] == w["last"] else f"windows {w['first']}-{w['last']}"
            print(f"skipped: rank {r['rank']} trace {windows}: {w['reason']}")
        if r.get("unwritten_step_records"):
            print(f"skipped: rank {r['rank']}: {r['unwritten_step_records']} step record(s) not on disk")
    print(f"steps:   {ident.dir}/steps/rank<R>.jsonl")
    watched = watch_record(watch)
    if watched:
        print(f"watch:   {watch_line(watched)} ({watch_path(ident.dir)})")
    print(f"run:     {run_json or 'not written (see the warnings above)'}")
    if len(rows) > 1:
        print(f"who waits for whom: python -m harness.collect {ident.dir}")
    sys.stdout.flush()
