"""Pretrain `pipelines/shapes-motion-qa`, the moving-shapes question scorer (flowrl/worlds/moving_shapes/model_qa.py).

Each step renders fresh clips and asks each clip questions: the sub-prompts of its own prompt (mostly "yes"), of a
near-miss prompt (one attribute redrawn: mostly "no") and of a random prompt. Every label is the video verifier's
verdict of that sub-prompt on that clip, so labels are exact for renders. Binary cross-entropy, AdamW with cosine
decay. Reported: accuracy on fresh renders (all questions, and held-out-combination questions apart).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from flowrl.schedules import cosine_decay
from flowrl.worlds.moving_shapes.model_qa import build_model, tokenize
from flowrl.worlds.moving_shapes.prompts import is_held_out, parse_prompt, perturb, sub_prompts
from flowrl.worlds.moving_shapes.verifier import detections, judge_clip
from flowrl.worlds.moving_shapes.world import random_spec, render_clip, sample_clip


@dataclass
class MotionQAPretrainConfig:
    seed: int = 0
    steps: int = 1500
    clips: int = 16  # clips per step; each asked its own, a near-miss and a random prompt's sub-prompts
    lr: float = 2e-3
    threads: int = 2


def labelled_questions(count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str], torch.Tensor]:
    """Rendered clips, one question each (several rows per clip) and the verifier's label per row."""
    clips, rows, questions, labels = [], [], [], []
    for c in range(count):
        spec = random_spec(rng)
        clip = render_clip(sample_clip(spec, rng))
        found = detections(clip)
        clips.append(clip)
        asked = sub_prompts(spec) + sub_prompts(perturb(spec, rng)) + sub_prompts(random_spec(rng))
        for question in dict.fromkeys(asked):
            rows.append(c)
            questions.append(question)
            labels.append(judge_clip(found, question)[0])
    clips = np.stack(clips)[rows]
    return clips, questions, torch.tensor(labels)


def to_video(clips: np.ndarray) -> torch.Tensor:
    """uint8 [N, F, H, W, 3] -> float [N, 3, F, H, W] in [0, 1] (what rewards take)."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 255


@torch.no_grad()
def accuracy(model, tokenizer, count: int, rng: np.random.Generator) -> dict:
    clips, questions, labels = labelled_questions(count, rng)
    logits = torch.cat(
        [
            model(to_video(clips[i : i + 64]), *tokenize(tokenizer, questions[i : i + 64]))
            for i in range(0, len(questions), 64)
        ]
    )
    right = ((logits > 0).float() == labels).float()
    held = torch.tensor([is_held_out(parse_prompt(q)) for q in questions])
    return {
        "accuracy": right.mean().item(),
        "held_out_accuracy": right[held].mean().item() if held.any() else None,
        "yes_share": labels.mean().item(),
        "questions": len(questions),
    }


def pretrain_motion_qa(cfg: MotionQAPretrainConfig):
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    model, tokenizer = build_model(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    started = time.time()
    bar = tqdm(range(cfg.steps), desc="pretrain motion qa", mininterval=5)
    for step in bar:
        clips, questions, labels = labelled_questions(cfg.clips, rng)
        logits = model(to_video(clips), *tokenize(tokenizer, questions))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * min(1.0, (step + 1) / 50) * cosine_decay(step, cfg.steps)
        optimizer.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval().requires_grad_(False)
    facts = {
        "config": asdict(cfg),
        "minutes": (time.time() - started) / 60,
        "final_loss": loss.item(),
        "eval_on_renders": accuracy(model, tokenizer, 200, np.random.default_rng(cfg.seed + 1000)),
    }
    return model, tokenizer, facts
