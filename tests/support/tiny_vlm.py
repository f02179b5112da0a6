"""A tiny random Qwen2.5-VL saved offline: the real transformers model, processor, image and video processor classes,
a word-level tokenizer with Qwen's special tokens and a chat template with image and video slots; and the JSON reply
of the stand-in OpenAI-compatible endpoints the judge tests serve."""

import json

import torch

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
WORDS = [
    "<unk>",
    "user",
    "assistant",
    "Yes",
    "No",
    "yes",
    "no",
    "Does",
    "this",
    "image",
    "show",
    "a",
    "an",
    "red",
    "blue",
    "circle",
    "square",
    "two",
    "Answer",
    "or",
    "show?",
    "no.",
    "\n",
    "video",
    "moving",
    "left",
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% else %}{{ c['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)
PROMPTS = ["a red circle", "two blue squares", "a square"]


def save_tiny_qwen25_vl(folder):
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
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.WhitespaceSplit()]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIAL[1:],
    )
    images = Qwen2VLImageProcessor(
        min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    # videos of 28x28 to 56x56 per frame: a 32x32 clip is resized to 28x28, a 56x56 one kept as it is
    videos = Qwen2VLVideoProcessor(size={"shortest_edge": 28 * 28, "longest_edge": 56 * 56})
    processor = Qwen2_5_VLProcessor(
        image_processor=images, tokenizer=tokenizer, video_processor=videos, chat_template=TEMPLATE
    )
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
            bos_token_id=0,
            eos_token_id=vocab["<|im_end|>"],
            pad_token_id=0,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[0],
            in_channels=3,
        ),
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
    )
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return vocab


def send_json(handler, body: dict) -> None:
    """Answer an HTTP request of a stand-in endpoint (a BaseHTTPRequestHandler) with `body` as JSON."""
    data = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
