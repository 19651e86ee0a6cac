"""The spec case (strategy, mesh, layer, target) shared by the expert-parallelism tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec_builder import spec_yaml

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.validate import validate


@dataclass(frozen=True)
class Case:
    strategy: str
    axes: dict[str, int]
    experts: int = 8
    top_k: int = 2
    score: str = "softmax"
    renormalize: bool = True
    chunks: int = 1
    embed: int = 32
    ffn: int = 16
    batch: int = 8
    seq_len: int = 4
    params: str = "float32"
    compute: str = "float32"
    hardware: str = "cpu"
    topology: str | None = None
    kernel: str = "xla"

    def text(self) -> str:
        target: dict[str, Any] = {"hardware": self.hardware, "kernel": self.kernel}
        if self.topology:
            target["topology"] = self.topology
        return spec_yaml(
            {
                "description": "expert parallel test",
                "experts": self.experts,
                "embed": self.embed,
                "ffn": self.ffn,
                "top_k": self.top_k,
                "score": self.score,
                "renormalize": self.renormalize,
                "batch": self.batch,
                "seq_len": self.seq_len,
                "params_dtype": self.params,
                "compute_dtype": self.compute,
                "axes": self.axes,
                "strategy": self.strategy,
                "overlap_chunks": self.chunks,
            }
            | target
        )

    def load(self, name: str = "ep_case") -> LoadedSpec:
        return validate(load_spec_bytes(self.text().encode(), f"specs/{name}.yaml", name))
