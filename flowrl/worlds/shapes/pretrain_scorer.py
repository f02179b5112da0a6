"""Pretrain the learned shapes scorer (`pipelines/shapes-scorer`) on renderer data, labelled by the verifier.

Each step renders B scenes and pairs every image with 2B prompts: the B scene prompts and, per scene, a prompt
of the same tag with other attributes (hard negatives). The verifier's verdict on every (image, prompt) pair is
the target of a pairwise sigmoid loss (SigLIP's form, which allows several positives per row) on
`logit_scale * cos + score_bias`. Renders are blurred and noised at random, and each batch also holds samples of
the embedded shapes-sd3 pipeline on RL-training prompts (drawn once before training), so the scorer learns to
judge a generator's imperfect attempts, as PickScore learned from real generations. Agreement with the verifier
is reported as AUC on held-out rendered pairs and on pipeline samples of the held-out eval prompts.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flowrl.eval.metrics import auc
from flowrl.images import to_uint8, to_unit
from flowrl.schedules import cosine_decay
from flowrl.worlds.shapes import verifier
from flowrl.worlds.shapes.model_scorer import ScorerSize, build_scorer, scorer_image_processor, scorer_tokenizer
from flowrl.worlds.shapes.prompts import all_prompt_specs, parse_prompt
from flowrl.worlds.shapes.scenes import sample_mixed_color_pairs, sample_pairs


@dataclass
class ScorerConfig:
    seed: int = 0
    steps: int = 1200
    batch: int = 96
    lr: float = 1e-3
    warmup_steps: int = 100
    blur_probability: float = 0.5
    noise_std: float = 0.04
    generated: int = 2048  # samples of the embedded pipeline on training prompts, labelled by the verifier
    generated_per_step: int = 32
    # hard examples made by climbing the scorer itself: the pool samples of a step are pushed up their own-prompt
    # score by sign-gradient steps (L_inf ball of adversarial_eps) and added with the verifier's verdicts, so the
    # directions a reward-gradient method would climb without meeting the prompt are learned as such (0: off)
    adversarial_steps: int = 0
    adversarial_eps: float = 0.15
    # tuned checkpoints (LoRA dirs of the pipeline) whose samples on training prompts join the pool, labelled by
    # the verifier: the failures a reward-gradient run found become training data, as a reward model is refreshed
    pool_checkpoints: list[str] = field(default_factory=list)
    pool_per_checkpoint: int = 1024
    # renders painted with colour mixtures (two-tone gradients, uniform blends) per step, labelled by the verifier:
    # a scorer trained on clean renders alone scores such objects almost as high as clean ones, and ReFL / DRaFT /
    # MEND climbed exactly there (0: off)
    mixed_color_per_step: int = 0
    threads: int = 2


def verdict_matrix(images: np.ndarray, prompts: list[str]) -> torch.Tensor:
    """[len(images), len(prompts)] verifier verdicts (1 = the image meets the prompt)."""
    specs = [parse_prompt(p) for p in prompts]
    rows = []
    for image in images:
        found = verifier.detect(image)
        rows.append([verifier.judge_detections(spec, found)[0] for spec in specs])
    return torch.tensor(rows)


def hard_negative_prompts(prompts: list[str], rng: np.random.Generator) -> list[str]:
    """Per prompt, another prompt of the same tag (differs in some attribute, count or relation)."""
    out = []
    for prompt in prompts:
        specs = all_prompt_specs(parse_prompt(prompt).tag)
        out.append(specs[rng.integers(len(specs))].text())
    return out


def degrade(pixels: torch.Tensor, cfg: ScorerConfig, generator: torch.Generator) -> torch.Tensor:
    import kornia

    blur_sigma = 0.3 + 0.9 * torch.rand(1, generator=generator).item()
    blurred = kornia.filters.gaussian_blur2d(pixels, (5, 5), (blur_sigma, blur_sigma))
    pick = (torch.rand(len(pixels), 1, 1, 1, generator=generator) < cfg.blur_probability).float()
    out = pick * blurred + (1 - pick) * pixels
    noise = (
        torch.randn(out.shape, generator=generator) * cfg.noise_std * torch.rand(len(out), 1, 1, 1, generator=generator)
    )
    return (out + noise).clamp(0, 1)


def pair_logits(model, tokenizer, pixels: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """[B_images, B_prompts] logit_scale * cos + score_bias."""
    tokens = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length, return_tensors="pt")
    out = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, pixel_values=pixels * 2 - 1)
    return out.logits_per_image + model.score_bias


def climb_scorer(model, tokenizer, pixels: torch.Tensor, prompts: list[str], steps: int, eps: float) -> torch.Tensor:
    """Pixels pushed up their own-prompt score by `steps` sign-gradient steps of size eps / steps * 2, kept within
    eps (L_inf) of the start and in [0, 1]: what a reward-gradient method finds when it climbs the scorer."""
    start = pixels.detach()
    x = start.clone()
    own = torch.arange(len(prompts))
    for _ in range(steps):
        x.requires_grad_(True)
        score = pair_logits(model, tokenizer, x, prompts)[own, own].sum()
        (grad,) = torch.autograd.grad(score, x)
        x = (x.detach() + 2 * eps / steps * grad.sign()).clamp(start - eps, start + eps).clamp(0, 1)
    return x.detach()


def generated_pairs(
    pipeline_dir: str | Path, count: int, seed: int, checkpoint: str | None = None
) -> tuple[np.ndarray, list[str]]:
    """`count` samples of the pipeline, or of a tuned checkpoint of it (ODE 20 steps, CFG 4.5, seed-derived
    noise), on RL-training prompts."""
    from flowrl.checkpoint import load_trained_weights
    from flowrl.inference import generate
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.prompt_source import PromptSource
    from flowrl.tasks.base import build_task
    from flowrl.worlds.shapes.pretrain_sd3 import T5_SEQUENCE_LENGTH

    policy = policy_for(load_pipeline(pipeline_dir), max_sequence_length=T5_SEQUENCE_LENGTH)
    if checkpoint is not None:
        load_trained_weights(policy, checkpoint)
    prompts = [c.prompt for c in PromptSource(build_task("shapes"), "train").draw(count, seed, 0)]
    images, _ = generate(
        policy, prompts, 1, seed + 1, 20, 4.5, desc=f"scorer training samples ({checkpoint or 'base'})"
    )
    return images, prompts


def generation_pool(pipeline_dir: str | Path, cfg: ScorerConfig) -> tuple[np.ndarray, list[str]]:
    """The base pipeline's samples, then `pool_per_checkpoint` of each pool checkpoint (own seeds each)."""
    parts = [generated_pairs(pipeline_dir, cfg.generated, cfg.seed)]
    for j, checkpoint in enumerate(cfg.pool_checkpoints, start=1):
        parts.append(generated_pairs(pipeline_dir, cfg.pool_per_checkpoint, cfg.seed + 1000 * j, checkpoint))
    return np.concatenate([images for images, _ in parts]), [p for _, prompts in parts for p in prompts]


