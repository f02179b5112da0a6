"""`flowrl convert-reward`: tiny random checkpoints saved in the published formats (HPSv2: an open_clip CLIP state dict
under 'state_dict'; ImageReward: BLIP's flat state dict) convert into folders the adapters load, and the converted
models compute what the originals compute (checked against open_clip and timm themselves)."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel, BlipForImageTextRetrieval, CLIPModel

from flowrl.cli import main
from flowrl.rewards import build_reward
from flowrl.rewards.learned_real import ScoreMLP
from flowrl.worlds.shapes.tokenizer import build_tokenizer, shapes_vocabulary

open_clip = pytest.importorskip("open_clip")  # the test extra installs open_clip_torch
timm = pytest.importorskip("timm")
VOCAB = len(shapes_vocabulary())
PROMPTS = ["a red circle", "two blue squares", "a green triangle"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer().save_pretrained(folder)
    return folder


def test_hpsv2_conversion_computes_what_open_clip_computes(tmp_path, tokenizer_dir):
    torch.manual_seed(0)
    # pooled at the end token: HPSv2's CLIP pools the highest id, which in its tokenizer is the end token (49407)
    original = open_clip.CLIP(
        embed_dim=16,
        vision_cfg=dict(layers=2, width=32, head_width=16, patch_size=8, image_size=32),
        text_cfg=dict(
            context_length=16,
            vocab_size=VOCAB,
            width=24,
            heads=2,
            layers=2,
            pool_type="eos",
            eos_id=build_tokenizer().eos_token_id,
        ),
    ).eval()
    src = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": original.state_dict()}, src)
    assert (
        main(
            [
                "convert-reward",
                "hpsv2",
                str(src),
                str(tmp_path / "hps"),
                "--tokenizer",
                str(tokenizer_dir),
                "--vision-head-dim",
                "16",
                "--text-head-dim",
                "12",
            ]
        )
        == 0
    )

    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    ids = build_tokenizer()(PROMPTS, padding="max_length", max_length=16, return_tensors="pt").input_ids
    converted = CLIPModel.from_pretrained(tmp_path / "hps").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            converted.get_image_features(pixel_values=(images - mean) / std).pooler_output,
            original.encode_image((images - mean) / std),
            atol=1e-5,
            rtol=1e-5,
        )
        torch.testing.assert_close(
            converted.get_text_features(input_ids=ids).pooler_output, original.encode_text(ids), atol=1e-5, rtol=1e-5
        )
        # HPSv2's score: cos(image, text) of the normalised features, per pair
        expected = (
            original.encode_image((images - mean) / std, normalize=True) * original.encode_text(ids, normalize=True)
        ).sum(-1)
        scores = build_reward("hpsv2", path=str(tmp_path / "hps"))(images, PROMPTS).scores
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def _imagereward_checkpoint(path):
    """A tiny ImageReward.pt: a timm ViT as BLIP's visual encoder, a BERT with cross-attention as its text encoder
    (BLIP's med.py keeps transformers' BERT names), the projections and the score MLP, flat as published."""
    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0, qkv_bias=True
    ).eval()
    bert = BertModel(
        BertConfig(
            vocab_size=VOCAB + 2,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            max_position_embeddings=40,
            add_cross_attention=True,
            is_decoder=True,
        ),
        add_pooling_layer=False,
    )
    state = {f"blip.visual_encoder.{k}": v for k, v in vit.state_dict().items()}
    state.update(
        {f"blip.text_encoder.{k}": v for k, v in bert.state_dict().items() if "token_type" not in k}
    )  # BLIP's BERT has no token-type embeddings
    state.update(
        {
            f"blip.{name}.{k}": v
            for name in ("vision_proj", "text_proj")
            for k, v in torch.nn.Linear(32, 24).state_dict().items()
        }
    )
    state.update({f"mlp.{k}": v for k, v in ScoreMLP(32).state_dict().items()})
    torch.save(state, path)
    return vit, state


def test_imagereward_conversion_keeps_every_tensor_and_the_vision_tower_computes_what_timm_computes(
    tmp_path, tokenizer_dir
):
    vit, state = _imagereward_checkpoint(tmp_path / "ImageReward.pt")
    assert (
        main(
            [
                "convert-reward",
                "imagereward",
                str(tmp_path / "ImageReward.pt"),
                str(tmp_path / "ir"),
                "--tokenizer",
                str(tokenizer_dir),
                "--vision-head-dim",
                "16",
                "--text-head-dim",
                "16",
            ]
        )
        == 0
    )
    blip = BlipForImageTextRetrieval.from_pretrained(tmp_path / "ir" / "blip").eval()
    converted = blip.state_dict()
    for key, value in state.items():  # every text-encoder and projection tensor landed under its own name
        if key.startswith(("blip.text_encoder.", "blip.vision_proj", "blip.text_proj")) and "position_ids" not in key:
            assert torch.equal(converted[key.removeprefix("blip.")], value), key
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(
            blip.vision_model(pixel_values=images).last_hidden_state, vit.forward_features(images), atol=1e-5, rtol=1e-5
        )
    mlp = load_file(tmp_path / "ir" / "mlp.safetensors")
    assert torch.equal(mlp["layers.0.weight"], state["mlp.layers.0.weight"])
    reward = build_reward("imagereward", path=str(tmp_path / "ir"))
    assert len(reward.tokenizer) == VOCAB + 2 and reward.tokenizer.bos_token == "[DEC]"  # BLIP's two added tokens
    pixels = torch.rand(2, 3, 32, 32, requires_grad=True)
    scores = reward(pixels, PROMPTS[:2]).scores
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    scores.sum().backward()
    assert pixels.grad.abs().sum() > 0


def test_bad_sources_get_one_clear_message_and_no_folder(tmp_path, tokenizer_dir, capsys):
    _imagereward_checkpoint(tmp_path / "ImageReward.pt")
    cases = [
        (["hpsv2", str(tmp_path / "missing.pt")], "missing.pt does not exist"),
        (["hpsv2", str(tmp_path / "ImageReward.pt")], "has no 'visual.conv1.weight'; is it an open_clip CLIP"),
    ]
    torch.save({"step": 3, "note": "not tensors"}, tmp_path / "other.pt")
    cases.append((["imagereward", str(tmp_path / "other.pt")], "holds no state dict of tensors"))
    for args, message in cases:
        assert main(["convert-reward", *args, str(tmp_path / "out"), "--tokenizer", str(tokenizer_dir)]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()  # nothing half-written
    assert (
        main(
            [
                "convert-reward",
                "imagereward",
                str(tmp_path / "ImageReward.pt"),
                str(tmp_path / "out"),
                "--tokenizer",
                str(tmp_path),
            ]
        )
        == 2
    )  # not a tokenizer folder
    assert "holds no tokenizer" in capsys.readouterr().err
