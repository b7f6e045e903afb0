"""One row of a rewrite report: a candidate pattern, what happened to it, and why."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

FUSED = "fused"
FOLDED = "folded"
REJECTED = "rejected"
KEPT = "kept fp32"


@dataclass
class Candidate:
    pass_name: str  # "fold_bn", "fuse"
    kind: str  # "bn", "residual-identity", "residual-projection", "conv-add", "conv", ...
    nodes: list[str]  # names of the original nodes in the pattern
    status: str  # FUSED / FOLDED / REJECTED / KEPT
    reason: str = ""
    op: str = ""  # plugin op the pattern became, when fused
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def row(self) -> list[str]:
        return [self.pass_name, self.kind, " -> ".join(self.nodes), self.status, self.op or self.reason]