def pretrain_scorer(cfg: ScorerConfig, size: ScorerSize | None = None, pipeline_dir: str | Path | None = None):
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    start = time.time()
    pool = generation_pool(pipeline_dir, cfg) if pipeline_dir and cfg.generated else None
    model = build_scorer(size, cfg.seed)
    model.score_bias = torch.nn.Parameter(torch.tensor(float(model.config.score_bias)))
    tokenizer = scorer_tokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.train()
    bar = tqdm(range(cfg.steps), desc="pretrain scorer", mininterval=5)
    for step in bar:
        images, prompts = sample_pairs(cfg.batch, rng)
        if cfg.mixed_color_per_step:
            mixed, mixed_prompts = sample_mixed_color_pairs(cfg.mixed_color_per_step, rng)
            images, prompts = np.concatenate([images, mixed]), prompts + mixed_prompts
        pixels = degrade(to_unit(images), cfg, generator)
        if pool is not None:
            pick = rng.integers(len(pool[0]), size=cfg.generated_per_step)
            images = np.concatenate([images, pool[0][pick]])
            prompts = prompts + [pool[1][i] for i in pick]
            pixels = torch.cat([pixels, to_unit(pool[0][pick])])
            if cfg.adversarial_steps:
                own = prompts[-len(pick) :]
                climbed = to_uint8(
                    climb_scorer(
                        model, tokenizer, to_unit(pool[0][pick]), own, cfg.adversarial_steps, cfg.adversarial_eps
                    )
                )
                images = np.concatenate([images, climbed])
                prompts = prompts + own
                pixels = torch.cat([pixels, to_unit(climbed)])
        prompts = prompts + hard_negative_prompts(prompts, rng)
        labels = verdict_matrix(images, prompts)
        logits = pair_logits(model, tokenizer, pixels, prompts)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / len(images)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * warm * cosine_decay(step, cfg.steps)
        optimizer.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    model.config.score_bias = model.score_bias.item()
    del model.score_bias
    facts = {
        "config": asdict(cfg),
        "size": asdict(size or ScorerSize()),
        "final_loss": loss.item(),
        "minutes": (time.time() - start) / 60,
        "generated_from": str(pipeline_dir) if pool is not None else None,
    }
    return model, tokenizer, facts


