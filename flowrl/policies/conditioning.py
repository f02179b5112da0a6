"""What a policy samples from and what it samples: encoded conditions (`Conditioning`, batch-first, one row per
sample) and one sample's size (`SampleSpec`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Conditioning:
    """Encoded conditions, batch-first so they can be indexed like the samples they condition.

    `tensors` / `negative` hold the model inputs of the conditional / unconditional (CFG) branch, including encoded
    per-sample inputs such as a source image's latents; `items` are the condition items themselves (prompt, inputs,
    metadata), which rewards receive as metadata.
    """

    tensors: dict[str, torch.Tensor]
    negative: dict[str, torch.Tensor] = field(default_factory=dict)  # unconditional branch for CFG
    prompts: list[str] = field(default_factory=list)
    items: list = field(default_factory=list)

    def select(self, index) -> Conditioning:
        """The rows `index` (indices, a list or a tensor; repeats allowed) of every tensor, prompt and item, in that
        order, as a new Conditioning."""
        index = torch.as_tensor(index, dtype=torch.long)
        rows = index.tolist()
        pick = {k: v[index] for k, v in self.tensors.items()}
        neg = {k: v[index] for k, v in self.negative.items()}
        return Conditioning(
            pick,
            neg,
            [self.prompts[i] for i in rows] if self.prompts else [],
            [self.items[i] for i in rows] if self.items else [],
        )

    def add_inputs(self, inputs: dict[str, torch.Tensor]) -> None:
        """Add per-sample inputs (a source's latents, a first frame's condition; batch-first tensors by name) to both
        CFG branches, in place."""
        for branch in (self.tensors, self.negative) if self.negative else (self.tensors,):
            branch.update(inputs)

    def to(self, device) -> Conditioning:
        """A copy with every tensor on `device` (prompts and items shared)."""
        return Conditioning(
            {k: v.to(device) for k, v in self.tensors.items()},
            {k: v.to(device) for k, v in self.negative.items()},
            self.prompts,
            self.items,
        )

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]


@dataclass(frozen=True)
class SampleSpec:
    """What one sample is: its size, and its frame count for video families (None elsewhere)."""

    height: int
    width: int
    num_frames: int | None = None
