"""`vlm_questions`: a local Qwen2.5-VL / Qwen3-VL folder as TVRL's question scorer (the method's frozen VLM):
log p("yes") for each of a prompt's yes/no questions about a video, with gradients reaching the pixels.

The processor's video path (resize to multiples of patch x merge, rescale, CLIP normalisation, patches of
temporal_patch_size frames) is redone in torch so that d log p(yes) / d pixels exists; the processor itself still
builds the token ids (how many video tokens) and the grid. Without a resize the pixel values equal the processor's
(the test checks it); with one, flowrl resizes the float frames (bicubic, antialiased) where the processor resizes
uint8 frames, a difference of at most half a grey level before normalisation. The yes mass is the sum over the
yes words' tokens at the first answer position, as in `vlm_judge`.

Questions: `questions_file` (JSON lines {"prompt": ..., "questions": [...]}, e.g. written offline by an LLM, as
TVRL decomposes prompts) or the one `question` template over the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from flowrl.errors import ConfigError, UserError
from flowrl.images import to_uint8
from flowrl.rewards.base import register_reward
from flowrl.rewards.questions import QuestionScorer
from flowrl.rewards.vlm import generation_prompt

DEFAULT_VIDEO_QUESTION = "Does this video show {prompt}? Answer yes or no."


def video_pixel_values(videos: torch.Tensor, video_processor) -> torch.Tensor:
    """videos [B, 3, F, H, W] in [0, 1] (flowrl's decoded layout) -> Qwen-VL `pixel_values_videos`
    [B * patches, 3 * tps * ps * ps], differentiable; the layout of transformers' Qwen2VLVideoProcessor (patches
    grouped by merge window)."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    vp = video_processor
    ps, merge, tps = vp.patch_size, vp.merge_size, vp.temporal_patch_size
    b, c, f, h, w = videos.shape
    frames = (videos.float() * 255).transpose(1, 2)  # [B, F, 3, H, W] on the processor's 0..255 scale
    rh, rw = smart_resize(h, w, factor=ps * merge, min_pixels=vp.size.shortest_edge, max_pixels=vp.size.longest_edge)
    if (rh, rw) != (h, w):
        frames = (
            F.interpolate(frames.flatten(0, 1), size=(rh, rw), mode="bicubic", antialias=True, align_corners=False)
            .view(b, f, c, rh, rw)
            .clamp(0, 255)
        )  # as uint8 frames clip
    mean = torch.tensor(vp.image_mean, device=frames.device).view(1, 1, c, 1, 1)
    std = torch.tensor(vp.image_std, device=frames.device).view(1, 1, c, 1, 1)
    frames = (frames * vp.rescale_factor - mean) / std
    if pad := -f % tps:  # the last frame repeated up to a whole temporal patch
        frames = torch.cat([frames, frames[:, -1:].expand(-1, pad, -1, -1, -1)], 1)
    gt, gh, gw = frames.shape[1] // tps, rh // ps, rw // ps
    patches = frames.reshape(b, gt, tps, c, gh // merge, merge, ps, gw // merge, merge, ps)
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(b * gt * gh * gw, c * tps * ps * ps)


@register_reward("vlm_questions")
class VLMQuestionScorer(QuestionScorer):
    name = "vlm_questions"
    modalities = ("video",)

    def __init__(
        self,
        path: str,
        question: str = DEFAULT_VIDEO_QUESTION,
        questions_file: str | None = None,
        yes: tuple[str, ...] = ("Yes", "yes"),
        dtype: str = "float32",
        batch_size: int = 4,
    ):
        from flowrl.rewards.vlm import answer_token_ids, answer_words, load_local_vlm

        yes = answer_words(yes, "yes", "vlm_questions")
        if "{prompt}" not in question:
            raise ConfigError("reward vlm_questions: params.question must contain {prompt}")
        self.question, self.batch_size = question, batch_size
        self.per_prompt = self.read_questions(questions_file) if questions_file else {}
        self.processor, self.model = load_local_vlm(
            path,
            dtype,
            "vlm_questions",
            "save a Qwen2.5-VL / Qwen3-VL model and its processor (save_pretrained) into one local folder",
        )
        if getattr(self.processor, "video_processor", None) is None:
            raise UserError(f"reward vlm_questions: {path}'s processor has no video processor")
        self.yes_ids = answer_token_ids(self.processor.tokenizer, yes, path, "vlm_questions")

    @staticmethod
    def read_questions(path: str) -> dict[str, list[str]]:
        table = {}
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(
                f"reward vlm_questions: params.questions_file {path} cannot be read ({error}); expected "
                'a .jsonl file of {"prompt": str, "questions": [str, ...]} lines'
            ) from None
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, questions = row["prompt"], row["questions"]
                assert (
                    isinstance(prompt, str)
                    and isinstance(questions, list)
                    and questions
                    and all(isinstance(q, str) for q in questions)
                )
            except (ValueError, KeyError, TypeError, AssertionError):
                raise UserError(f'{path} line {number}: expected {{"prompt": str, "questions": [str, ...]}}') from None
            table[prompt] = list(questions)
        return table

    def questions(self, prompt: str) -> list[str]:
        return self.per_prompt.get(prompt) or [self.question.format(prompt=prompt)]

    def log_yes(self, samples: torch.Tensor, questions: list[str]) -> torch.Tensor:
        if samples.ndim != 5:
            raise ConfigError("reward vlm_questions: expected videos [B, 3, F, H, W]")
        device = next(self.model.parameters()).device
        out = []
        for start in range(0, len(questions), self.batch_size):
            part = slice(start, start + self.batch_size)
            videos = samples[part]
            chats = [
                [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": q}]}] for q in questions[part]
            ]
            texts = [generation_prompt(self.processor, c) for c in chats]
            # the processor counts the video tokens and builds the grid from the uint8 frames; the pixel values
            # the model sees are flowrl's differentiable ones, the same layout
            frames = [torch.from_numpy(v).permute(0, 3, 1, 2) for v in to_uint8(videos.detach().cpu())]
            inputs = self.processor(
                text=texts, videos=frames, return_tensors="pt", padding=True, do_sample_frames=False
            ).to(device)
            pixels = video_pixel_values(videos.to(device), self.processor.video_processor)
            if pixels.shape != inputs["pixel_values_videos"].shape:
                raise UserError(
                    f"reward vlm_questions: the processor made pixel values of shape "
                    f"{tuple(inputs['pixel_values_videos'].shape)}, flowrl {tuple(pixels.shape)}"
                )
            inputs["pixel_values_videos"] = pixels.to(self.model.dtype)
            logits = self.model(**inputs).logits[:, -1].float().log_softmax(-1)
            out.append(logits[:, self.yes_ids.to(device)].logsumexp(-1))
        return torch.cat(out)
