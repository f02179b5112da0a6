"""A VLM judge as a reward: the probability that a vision-language model answers "yes" to a question about the
sample (the question is a template over the prompt, e.g. "Does this image show {prompt}? Answer yes or no.").

score = P(yes) / (P(yes) + P(no)), where P(yes) sums the next-token probabilities of the yes words ("Yes", "yes")
and P(no) those of the no words, at the first answer token after the chat template's generation prompt. Two
back-ends give the same number:
- `path`: a local Qwen2.5-VL-style folder (anything `AutoProcessor` + `AutoModelForImageTextToText` load, with a
  chat template), run in this process; samples are batched with left padding;
- `url`: an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API) asked for one token with
  `logprobs` and `top_logprobs`; P(yes) and P(no) come from the returned top log-probabilities, so a judge whose
  answer is neither word in its top `top_logprobs` gives NaN (a failed sample; the loop skips its group).
Not differentiable. Images only (wrap it in `per_frame` for videos). Info: `p_yes`, the unnormalised yes mass.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from flowrl.errors import ConfigError, UserError
from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, register_reward

DEFAULT_QUESTION = "Does this image show {prompt}? Answer yes or no."


def png_data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def generation_prompt(processor, chat: list[dict]) -> str:
    """`chat` as the model's input text, ready for its answer. The template's own switch turns thinking off
    (`enable_thinking=False`, as Qwen3's templates read it; a template without it ignores it), and a think block that
    a template opens regardless is closed empty, so the first token scored or generated is the answer, not the
    opening of a thought."""
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    opened = text.rfind("<think>")
    if opened > text.rfind("</think>") and not text[opened + len("<think>") :].strip():
        text = text[:opened] + "<think>\n\n</think>\n\n"
    return text


def yes_share(p_yes: torch.Tensor, p_no: torch.Tensor) -> torch.Tensor:
    """P(yes) / (P(yes) + P(no)); NaN where the judge put no mass on either."""
    total = p_yes + p_no
    return torch.where(total > 0, p_yes / total.clamp(min=1e-30), torch.full_like(total, float("nan")))


def load_local_vlm(path: str, dtype: str, reward: str, how: str):
    """(processor, frozen model) of a local VLM folder (AutoProcessor + AutoModelForImageTextToText), the tokenizer
    padding on the left so that the answer position is the last of every row; one clear error otherwise."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from flowrl.rewards.clip import require_local_folder

    folder = require_local_folder(path, reward, how)
    try:
        processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
        model = (
            AutoModelForImageTextToText.from_pretrained(folder, dtype=getattr(torch, dtype), local_files_only=True)
            .eval()
            .requires_grad_(False)
        )
    except (OSError, ValueError) as error:
        raise UserError(f"reward {reward}: {folder} holds no loadable VLM and processor: {str(error)[:300]}") from None
    processor.tokenizer.padding_side = "left"
    return processor, model


def answer_words(words, field: str, reward: str) -> tuple[str, ...]:
    """The answer words a judge's yes / no mass sums over: a list of strings (one string is one word, not its
    letters); YAML reads a bare Yes / No as a boolean, named here."""
    if isinstance(words, str):
        words = [words]
    if not isinstance(words, (list, tuple)) or not words or not all(isinstance(w, str) for w in words):
        raise ConfigError(
            f"reward {reward}: params.{field}: expected a list of answer words such as ['Yes', 'yes'], "
            f"got {words!r} (YAML reads a bare Yes / No as a boolean: quote them)"
        )
    return tuple(words)


def answer_token_ids(tokenizer, words, folder, reward: str) -> torch.Tensor:
    """The token ids of the answer words, bare or with a leading-space marker (BPE's Ġ, SentencePiece's ▁)."""
    vocab = tokenizer.get_vocab()
    found = sorted({vocab[w] for word in words for w in (word, "Ġ" + word, "▁" + word) if w in vocab})
    if not found:
        raise UserError(f"reward {reward}: none of {list(words)} is a token of {folder}'s tokenizer")
    return torch.tensor(found)


@register_reward("vlm_judge")
class VLMJudge(Reward):
    name = "vlm_judge"

    def __init__(
        self,
        path: str | None = None,
        url: str | None = None,
        model: str = "judge",
        question: str = DEFAULT_QUESTION,
        yes: tuple[str, ...] = ("Yes", "yes"),
        no: tuple[str, ...] = ("No", "no"),
        batch_size: int = 8,
        dtype: str = "float32",
        api_key_env: str = "OPENAI_API_KEY",
        top_logprobs: int = 20,
        timeout: float = 60.0,
        retries: int = 3,
        concurrency: int = 8,
    ):
        if (path is None) == (url is None):
            raise ConfigError(
                "reward vlm_judge: give exactly one of params.path (a local model folder) and "
                "params.url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)"
            )
        if "{prompt}" not in question:
            raise ConfigError("reward vlm_judge: params.question must contain {prompt}")
        self.yes, self.no = answer_words(yes, "yes", "vlm_judge"), answer_words(no, "no", "vlm_judge")
        self.question, self.batch_size = question, batch_size
        self.url, self.model_name, self.top_logprobs = url and url.rstrip("/"), model, top_logprobs
        self.timeout, self.retries, self.concurrency = timeout, retries, concurrency
        self.api_key = os.environ.get(api_key_env)
        if path is not None:
            self.load_local(path, dtype)

    def load_local(self, path: str, dtype: str) -> None:
        self.processor, self.model = load_local_vlm(
            path,
            dtype,
            "vlm_judge",
            "save a Qwen2.5-VL-style model and its processor (save_pretrained) into one local folder",
        )
        self.yes_ids = answer_token_ids(self.processor.tokenizer, self.yes, path, "vlm_judge")
        self.no_ids = answer_token_ids(self.processor.tokenizer, self.no, path, "vlm_judge")

    def chat(self, prompt: str) -> list[dict]:
        return [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": self.question.format(prompt=prompt)}],
            }
        ]

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        if samples.ndim != 4:
            raise ConfigError("reward vlm_judge: expected images [B, 3, H, W]; score videos with per_frame")
        from PIL import Image

        images = [Image.fromarray(array) for array in to_uint8(samples)]
        p_yes, p_no = self.local(images, prompts) if self.url is None else self.remote(images, prompts)
        return RewardOutput(yes_share(p_yes, p_no), {"p_yes": p_yes})

    @torch.no_grad()
    def local(self, images, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        yes, no = [], []
        for start in range(0, len(prompts), self.batch_size):
            part = range(start, min(start + self.batch_size, len(prompts)))
            texts = [generation_prompt(self.processor, self.chat(prompts[i])) for i in part]
            inputs = self.processor(text=texts, images=[images[i] for i in part], return_tensors="pt", padding=True).to(
                device
            )
            probs = self.model(**inputs).logits[:, -1].float().softmax(-1).cpu()
            yes.append(probs[:, self.yes_ids].sum(-1))
            no.append(probs[:, self.no_ids].sum(-1))
        return torch.cat(yes), torch.cat(no)

    def remote(self, images, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            pairs = list(pool.map(self.ask, images, prompts))
        return torch.tensor([p for p, _ in pairs]), torch.tensor([n for _, n in pairs])

    def ask(self, image, prompt: str) -> tuple[float, float]:
        """One chat completion of one token; (P(yes), P(no)) from its top log-probabilities."""
        answer = chat_completion(
            self.url,
            self.model_name,
            [image],
            self.question.format(prompt=prompt),
            self.api_key,
            self.timeout,
            self.retries,
            max_tokens=1,
            logprobs=True,
            top_logprobs=self.top_logprobs,
        )
        return answer_mass(answer, self.yes, self.no, self.url, "vlm_judge")


def chat_completion(
    url: str, model: str, images, text: str, api_key: str | None, timeout: float, retries: int, **options
) -> dict:
    """One user turn (the PIL images, then the text) to an OpenAI-compatible /chat/completions at temperature 0;
    `options` go into the request (max_tokens, logprobs, ...). The parsed JSON answer."""
    from flowrl.rewards.remote import post_with_retries

    content = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
    content.append({"type": "text", "text": text})
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **options}
    ).encode()
    return json.loads(
        post_with_retries(url, "/chat/completions", body, "application/json", api_key, timeout, retries, 1.0)
    )


def answer_mass(answer: dict, yes, no, url: str, reward: str) -> tuple[float, float]:
    """(P(yes), P(no)) from a one-token chat completion's top log-probabilities."""
    try:
        top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise UserError(
            f"reward {reward}: {url} answered without logprobs; it must support "
            f"'logprobs' and 'top_logprobs' in chat completions"
        ) from None
    mass: dict[str, float] = {}
    for entry in top:
        word = entry["token"].strip()
        mass[word] = mass.get(word, 0.0) + math.exp(entry["logprob"])
    return sum(mass.get(w, 0.0) for w in yes), sum(mass.get(w, 0.0) for w in no)
