"""What a trace shows the job already does (torch.compile, CUDA graphs, fused or foreach
optimizers, bf16), so that advice never prescribes it.

Each practice is read from the names of the trace's events, the only place it shows:
- torch.compile: Inductor's `## Call CompiledFxGraph <hash> ##` ranges
  (torch/_inductor/output_code.py), dynamo's `Torch-Compiled Region: <frame>/<compile>` ranges
  (torch/_dynamo/eval_frame.py), the compiled autograd function `CompiledFunction`, and Triton
  kernels Inductor generates (`triton_poi_...`, `triton_per_...`, `triton_red_...`, `triton_tem_...`);
- CUDA graphs: the replay's `cudaGraphLaunch` runtime call (a captured step launches its kernels
  through one);
- fused optimizer: `aten::_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_`
  (`fused=True`); foreach optimizer: `aten::_foreach_*` ops (the default where supported);
- bf16: kernels whose names carry the type (`..._bf16_...`, `bfloat16`, `__nv_bfloat16`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PRACTICES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "torch.compile",
        re.compile(
            r"^## Call CompiledFxGraph |^Torch-Compiled Region|^CompiledFunction(?:Backward)?$|"
            r"^triton_(?:poi|per|red|tem)_"
        ),
    ),
    ("CUDA graphs", re.compile(r"^cudaGraphLaunch")),
    ("fused optimizer", re.compile(r"^aten::_fused_(?:adam|adamw|sgd|adagrad)_?")),
    ("foreach optimizer", re.compile(r"^aten::_foreach_")),
    ("bf16", re.compile(r"bf16|bfloat16", re.IGNORECASE)),
)


def practices_in(names: Iterable[str]) -> list[str]:
    """The practices (PRACTICES, in its order) that any of `names` shows."""
    found: set[str] = set()
    left = list(PRACTICES)
    for name in names:
        for practice, pattern in left:
            if pattern.search(name):
                found.add(practice)
        left = [p for p in left if p[0] not in found]
        if not left:
            break
    return [p for p, _ in PRACTICES if p in found]