@torch.no_grad()
def rendered_auc(model, tokenizer, count: int = 512, seed: int = 10_000) -> dict:
    """AUC against the verifier on fresh renders (clean and degraded) x (own + hard-negative prompts)."""
    rng = np.random.default_rng(seed)
    images, prompts = sample_pairs(count, rng)
    prompts = prompts + hard_negative_prompts(prompts, rng)
    labels = verdict_matrix(images, prompts)
    model.score_bias = model.config.score_bias
    clean = pair_logits(model, tokenizer, to_unit(images), prompts)
    noisy = pair_logits(
        model, tokenizer, degrade(to_unit(images), ScorerConfig(), torch.Generator().manual_seed(seed)), prompts
    )
    # own-prompt column versus its hard negative: the pairs that differ in one attribute
    own = torch.arange(count)
    hard_scores = torch.cat([clean[own, own], clean[own, own + count]])
    hard_labels = torch.cat([labels[own, own], labels[own, own + count]])
    # colour mixtures against their own prompts: the blind spot reward-gradient methods climbed
    mixed, mixed_prompts = sample_mixed_color_pairs(count, rng)
    mixed_labels = torch.tensor([verifier.score(image, p) for image, p in zip(mixed, mixed_prompts)])
    mixed_scores = pair_logits(model, tokenizer, to_unit(mixed), mixed_prompts).diagonal()
    return {
        "pairs": int(labels.numel()),
        "positives": int(labels.sum()),
        "auc_clean": auc(clean, labels),
        "auc_degraded": auc(noisy, labels),
        "auc_own_vs_hard_negative": auc(hard_scores, hard_labels),
        "auc_mixed_colors_own_prompt": auc(mixed_scores, mixed_labels),
        "mixed_colors_accepted": float(mixed_labels.mean()),
    }


CLIMB_CHECK = {"steps": 10, "eps": 0.15}  # the card's test of the scorer's gradient


@torch.no_grad()
def generated_auc(model, tokenizer, pipeline_dir: str | Path) -> dict:
    """AUC against the verifier on the embedded pipeline's eval-protocol samples x every eval prompt."""
    from flowrl.inference import generate
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.worlds.shapes.pretrain_sd3 import CARD_EVAL, T5_SEQUENCE_LENGTH
    from flowrl.worlds.shapes.prompts import eval_prompt_set

    policy = policy_for(load_pipeline(pipeline_dir), max_sequence_length=T5_SEQUENCE_LENGTH)
    prompts = eval_prompt_set()
    e = CARD_EVAL
    images, records = generate(
        policy, prompts, e["num_per_prompt"], e["seed"], e["num_steps"], e["guidance_scale"], desc="scorer eval samples"
    )
    labels = verdict_matrix(images, prompts)
    model.score_bias = model.config.score_bias
    logits = pair_logits(model, tokenizer, to_unit(images), prompts)
    own = torch.tensor([prompts.index(r["prompt"]) for r in records])
    rows = torch.arange(len(images))
    own_prompts = [r["prompt"] for r in records]
    with torch.enable_grad():
        climbed = to_uint8(
            climb_scorer(model, tokenizer, to_unit(images), own_prompts, CLIMB_CHECK["steps"], CLIMB_CHECK["eps"])
        )
    climbed_logits = pair_logits(model, tokenizer, to_unit(climbed), own_prompts)[rows, rows]
    climbed_accepted = torch.tensor([verifier.score(image, p) for image, p in zip(climbed, own_prompts)])
    return {
        "pipeline": str(pipeline_dir),
        "images": len(images),
        "pairs": int(labels.numel()),
        "auc_all_pairs": auc(logits, labels),
        "auc_own_prompt": auc(logits[rows, own], labels[rows, own]),
        "own_prompt_positive_rate": float(labels[rows, own].mean()),
        "climb": {
            **CLIMB_CHECK,
            "predicted_accept_before": float(torch.sigmoid(logits[rows, own]).mean()),
            "predicted_accept_after": float(torch.sigmoid(climbed_logits).mean()),
            "verifier_accept_after": float(climbed_accepted.mean()),
        },
    }


