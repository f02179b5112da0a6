"""The description policy: a small Qwen2.5-VL (the real transformers classes, at toy width, with a word-level
tokenizer over the description vocabulary saved beside it) that writes a material's structured description from the
camera image; fine-tuned on the world's true descriptions (briefly, so that RL has room), then refined with GTPO
(`gtpo.gtpo_loss`, the rewards of `gtpo.description_rewards`).

GTPO here is written on the model directly rather than through TRL's `GRPOTrainer`: its reward needs the frozen
tactile generator and each camera image's material, and the trainer's optional dependency (TRL) would be the only
reason to install it; sampling, old log-probabilities and the clipped token objective are a few lines each.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flowrl.images import to_uint8
from flowrl.worlds.tactile.pipeline import DESCRIPTION_WORDS

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
WORDS = ["<unk>", "user", "assistant", "describe", "\n", ","] + sorted(set(DESCRIPTION_WORDS))
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)
VIEW = 56  # pixels the camera patch is shown at: 4 x 4 patches of 14, merged 2 x 2 into 4 visual tokens
MAX_NEW_TOKENS = 16  # the longest description is 13 tokens (9 words, 4 commas) and the end token


@dataclass
class DescriberConfig:
    steps: int = 150  # fine-tuning steps: short on purpose (the policy GTPO starts from is imperfect)
    batch: int = 32
    lr: float = 2e-3
    pool: int = 2048
    image_size: int = 32
    seed: int = 0
    threads: int = 2


def build_describer(folder: Path, seed: int = 0):
    """Save a fresh tiny Qwen2.5-VL and its processor in `folder`; returns (model, processor)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Split(",", "isolated"),
            pre_tokenizers.WhitespaceSplit(),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIAL[1:],
    )
    images = Qwen2VLImageProcessor(
        min_pixels=VIEW * VIEW, max_pixels=VIEW * VIEW, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size={"shortest_edge": VIEW * VIEW, "longest_edge": VIEW * VIEW}),
        chat_template=TEMPLATE,
    )
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            bos_token_id=vocab["<|im_start|>"],
            eos_token_id=vocab["<|im_end|>"],
            pad_token_id=vocab["<|endoftext|>"],
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=VIEW,
            fullatt_block_indexes=[0, 1],
            in_channels=3,
        ),
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=len(vocab),  # no video slot: an id no text can produce
        vision_start_token_id=vocab["<|vision_start|>"],
    )
    config.text_config.vocab_size = len(vocab) + 1
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


def load_describer(folder: str | Path):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(folder)


def _images(rgb: torch.Tensor) -> list[np.ndarray]:
    """Camera patches [B, 3, H, W] in [0, 1] -> uint8 [VIEW, VIEW, 3] arrays (nearest upscaling keeps texture)."""
    big = torch.nn.functional.interpolate(rgb.float(), size=(VIEW, VIEW), mode="nearest")
    return list(to_uint8(big))


def prompt_inputs(processor, rgb: torch.Tensor, answers: list[str] | None = None) -> dict:
    """The model's inputs for camera patches [B, 3, H, W]: the chat prompt ("describe" and the image), followed by
    each answer and the end token when `answers` are given; `prompt_length` says where the answers start."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    texts = [prompt + (a + "<|im_end|>" if answers is not None else "") for a in (answers or [""] * len(rgb))]
    inputs = processor(text=texts, images=_images(rgb), return_tensors="pt", padding=True)
    inputs["prompt_length"] = processor(text=[prompt], images=_images(rgb[:1]), return_tensors="pt")["input_ids"].shape[
        1
    ]
    return inputs


def token_log_probs(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities [B, T] of each answer token under `model`, mask [B, T] of the answer's tokens through its
    end token), T counting the tokens after the prompt."""
    start = inputs["prompt_length"]
    ids = inputs["input_ids"]
    logits = model(
        input_ids=ids,
        attention_mask=inputs["attention_mask"],
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
    ).logits
    log_probs = torch.log_softmax(logits[:, start - 1 : -1].float(), dim=-1)
    targets = ids[:, start:]
    picked = log_probs.gather(-1, targets[..., None])[..., 0]
    return picked, inputs["attention_mask"][:, start:].float()


def clean(text: str) -> str:
    """A decoded answer with the word-level tokenizer's spaces before commas removed."""
    return " ".join(text.split()).replace(" ,", ",").strip()


