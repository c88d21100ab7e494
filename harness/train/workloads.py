"""The lab workloads: small models and synthetic data, each forcing one classic bottleneck.

- baseline: a healthy MLP (or a small CNN, where channels_last applies) on in-memory data.
- data: the same kind of MLP behind an expensive per-sample `Dataset.__getitem__`.
- torch: many tiny eager elementwise ops per forward (launch/dispatch overhead).
- kernel: repeated memory-bound pointwise blocks on wide activations.
- comm: large embedding tables with dense gradients and almost no compute, so gradient
  communication dominates.

Every model exposes `blocks` (the units FSDP shards one by one). No downloads: every sample is
a pure function of (seed, rank, index), so runs are reproducible and ranks see different data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from harness.train.config import DataConfig, WorkloadConfig

NUM_CLASSES = 10
MLP_IN_FEATURES = 256
IMAGE_SHAPE = (3, 32, 32)
BAG_SIZE = 8
IN_MEMORY_BATCHES = 16  # distinct batches held in memory per rank before the data repeats


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, depth: int = 3) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * depth
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths[:-1], widths[1:]))
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class SmallCNN(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        channels = [IMAGE_SHAPE[0], 32, 64, 64]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(a, b, 3, stride=1 if i == 0 else 2, padding=1), nn.ReLU())
            for i, (a, b) in enumerate(zip(channels[:-1], channels[1:]))
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(channels[-1], hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class MicroOps(nn.Module):
    """`repeats` x (relu(x + 0.01), x * 0.99, x + sigmoid(x) * 0.01): ~6 tiny kernels a repeat."""

    def __init__(self, repeats: int) -> None:
        super().__init__()
        self.repeats = repeats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            x = torch.relu(x + 0.01)
            x = x * 0.99
            x = x + torch.sigmoid(x) * 0.01
        return x


class LaunchBoundNet(nn.Module):
    def __init__(self, hidden: int, micro_ops: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(MLP_IN_FEATURES, hidden)])
        self.micro = MicroOps(micro_ops)
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.micro(self.blocks[0](x)))


class PointwiseBlock(nn.Module):
    """Sigmoid gate, gelu, layer_norm, residual add: four memory-bound passes, no matmul."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.gate_bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(x + self.gate_bias)
        y = F.gelu(x * gate)
        return x + self.norm(y)


class KernelBoundNet(nn.Module):
    def __init__(self, hidden: int, depth: int) -> None:
        super().__init__()
        self.proj = nn.Linear(MLP_IN_FEATURES, hidden)
        self.blocks = nn.ModuleList(PointwiseBlock(hidden) for _ in range(depth))
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CommBoundNet(nn.Module):
    """Embedding tables with dense gradients: every step all-reduces every row."""

    def __init__(self, num_tables: int, rows: int, dim: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="mean") for _ in range(num_tables))
        self.head = nn.Linear(num_tables * dim, NUM_CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = [table(ids[:, i]) for i, table in enumerate(self.blocks)]
        return self.head(torch.cat(pooled, dim=1))


class ExpensiveImages(Dataset):
    """Synthetic images whose `__getitem__` runs `cost` blur-and-normalise passes on the CPU.

    Each pass is a handful of small tensor ops per sample, the shape of a Python-side
    augmentation pipeline: cheap per op, expensive in total, and it runs wherever the DataLoader
    runs it (the training process with --num-workers 0).
    """

    def __init__(self, length: int, seed: int, cost: int) -> None:
        self.length = length
        self.seed = seed
        self.cost = cost

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.rand(IMAGE_SHAPE, generator=gen)
        for _ in range(self.cost):
            x = (x + torch.roll(x, 1, dims=-1) + torch.roll(x, 1, dims=-2)) / 3.0
            x = (x - x.mean()) / (x.std() + 1e-5)
        label = int(x.sum().item() * 1000) % NUM_CLASSES
        return x, torch.tensor(label)


@dataclass(kw_only=True)
class Workload:
    model: nn.Module
    dataset: Dataset
    input_is_image: bool

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), target)


class InMemoryTensors(TensorDataset):
    """Tensors held in memory, fetched a batch at a time: DataLoader hands `__getitems__` the
    batch's indices, which gathers each tensor with one index op, and `as_batch` passes the
    result through. Fetched a sample at a time and stacked by the default collate, a 256-sample
    batch costs the main thread ~8-11% of a baseline CPU step (bench/RESULTS.md, "The lab's
    workloads on two CPU cores"): an input-pipeline cost the healthy workloads are not meant to
    have."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        at = torch.as_tensor(indices)
        return tuple(t[at] for t in self.tensors)

    @staticmethod
    def as_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return batch


def _teacher_labels(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Labels from a fixed random linear teacher, so the loss can actually go down."""
    w = torch.randn(x[0].numel(), NUM_CLASSES, generator=gen)
    return (x.flatten(1) @ w).argmax(dim=1)


def build_workload(cfg: WorkloadConfig, data: DataConfig, rank: int) -> Workload:
    """Model (same weights on every rank) and this rank's synthetic dataset."""
    torch.manual_seed(cfg.seed)
    hidden = cfg.hidden
    assert hidden is not None  # filled per mode by WorkloadConfig
    if cfg.mode == "baseline" and cfg.arch == "cnn":
        model: nn.Module = SmallCNN(hidden)
    elif cfg.mode in ("baseline",):
        model = MLP(MLP_IN_FEATURES, hidden)
    elif cfg.mode == "data":
        model = MLP(IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2], hidden, depth=2)
    elif cfg.mode == "torch":
        model = LaunchBoundNet(hidden, cfg.micro_ops)
    elif cfg.mode == "kernel":
        model = KernelBoundNet(hidden, cfg.pointwise_depth)
    elif cfg.mode == "comm":
        model = CommBoundNet(cfg.num_tables, cfg.table_rows, hidden)
    else:  # pragma: no cover - WorkloadConfig validated the mode
        raise ValueError(cfg.mode)

    data_seed = cfg.seed * 7919 + rank + 1
    length = cfg.batch_size * IN_MEMORY_BATCHES
    gen = torch.Generator().manual_seed(data_seed)
    if cfg.mode == "data":
        return Workload(model=model, dataset=ExpensiveImages(length, data_seed, data.sample_cost), input_is_image=True)
    if cfg.mode == "comm":
        ids = torch.randint(0, cfg.table_rows, (length, cfg.num_tables, BAG_SIZE), generator=gen)
        labels = ids.sum(dim=(1, 2)) % NUM_CLASSES
        return Workload(model=model, dataset=InMemoryTensors(ids, labels), input_is_image=False)
    image = cfg.mode == "baseline" and cfg.arch == "cnn"
    shape = IMAGE_SHAPE if image else (MLP_IN_FEATURES,)
    x = torch.randn(length, *shape, generator=gen)
    return Workload(model=model, dataset=InMemoryTensors(x, _teacher_labels(x, gen)), input_is_image=image)