def save_scorer(model, tokenizer, out_dir: str | Path, facts: dict) -> None:
    from flowrl.worlds.shapes.pretrain_sd3 import load_in_fp32_by_default

    out = Path(out_dir)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    load_in_fp32_by_default(out)
    model.to(torch.float32)
    tokenizer.save_pretrained(out)
    scorer_image_processor().save_pretrained(out)
    (out / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


def write_scorer_card(out_dir: str | Path, facts: dict, rendered: dict, generated: dict) -> None:
    out = Path(out_dir)
    (out / "eval.json").write_text(json.dumps({"rendered": rendered, "generated": generated}, indent=2) + "\n")
    cfg = facts["config"]
    mined = (
        f"\nThe pool also holds {cfg['pool_per_checkpoint']} samples of each tuned checkpoint "
        f"{', '.join(cfg['pool_checkpoints'])}."
        if cfg.get("pool_checkpoints")
        else ""
    )
    mixed = (
        f"\nEach step also holds {cfg['mixed_color_per_step']} renders painted with colour mixtures "
        "(two-tone gradients or uniform blends of two palette colours), labelled by the verifier."
        if cfg.get("mixed_color_per_step")
        else ""
    )
    adversarial = (
        f"\nEach step also holds the pool samples climbed up their own-prompt score "
        f"({cfg['adversarial_steps']} sign-gradient steps, at most {cfg['adversarial_eps']} per channel), "
        "labelled by the verifier."
        if cfg.get("adversarial_steps")
        else ""
    )
    (out / "README.md").write_text(f"""# shapes-scorer: the learned, differentiable reward of the shapes world

A tiny `transformers.CLIPModel` (vision: 32x32 images in 4x4 patches; text: the project's word-level tokenizer;
{facts["size"]["layers"]} layers of width {facts["size"]["hidden"]} each; fp16 safetensors) that plays the role \
PickScore plays for real
pipelines: a learned image-text score that gradients can flow through. Use it as the reward `shapes_clip`.

```python
from transformers import CLIPModel

model = CLIPModel.from_pretrained("pipelines/shapes-scorer")  # score = logit_scale * cos(image, text)
```
Images enter as 32x32 RGB in [0, 1], normalised with mean = std = 0.5 (preprocessor_config.json).
`config.score_bias` turns a score into the probability that the rule-based verifier accepts the pair:
`sigmoid(score + score_bias)`.

## How it was trained
`flowrl pretrain scorer` (seed {cfg["seed"]}), {cfg["steps"]} steps, {cfg["batch"]} rendered scenes (randomly blurred \
and noised) plus
{cfg["generated_per_step"]} samples of {facts.get("generated_from")} per step (from a pool of {cfg["generated"]} drawn \
once on RL-training prompts), each
paired with its own prompt, a same-tag prompt with other attributes (hard negative) and every other prompt of the
batch; targets are the verifier's verdicts; pairwise sigmoid loss; AdamW lr {cfg["lr"]} (warm-up, \
cosine).{mixed}{mined}{adversarial}
{facts["minutes"]:.1f} minutes on 2 CPU cores (including drawing the pool); final loss {facts["final_loss"]:.3f}.

## Agreement with the verifier (AUC)
| pairs | AUC |
|---|---|
| held-out renders x (own + hard-negative prompts), clean ({rendered["pairs"]} pairs, {rendered["positives"]} \
accepted) | {rendered["auc_clean"]:.3f} |
| same, blurred / noised | {rendered["auc_degraded"]:.3f} |
| own prompt vs its hard negative only | {rendered["auc_own_vs_hard_negative"]:.3f} |
| renders painted with colour mixtures x their own prompt (accepted share {rendered["mixed_colors_accepted"]:.2f}) | \
{rendered["auc_mixed_colors_own_prompt"]:.3f} |
| shapes-sd3 samples (eval protocol, {generated["images"]} images) x all 36 eval prompts | \
{generated["auc_all_pairs"]:.3f} |
| shapes-sd3 samples x their own prompt (accepted share {generated["own_prompt_positive_rate"]:.2f}) | \
{generated["auc_own_prompt"]:.3f} |

The last row is the one that matters for RL: how well the scorer ranks a generator's own attempts at a prompt.

## Does climbing its gradient do what the prompt asks?
Each of those {generated["images"]} samples is pushed up its own-prompt score by {generated["climb"]["steps"]} \
sign-gradient steps in pixel
space (at most {generated["climb"]["eps"]} per channel), as ReFL / DRaFT / MEND push samples through the generator. The
scorer's predicted acceptance goes {generated["climb"]["predicted_accept_before"]:.2f} -> \
{generated["climb"]["predicted_accept_after"]:.2f}; the verifier's goes {generated["own_prompt_positive_rate"]:.2f} -> \
{generated["climb"]["verifier_accept_after"]:.2f}.
A scorer whose gradient followed the prompt would not promise acceptance that the verifier does not grant.
""")