@torch.no_grad()
def sample(model, processor, rgb: torch.Tensor, greedy: bool = False) -> tuple[list[str], dict]:
    """Descriptions of camera patches [B, 3, H, W] (sampled at temperature 1, or greedy) and the model inputs that
    hold them as sampled: the prompt, the answer tokens through the end token, padding masked out."""
    inputs = prompt_inputs(processor, rgb)
    start = inputs.pop("prompt_length")
    end, pad = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
    out = model.generate(
        **inputs,
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=not greedy,
        temperature=None if greedy else 1.0,
        top_k=None if greedy else 0,
        top_p=None if greedy else 1.0,
        pad_token_id=pad,
        eos_token_id=end,
        suppress_tokens=suppressed(processor),
    )
    answer = out[:, start:]
    ended = (answer == end).long()
    keep = (ended.cumsum(1) - ended) == 0  # every token up to and including the first end token
    texts = [clean(t) for t in processor.batch_decode(answer.masked_fill(~keep, pad), skip_special_tokens=True)]
    held = dict(inputs)
    held["input_ids"] = out
    held["attention_mask"] = torch.cat([inputs["attention_mask"], keep.long()], dim=1)
    held["prompt_length"] = start
    return texts, held


def suppressed(processor) -> list[int]:
    """Token ids an answer may not contain: every special token but the end one, the chat's own words and the
    unknown token (an image token in an answer would also break the model's image-token count)."""
    vocab = processor.tokenizer.get_vocab()
    banned = [w for w in SPECIAL + WORDS[:5] if w != "<|im_end|>"]
    return [vocab[w] for w in banned] + [len(vocab)]


def describe(model, processor, rgb: torch.Tensor) -> list[str]:
    """The greedy description of each camera patch [B, 3, H, W]."""
    return sample(model, processor, rgb, greedy=True)[0]


def fine_tune(model, processor, pool, cfg: DescriberConfig) -> dict:
    """Teacher-forced cross-entropy on the answer tokens of (camera patch, true description) pairs from a
    `PairPool`; returns facts (the final loss)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    model.train()
    start = time.time()
    bar = tqdm(range(cfg.steps), desc="fine-tune describer", mininterval=5)
    for step in bar:
        rows = rng.integers(len(pool.descriptions), size=cfg.batch)
        inputs = prompt_inputs(processor, pool.rgb[rows], [pool.descriptions[i] for i in rows])
        log_probs, mask = token_log_probs(model, inputs)
        loss = -(log_probs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * min(1.0, (step + 1) / 20)
        optimizer.step()
        if step % 25 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return {"config": asdict(cfg), "final_loss": loss.item(), "minutes": (time.time() - start) / 60}


def accuracy(model, processor, pairs, batch: int = 64) -> dict:
    """Mean attribute accuracy (and its standard error) of greedy descriptions of `pairs`' camera images."""
    from flowrl.worlds.tactile.gtpo import attribute_accuracy
    from flowrl.worlds.tactile.metrics import mean_and_stderr

    texts: list[str] = []
    for start in range(0, len(pairs), batch):
        texts += describe(model, processor, torch.stack([p.rgb for p in pairs[start : start + batch]]))
    mean, stderr = mean_and_stderr([attribute_accuracy(t, p.material) for t, p in zip(texts, pairs)])
    return {"accuracy": mean, "stderr": stderr, "texts": texts}


def save_describer(model, processor, out: Path, facts: dict) -> None:
    model.to(torch.float16).save_pretrained(out)
    model.to(torch.float32)
    processor.save_pretrained(out)
    (out / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


@dataclass
class GTPOConfig:
    steps: int = 40
    images: int = 8  # camera images per step
    group: int = 8  # descriptions per image (G)
    inner_steps: int = 2  # updates per batch of samples (the clip binds from the second on)
    clip_range: float = 0.2
    lr: float = 5e-4
    seed: int = 0


def refine_with_gtpo(model, processor, pairs, rewards_of, cfg: GTPOConfig) -> list[dict]:
    """GTPO on `pairs` (a train set): each step draws `images` camera images, samples `group` descriptions of each,
    scores them with `rewards_of(texts, pairs) -> [B]` and takes `inner_steps` steps of the clipped token-level
    objective on advantages normalised within each image's group. Returns one record per step (mean reward, loss,
    and the signal check: the share of groups whose rewards differ and their mean spread)."""
    from flowrl.worlds.tactile.gtpo import gtpo_loss

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    group_ids = torch.arange(cfg.images).repeat_interleave(cfg.group)
    history = []
    for step in tqdm(range(cfg.steps), desc="GTPO", mininterval=5):
        chosen = [pairs[i] for i in rng.choice(len(pairs), size=cfg.images, replace=False) for _ in range(cfg.group)]
        model.eval()
        texts, inputs = sample(model, processor, torch.stack([p.rgb for p in chosen]))
        rewards = rewards_of(texts, chosen)
        with torch.no_grad():
            old, mask = token_log_probs(model, inputs)
        model.train()
        for _ in range(cfg.inner_steps):
            new, _ = token_log_probs(model, inputs)
            loss = gtpo_loss(new, old, mask, rewards, group_ids, cfg.clip_range)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        spread = rewards.view(cfg.images, cfg.group).std(dim=1)
        history.append(
            {
                "step": step,
                "reward": rewards.mean().item(),
                "loss": loss.item(),
                "groups_with_signal": (spread > 1e-6).float().mean().item(),  # groups whose rewards differ
                "within_group_std": spread.mean().item(),
            }
        )
    model.eval()
    return history
