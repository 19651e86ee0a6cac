"""The spec case (strategy, mesh, layer, target) shared by the expert-parallelism tests."""

from __future__ import annotations

from dataclasses import dataclass

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
        mesh = "\n".join(f"    {name}: {size}" for name, size in self.axes.items())
        target = f"  hardware: {self.hardware}\n"
        if self.topology:
            target += f"  topology: {self.topology}\n"
        target += f"  kernel: {self.kernel}\n"
        return f"""\
version: 1
description: expert parallel test
layer:
  num_experts: {self.experts}
  embed_dim: {self.embed}
  ffn_dim: {self.ffn}
router:
  top_k: {self.top_k}
  score: {self.score}
  renormalize: {"true" if self.renormalize else "false"}
shapes:
  batch: {self.batch}
  seq_len: {self.seq_len}
dtypes:
  params: {self.params}
  compute: {self.compute}
mesh:
  axes:
{mesh}
parallelism:
  experts: {self.strategy}
  overlap_chunks: {self.chunks}
target:
{target}"""

    def load(self, name: str = "ep_case") -> LoadedSpec:
        return validate(load_spec_bytes(self.text().encode(), f"specs/{name}.yaml", name))
