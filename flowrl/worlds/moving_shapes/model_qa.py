"""The moving-shapes question scorer: a small video-text model that says whether a clip shows a sub-prompt ("a red
circle moving left"), differentiable in the pixels. It plays the frozen VLM of TVRL (flowrl/algorithms/tvrl.py).

Question: word embeddings of the motion vocabulary through a GRU -> q. Video [B, 3, F, H, W] in [0, 1] through three
3-D convolutions (halving space twice, then time once), each feature map modulated by q (FiLM: gamma(q) h + beta(q)),
with two coordinate channels so direction words can bind to where things are; the feature maps are pooled over
space, kept in time order (for "then"), and a small MLP on [time features, q] gives the logit of "yes".
Saved as `model.safetensors` + `config.json` + the tokenizer files in one folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from flowrl.worlds.moving_shapes.prompts import motion_vocabulary
from flowrl.worlds.shapes.tokenizer import MODEL_MAX_LENGTH, build_tokenizer


@dataclass
class MotionQAConfig:
    vocab_size: int = 0
    word_dim: int = 32
    question_dim: int = 64
    channels: tuple[int, int, int] = (24, 48, 64)
    frames: int = 9
    size: int = 32


class FiLMConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: tuple[int, int, int], qdim: int):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, 3, stride=stride, padding=1)
        self.film = nn.Linear(qdim, 2 * cout)

    def forward(self, x, q):
        gamma, beta = self.film(q).chunk(2, dim=-1)
        h = self.conv(x)
        return nn.functional.silu(h * (1 + gamma[:, :, None, None, None]) + beta[:, :, None, None, None])


class MotionQA(nn.Module):
    def __init__(self, config: MotionQAConfig):
        super().__init__()
        self.config = config
        c = config.channels
        self.words = nn.Embedding(config.vocab_size, config.word_dim, padding_idx=0)
        self.gru = nn.GRU(config.word_dim, config.question_dim, batch_first=True)
        self.blocks = nn.ModuleList(
            [
                FiLMConv(5, c[0], (1, 2, 2), config.question_dim),
                FiLMConv(c[0], c[1], (1, 2, 2), config.question_dim),
                FiLMConv(c[1], c[2], (2, 1, 1), config.question_dim),
            ]
        )
        time_steps = (config.frames - 1) // 2 + 1
        self.head = nn.Sequential(nn.Linear(c[2] * time_steps + config.question_dim, 128), nn.SiLU(), nn.Linear(128, 1))

    def encode_question(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.words(ids), lengths, batch_first=True, enforce_sorted=False)
        return self.gru(packed)[1][0]

    def forward(self, video: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logit of "yes" [N] for video [N, 3, F, H, W] in [0, 1] and question tokens [N, L]."""
        q = self.encode_question(ids, mask)
        n, _, f, h, w = video.shape
        ys = torch.linspace(-1, 1, h, device=video.device).view(1, 1, 1, h, 1).expand(n, 1, f, h, w)
        xs = torch.linspace(-1, 1, w, device=video.device).view(1, 1, 1, 1, w).expand(n, 1, f, h, w)
        x = torch.cat([video * 2 - 1, ys, xs], 1)
        for block in self.blocks:
            x = block(x, q)
        features = x.mean(dim=(3, 4)).flatten(1)  # [N, C * F'], time order kept
        return self.head(torch.cat([features, q], 1)).squeeze(-1)


def build_model(seed: int = 0) -> tuple[MotionQA, object]:
    torch.manual_seed(seed)
    words = motion_vocabulary()
    return MotionQA(MotionQAConfig(vocab_size=len(words))), build_tokenizer(words=words)


def save_model(model: MotionQA, tokenizer, folder: str | Path, facts: dict | None = None) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().half().contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(asdict(model.config), indent=2) + "\n")
    tokenizer.save_pretrained(folder)
    if facts is not None:
        (folder / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


def load_model(folder: str | Path) -> tuple[MotionQA, object]:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    config["channels"] = tuple(config["channels"])
    model = MotionQA(MotionQAConfig(**config))
    model.load_state_dict({k: v.float() for k, v in load_file(folder / "model.safetensors").items()})
    return model.eval().requires_grad_(False), AutoTokenizer.from_pretrained(folder, local_files_only=True)


def tokenize(tokenizer, questions: list[str], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = tokenizer(
        questions, padding="max_length", truncation=True, max_length=MODEL_MAX_LENGTH, return_tensors="pt"
    )
    return tokens.input_ids.to(device), tokens.attention_mask.to(device)
