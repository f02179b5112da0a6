"""Tiny offline instances of real diffusers pipelines (configs after diffusers' own tests), built in memory.

Tokenizers are built locally (a word-level `PreTrainedTokenizerFast`), never fetched from a hub.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from flowrl.worlds.shapes.model_sd3 import ShapesSD3Size, build_pipeline
from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS, build_tokenizer, shapes_vocabulary

TINY_SHAPES = ShapesSD3Size(
    num_layers=1, num_heads=2, head_dim=16, text_hidden=32, text_layers=2, text_projection=16, vae_channels=(8, 16)
)


def tiny_shapes_sd3(seed: int = 0):
    pipe = build_pipeline(TINY_SHAPES, seed=seed)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _t5(d_model: int = 32, seed: int = 0) -> T5EncoderModel:
    torch.manual_seed(seed)
    return T5EncoderModel(
        T5Config(
            vocab_size=len(shapes_vocabulary()),
            d_model=d_model,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            dropout_rate=0.0,
            feed_forward_proj="relu",
            pad_token_id=0,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            decoder_start_token_id=0,
        )
    ).eval()


def tiny_flux(seed: int = 0, pipeline_class=None) -> FluxPipeline:
    """A tiny random FLUX pipeline (FluxPipeline, or `pipeline_class` on the same components: FluxKontextPipeline)."""
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    clip = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=1,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            pad_token_id=0,
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(shapes_vocabulary()),
            max_position_embeddings=16,
            projection_dim=32,
        )
    )
    vae = AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    pipe = (pipeline_class or FluxPipeline)(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=clip,
        tokenizer=build_tokenizer(),
        text_encoder_2=_t5(32, seed),
        tokenizer_2=build_tokenizer(),
        transformer=transformer,
        vae=vae,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_wan(seed: int = 0) -> WanPipeline:
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    pipe = WanPipeline(
        tokenizer=build_tokenizer(),
        text_encoder=_t5(32, seed),
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_wan22(seed: int = 0, boundary_ratio: float = 0.95) -> WanPipeline:
    """Wan2.2 A14B's layout at toy size: tiny_wan's components with a second (low-noise) expert `transformer_2`
    and a boundary (A14B's is 0.875; 0.95 puts a 3- or 4-step schedule on both sides at shift 7)."""
    pipe = tiny_wan(seed)
    torch.manual_seed(seed + 7)
    expert = WanTransformer3DModel(**pipe.transformer.config)
    pipe = WanPipeline(**pipe.components | {"transformer_2": expert}, boundary_ratio=boundary_ratio)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_wan22_ti2v(seed: int = 0, image_to_video: bool = False):
    """Wan2.2-TI2V-5B's layout at toy size: the pipeline's expand_timesteps (a timestep per token) and Wan2.2's VAE
    (48 latent channels, 16x spatial with a 2x2 patchify, residual blocks); a WanPipeline, or with `image_to_video`
    a WanImageToVideoPipeline (no image encoder: the frame becomes the first latent frame)."""
    from diffusers import WanImageToVideoPipeline

    base = tiny_wan(seed)
    torch.manual_seed(seed + 11)
    vae = AutoencoderKLWan(
        base_dim=4,
        decoder_base_dim=4,
        z_dim=48,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
    )
    transformer = WanTransformer3DModel(**dict(base.transformer.config, in_channels=48, out_channels=48))
    pipeline_class = WanImageToVideoPipeline if image_to_video else WanPipeline
    pipe = pipeline_class(
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        expand_timesteps=True,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_wan_i2v(seed: int = 0, two_experts: bool = False):
    """A tiny random WanImageToVideoPipeline: Wan2.1-I2V's layout (the transformer takes 16 + 4 + 16 channels and a
    CLIP image encoder's features), or with `two_experts` Wan2.2-I2V-A14B's (no image encoder; a low-noise expert
    below boundary 0.9). Sizes after diffusers' own tests."""
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    base = tiny_wan(seed)
    config = dict(base.transformer.config, in_channels=36, image_dim=None if two_experts else 4)
    torch.manual_seed(seed + 3)
    transformer = WanTransformer3DModel(**config)
    parts = dict(
        tokenizer=base.tokenizer,
        text_encoder=base.text_encoder,
        vae=base.vae,
        scheduler=base.scheduler,
        transformer=transformer,
    )
    if two_experts:
        torch.manual_seed(seed + 7)
        parts.update(transformer_2=WanTransformer3DModel(**config), boundary_ratio=0.9)
    else:
        torch.manual_seed(seed + 5)
        parts.update(
            image_encoder=CLIPVisionModel(
                CLIPVisionConfig(
                    hidden_size=4,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    image_size=32,
                    intermediate_size=16,
                    patch_size=8,
                )
            ).eval(),
            image_processor=CLIPImageProcessor(crop_size=32, size=32),
        )
    pipe = WanImageToVideoPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_VISION = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
QWEN_IMAGE_TEMPLATE = (
    "system Describe the image by detailing the color shape size texture quantity text spatial "
    "relationships of objects and background user assistant , :"
)
QWEN_EDIT_TEMPLATE = (
    "system Describe the key features of input image ( color , shape size texture objects "
    "background ), then explain how user 's text instruction should alter or modify . Generate a new "
    "that meets requirements while maintaining consistency with original where appropriate assistant "
    "Picture 1 :"
)


def qwen_text_tokenizer(
    template: str = QWEN_IMAGE_TEMPLATE, specials: list[str] = QWEN_SPECIAL, vocabulary: list[str] | None = None
):
    """A word-level tokenizer with Qwen's chat tokens that splits a Qwen pipeline's prompt template into as many tokens
    as Qwen's own tokenizer makes of it (QwenImagePipeline's: 34; the edit pipelines': 64, with "user's" and "),"
    as Qwen's BPE splits them), so the pipeline's `prompt_template_encode_start_idx` drops exactly the template; the
    template's words, then `vocabulary`'s (default: the shapes words) for the prompts."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = list(
        dict.fromkeys(
            [
                "<unk>",
                *template.split(),
                "\n",
                *(w for w in vocabulary or shapes_vocabulary() if w not in SPECIAL_TOKENS),
            ]
        )
    )
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", "removed"),  # newlines are tokens
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Split(Regex(r"'s|\),|[(),.:]"), "isolated"),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=specials[1:],
    )


def tiny_qwen_image(seed: int = 0):
    """A tiny random QwenImagePipeline with Qwen-Image's layout: a Qwen2.5-VL text encoder (tiny, random), the
    transformer's 2x2 packing, a 16-channel Wan-style VAE at 8x with Qwen-Image's latents mean / std, and the
    released scheduler config (dynamic exponential shift, terminal sigma 0.02)."""
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline(**_qwen_components(qwen_text_tokenizer(), seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_qwen_image_edit(seed: int = 0, plus: bool = False):
    """A tiny random QwenImageEditPipeline (Qwen-Image-Edit's layout), or with `plus` a QwenImageEditPlusPipeline
    whose transformer has -2511's zero_cond_t: tiny_qwen_image's components with a Qwen2.5-VL that reads images (its
    processor makes 4 image tokens of anything up to 56x56 pixels) and a tokenizer for the edit template and the
    shapes-editing words."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from flowrl.worlds.shapes_edit.model_kontext import edit_vocabulary

    tokenizer = qwen_text_tokenizer(QWEN_EDIT_TEMPLATE, QWEN_SPECIAL + QWEN_VISION, edit_vocabulary())
    images = Qwen2VLImageProcessor(
        min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    videos = Qwen2VLVideoProcessor(size={"shortest_edge": 28 * 28, "longest_edge": 56 * 56})
    processor = Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos)
    pipeline_class = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    pipe = pipeline_class(**_qwen_components(tokenizer, seed, zero_cond_t=plus), processor=processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _qwen_components(tokenizer, seed: int, zero_cond_t: bool = False) -> dict:
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
        **({"zero_cond_t": True} if zero_cond_t else {}),
    )
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    vocab = len(tokenizer)
    ids = tokenizer.get_vocab()  # the vision tokens where the tokenizer has them, else ids past its vocabulary
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            bos_token_id=0,
            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
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
        image_token_id=ids.get("<|image_pad|>", vocab),
        video_token_id=ids.get("<|video_pad|>", vocab + 1),
        vision_start_token_id=ids.get("<|vision_start|>", vocab + 2),
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        shift=1.0,
        shift_terminal=0.02,
        time_shift_type="exponential",
        use_dynamic_shifting=True,
    )
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def tiny_z_image(seed: int = 0):
    """A tiny random ZImagePipeline (Z-Image's layout, sizes after diffusers' own tests): the single-stream
    transformer with its refiners, a tiny Qwen3 text encoder (its second-to-last hidden states are the prompt
    embeddings), a word-level tokenizer with Qwen's chat template, a 16-channel FLUX-style VAE and a shifted
    schedule."""
    from diffusers import AutoencoderKL, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        qk_norm=True,
        cap_feat_dim=16,
        axes_dims=[8, 4, 4],
        axes_lens=[256, 32, 32],
    )
    with torch.no_grad():  # made with torch.empty: fixed, as diffusers' tests do
        transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=[8, 16],
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=8,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    tokenizer = _qwen_chat_tokenizer()
    text_encoder = Qwen3Model(
        Qwen3Config(
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            vocab_size=len(tokenizer),
            max_position_embeddings=512,
        )
    ).eval()
    # a static shift of 3 (as Z-Image-Turbo's scheduler), so the tests see the schedule shifted
    pipe = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_flux2_klein(seed: int = 0, distilled: bool = False):
    """A tiny random Flux2KleinPipeline (FLUX.2 [klein]'s layout, sizes after diffusers' own tests): double and
    single stream blocks with 4-D rope, a 28-layer Qwen3 (hidden size 16) so the pipeline's default layers 9 / 18 /
    27 exist, a word-level tokenizer with Qwen's chat template, and a batch-norm VAE at 2x (so a scale factor shows);
    `distilled` as klein's 4-step models (no CFG)."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    transformer, vae = _flux2_transformer_and_vae(seed, guidance_embeds=False)
    tokenizer = _qwen_chat_tokenizer()
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=28,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=8,
            vocab_size=len(tokenizer),
            max_position_embeddings=512,
        )
    ).eval()
    # dynamic shifting, as FLUX's scheduler: the step-count-dependent mu then shapes the schedule
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=distilled,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_flux2_dev(seed: int = 0):
    """A tiny random Flux2Pipeline (FLUX.2 [dev]'s layout): klein's transformer and VAE with a guidance embedding,
    and a tiny Mistral3 (a 31-layer Mistral with hidden size 16, so the pipeline's default layers 10 / 20 / 30 exist,
    and a one-layer Pixtral vision tower) read through a PixtralProcessor whose word-level tokenizer has a
    Mistral-style chat template and takes FLUX.2's whole system message as one token (so prompts fit in the tests'
    16 text tokens)."""
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from tokenizers import AddedToken, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralProcessor,
        PixtralVisionConfig,
        PreTrainedTokenizerFast,
    )
    from transformers.models.pixtral.image_processing_pixtral import PixtralImageProcessor

    transformer, vae = _flux2_transformer_and_vae(seed, guidance_embeds=True)
    specials = [
        "<unk>",
        "<s>",
        "</s>",
        "<pad>",
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[IMG]",
        "[IMG_BREAK]",
        "[IMG_END]",
    ]
    words = [w for w in shapes_vocabulary() if w not in SPECIAL_TOKENS]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(" ", "removed")
    core.add_special_tokens([AddedToken(SYSTEM_MESSAGE, normalized=False)])  # one token, matched before splitting
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=specials[4:],
    )
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT]"
        "{% for c in m['content'] %}{{ c['text'] }}{% endfor %}[/SYSTEM_PROMPT]{% else %}[INST]"
        "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}[IMG]{% endif %}"
        "{% endfor %}[/INST]{% endif %}{% endfor %}"
    )
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(), tokenizer=tokenizer, chat_template=template, patch_size=16
    )
    text = MistralConfig(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=31,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
    )
    vision = PixtralVisionConfig(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        image_size=64,
        patch_size=16,
    )
    text_encoder = Mistral3ForConditionalGeneration(
        Mistral3Config(
            text_config=text, vision_config=vision, image_token_index=tokenizer.convert_tokens_to_ids("[IMG]")
        )
    ).eval()
    pipe = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=processor,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_hunyuan_video(seed: int = 0, skyreels_i2v: bool = False):
    """A tiny random HunyuanVideoPipeline (sizes after diffusers' own tests): dual- and single-stream blocks with a
    guidance embedding, the causal 3-D VAE (8x space, 4x time), a 2-layer Llama whose word-level tokenizer splits the
    pipeline's system template into exactly its crop_start (95) tokens, so the crop leaves the prompt's own, and a
    tiny CLIP for the pooled projection; the release's shift 7. `skyreels_i2v`: a
    HunyuanSkyreelsImageToVideoPipeline, whose transformer takes the first frame's latents on the channel axis."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        HunyuanSkyreelsImageToVideoPipeline,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=8 if skyreels_i2v else 4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4),
    )
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        act_fn="silu",
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    specials = ["<unk>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    template = DEFAULT_PROMPT_TEMPLATE["template"]
    for special in specials:
        template = template.replace(special, " ")
    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", "removed"),
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Split(Regex(r"[.,:]"), "isolated"),
        ]
    )
    words = [w for w, _ in split.pre_tokenize_str(template) if w != "{}"]
    words = list(dict.fromkeys(words + [w for w in shapes_vocabulary() if w not in SPECIAL_TOKENS]))
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    core.pre_tokenizer = split
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<|end_of_text|>", additional_special_tokens=specials[2:]
    )
    text_encoder = LlamaModel(
        LlamaConfig(
            hidden_size=16,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(tokenizer),
            pad_token_id=1,
            max_position_embeddings=512,
        )
    ).eval()
    clip_tokenizer = build_tokenizer(77)
    clip = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=8,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(clip_tokenizer),
            max_position_embeddings=77,
            projection_dim=32,
            bos_token_id=clip_tokenizer.bos_token_id,
            eos_token_id=clip_tokenizer.eos_token_id,
            pad_token_id=clip_tokenizer.pad_token_id,
        )
    ).eval()
    pipeline_class = HunyuanSkyreelsImageToVideoPipeline if skyreels_i2v else HunyuanVideoPipeline
    pipe = pipeline_class(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=clip,
        tokenizer_2=clip_tokenizer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_ltx(seed: int = 0):
    """A tiny random LTXPipeline (sizes after diffusers' own tests): one transformer block, the LTX VAE with 8-channel
    blocks (4x in time and space here; the release's: 8x and 32x) and per-channel statistics, the tiny T5 with the
    shapes tokenizer, and a scheduler shifted by the video's token count (mu), as the pipeline computes it."""
    from diffusers import AutoencoderKLLTXVideo, LTXPipeline, LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=32,
    )
    vae = AutoencoderKLLTXVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False,) * 4,
        upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    with torch.no_grad():  # per-channel statistics away from the identity, so decoding tests use them
        vae.latents_mean.normal_(0, 0.3)
        vae.latents_std.uniform_(0.5, 2.0)
    pipe = LTXPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True),
        text_encoder=_t5(32, seed),
        tokenizer=build_tokenizer(),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _flux2_transformer_and_vae(seed: int, guidance_embeds: bool):
    """FLUX.2's transformer (one double and one single block, 4-D rope) and batch-norm VAE, tiny and random."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=48,
        timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4],
        guidance_embeds=guidance_embeds,
    )
    vae = AutoencoderKLFlux2(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=(4, 8),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    with torch.no_grad():  # batch-norm statistics away from the identity, so decoding tests use them
        vae.bn.running_mean.normal_(0, 0.3)
        vae.bn.running_var.uniform_(0.5, 2.0)
    return transformer, vae


def _qwen_chat_tokenizer():
    """qwen_text_tokenizer with Qwen's chat template (a user turn, then the assistant's header)."""
    tokenizer = qwen_text_tokenizer("user assistant", QWEN_SPECIAL)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tokenizer


def tiny_shapes_sd(seed: int = 0):
    """A tiny epsilon-prediction StableDiffusionPipeline (DDIM), the shapes-sd layout at toy width."""
    from flowrl.worlds.shapes.model_sd import ShapesSDSize
    from flowrl.worlds.shapes.model_sd import build_pipeline as build_sd
    from flowrl.worlds.shapes.model_sd3 import build_vae

    pipe = build_sd(
        build_vae(TINY_SHAPES, seed + 1),
        ShapesSDSize(channels=(16, 32), head_dim=8, text_hidden=32, text_layers=2),
        seed=seed,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_shapes3d(seed: int = 0, text: bool = False):
    """A tiny random image-to-3D flow pipeline (8 tokens x 4 channels, width 32, one block); with `text`, a
    text-to-3D one reading the 3D shapes world's vocabulary."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from flowrl.worlds.shapes3d.pipeline import ShapeAutoencoder, ShapeFlowTransformer, Shapes3DFlowPipeline
    from flowrl.worlds.shapes3d.prompts import vocabulary

    torch.manual_seed(seed)
    autoencoder = ShapeAutoencoder(
        num_tokens=8,
        latent_channels=4,
        width=32,
        heads=2,
        decoder_layers=1,
        fourier_bands=3,
        latents_mean=[0.1] * 4,
        latents_std=[2.0] * 4,
    )
    transformer = ShapeFlowTransformer(
        num_tokens=8, latent_channels=4, width=32, heads=2, layers=1, vocabulary=vocabulary() if text else None
    )
    with torch.no_grad():  # a non-zero output layer, so sampling moves the latents
        transformer.out.weight.normal_(0, 0.1)
    return Shapes3DFlowPipeline(autoencoder, transformer, FlowMatchEulerDiscreteScheduler(shift=1.0))


