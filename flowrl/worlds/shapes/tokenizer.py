"""A word-level tokenizer built locally for the shapes vocabulary (no hub download).

It is a `PreTrainedTokenizerFast` over a `tokenizers` WordLevel model, saved beside each pipeline so that
`from_pretrained` loads it like any other tokenizer. Sequences are `<bos> words <eos>` padded with `<pad>`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from flowrl.worlds.shapes.prompts import NUMBER_WORDS, RELATIONS
from flowrl.worlds.shapes.world import COLORS, SHAPES

# ids 0..3. <eos> is not id 2: transformers' CLIP text model treats a config with eos_token_id == 2 as a legacy
# checkpoint and pools the highest-id token of each prompt instead of <eos> (with a sorted vocabulary, some word
# in the middle, so "two circles" and "two squares" pooled alike). Pipelines saved before this order keep their
# own tokenizer files and configs, and with them the old pooling.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<unk>", "<eos>")
MODEL_MAX_LENGTH = 16  # the longest grammar prompt is 8 words + bos + eos


def shapes_vocabulary() -> list[str]:
    words = ["a", "an", "and", "of", "no", "not", *COLORS, *SHAPES, *(s + "s" for s in SHAPES), *NUMBER_WORDS]
    words += [w for r in RELATIONS for w in r.split()]
    return list(SPECIAL_TOKENS) + sorted(set(words))


def build_tokenizer(max_length: int = MODEL_MAX_LENGTH, words: list[str] | None = None) -> PreTrainedTokenizerFast:
    """The word-level tokenizer over `words` (default: the shapes vocabulary)."""
    vocab = {word: i for i, word in enumerate(words or shapes_vocabulary())}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=max_length,
    )


def word_clip_config(
    vocab_size: int, hidden: int, layers: int, max_length: int = MODEL_MAX_LENGTH, projection_dim: int | None = None
):
    """The config of a small CLIP text encoder over a word-level vocabulary whose first ids are SPECIAL_TOKENS (4
    heads, a feed-forward twice the width, GELU); `projection_dim` for a CLIPTextModelWithProjection."""
    from transformers import CLIPTextConfig

    extra = {} if projection_dim is None else {"projection_dim": projection_dim}
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=max_length,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        bos_token_id=SPECIAL_TOKENS.index("<bos>"),
        eos_token_id=SPECIAL_TOKENS.index("<eos>"),
        **extra,
    )
