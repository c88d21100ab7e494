"""Process group, device choice and the parallel wrapper (none | DDP | FSDP2), plus compile."""

from __future__ import annotations

import datetime
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from harness.run.run_info import elastic_attempt
from harness.run.settings import LaunchEnv
from harness.train.config import ParallelConfig, SpeedConfig

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PG_TIMEOUT = datetime.timedelta(minutes=10)


def device_index(env: LaunchEnv) -> int:
    """The GPU of this LOCAL_RANK: its own (`resolve_environment` checked there is one per rank
    under NCCL), or round-robin over the visible GPUs when ranks share them over gloo."""
    return env.local_rank % env.device_count if env.device_count else env.local_rank


def pick_device(env: LaunchEnv) -> torch.device:
    """This rank's GPU (`device_index`) when CUDA is present, else the CPU."""
    if env.cuda:
        device = torch.device("cuda", device_index(env))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_process_group(par: ParallelConfig, env: LaunchEnv, device: torch.device) -> None:
    if par.parallel == "none" and not env.distributed:
        return
    kwargs: dict[str, Any] = {"backend": par.backend, "timeout": datetime.timedelta(seconds=par.collective_timeout)}
    if device.type == "cuda":
        kwargs["device_id"] = device  # binds NCCL to this GPU eagerly
    attempt, _ = elastic_attempt()
    if attempt > 0:
        # After a torchrun restart the workers join the agent's store again, which still holds
        # the failed attempt's keys (gloo's peer addresses among them): a new rank can read a
        # dead peer's address and hang in connect. Each attempt's keys get their own prefix.
        store, rank, world_size = next(dist.rendezvous("env://", timeout=PG_TIMEOUT))
        kwargs.update(store=dist.PrefixStore(f"harness/attempt-{attempt}", store), rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)


def wrap_model(model: nn.Module, par: ParallelConfig, speed: SpeedConfig, device: torch.device) -> nn.Module:
    """Move to the device and wrap for the chosen parallelism; compile last, over the wrapper."""
    model = model.to(device)
    if speed.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # taken; not in the stub
    if par.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=par.bucket_cap_mb,
            gradient_as_bucket_view=par.gradient_as_bucket_view,
            static_graph=par.static_graph,
        )
    elif par.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = AMP_DTYPES.get(speed.amp)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        for block in cast(nn.ModuleList, model.blocks):
            if any(True for _ in block.parameters()):
                fully_shard(block, reshard_after_forward=par.reshard_after_forward, mp_policy=mp)
        fully_shard(model, reshard_after_forward=par.reshard_after_forward, mp_policy=mp)
    if speed.compile:
        mode = None if speed.compile_mode == "default" else speed.compile_mode
        model = cast(nn.Module, torch.compile(model, mode=mode))
    return model


def build_optimizer(model: nn.Module, name: str, speed: SpeedConfig) -> torch.optim.Optimizer:
    """AdamW (lr 1e-3) or plain SGD (lr 0.01, no momentum: no per-parameter state)."""
    kwargs: dict[str, Any] = {"fused": True} if speed.fused_optimizer else {}
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, **kwargs)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)


def destroy_process_group(clean_exit: bool = True) -> None:
    """Tear the group down; after a clean run, wait for every rank first.

    Without the barrier a fast rank can destroy its gloo context while a peer's last collective
    still talks to it, and the peer aborts at exit ("terminate called without an active
    exception") after a successful run.
    """
    if dist.is_available() and dist.is_initialized():
        if clean_exit:
            dist.barrier()
        dist.destroy_process_group()