def tiny_flux_kontext(seed: int = 0):
    """A tiny random FluxKontextPipeline (the tiny FLUX components)."""
    from diffusers import FluxKontextPipeline

    return tiny_flux(seed, FluxKontextPipeline)


def random_lora_checkpoint(pipeline_dir, run_dir, update: int = 3):
    """A LoRA checkpoint (rank 4) for the pipeline in `pipeline_dir` whose adapters do something: B drawn at random
    (a fresh LoRA's B is zero); saved as run_dir/checkpoints/update_<update>, the layout the demo reads."""
    from flowrl.checkpoint import save_checkpoint
    from flowrl.policies import load_pipeline, policy_for

    tuned = policy_for(load_pipeline(pipeline_dir))
    tuned.add_lora(4, 8, tuned.lora_targets)
    with torch.no_grad():
        for name, p in tuned.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    return save_checkpoint(
        Path(run_dir) / "checkpoints",
        update,
        tuned.trainable_state_dict(),
        {},
        None,
        {"rank": 4, "alpha": 8, "target_modules": tuned.lora_targets},
    )


def rolled_out(make):
    """A LoRA policy on the tiny pipeline `make` builds and a 2-group batch of its 9-frame 32 x 32 rollouts."""
    from flowrl.algorithms import RolloutBatch
    from flowrl.policies import policy_for
    from flowrl.policies.base import SampleSpec
    from flowrl.rollout import rollout, sample_generators

    policy = policy_for(make(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    prompts = ["a red circle"] * 3 + ["a square"] * 3
    cond = policy.encode(prompts, 2.0)
    traj = rollout(
        policy, cond, sample_generators(range(6)), policy.noise_shape(SampleSpec(32, 32, 9)), 3, "flow", 0.7, 2.0
    )
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9, 0.4])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    batch = RolloutBatch(traj, rewards, groups, list(range(6)), rewards, groups, torch.arange(6), prompts)
    return policy, batch
