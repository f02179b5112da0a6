"""Reward gradients averaged over small image shifts (expectation over transformations).

A learned reward's gradient with respect to pixels is partly adversarial: patterns tied to exact pixel positions
(for a ViT scorer, its patch grid) raise the score without changing what the image shows. Methods that climb that
gradient (ReFL, DRaFT, MEND's proposals) can learn those patterns instead of the prompt. Scoring each image at
`copies` random integer translations of up to `max_shift` pixels (edges replicated) and averaging keeps the
gradient of what survives a shift, the content, and averages away much of what does not. Shifts are drawn from
each sample's own seed, so a run still resumes exactly and is identical on one process or many.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ShiftAverage:
    max_shift: int = 0  # pixels; 0 turns the averaging off
    copies: int = 1

    @property
    def active(self) -> bool:
        return self.max_shift > 0

    def offsets(self, seeds: list[int]) -> torch.Tensor:
        """[B, copies, 2] integer (dy, dx) in [-max_shift, max_shift], drawn from each sample's seed."""
        rows = []
        for seed in seeds:  # offset from the seed's other uses (noise, trained steps)
            generator = torch.Generator().manual_seed((int(seed) + 17) % (2**63 - 1))
            rows.append(torch.randint(-self.max_shift, self.max_shift + 1, (self.copies, 2), generator=generator))
        return torch.stack(rows)

    def shifted(self, images: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        """Images [B, C, H, W] (or clips [B, C, F, H, W], every frame shifted alike) -> [B * copies, ...], copy c of
        sample b at row b * copies + c."""
        s = self.max_shift
        lead, (height, width) = images.shape[1:-2], images.shape[-2:]
        # replicate padding pads the last two dims of a 4D tensor: channels and frames ride along as channels
        padded = F.pad(images.reshape(len(images), -1, height, width), (s, s, s, s), mode="replicate")
        out = []
        for b, pairs in enumerate(self.offsets(seeds).tolist()):
            for dy, dx in pairs:
                out.append(
                    padded[b, :, s + dy : s + dy + height, s + dx : s + dx + width].reshape(*lead, height, width)
                )
        return torch.stack(out)

    def score(
        self, reward, images: torch.Tensor, prompts: list[str], seeds: list[int], items: list | None = None
    ) -> torch.Tensor:
        """Mean reward over the shifted copies of each image (judged against its condition item, when given): [B]."""
        meta = {"conditions": [item for item in items for _ in range(self.copies)]} if items else None
        scores = reward(self.shifted(images, seeds), [p for p in prompts for _ in range(self.copies)], meta).scores
        return scores.reshape(len(prompts), self.copies).mean(1)
