"""Real-reward adapters on tiny random-weight instances of the same architectures, saved to local folders:
contract (scores [B]), batch independence, gradients to the pixels, and one clear error for a missing folder."""

import pytest
import torch
from tiny_reward_models import save_tiny_clip
from transformers import BlipConfig, BlipForImageTextRetrieval, CLIPImageProcessor

from flowrl.errors import UserError
from flowrl.rewards import build_reward
from flowrl.rewards.learned_real import ScoreMLP
from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS, build_tokenizer, shapes_vocabulary

PROMPTS = ["a red circle", "two squares", "a blue triangle"]
VOCAB = len(shapes_vocabulary())


def _save_blip(folder):
    torch.manual_seed(0)
    config = BlipConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=40,
            encoder_hidden_size=32,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=SPECIAL_TOKENS.index("<eos>"),
            sep_token_id=SPECIAL_TOKENS.index("<eos>"),
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=24,
    )
    BlipForImageTextRetrieval(config).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)


def _save_mlp(folder, dim):
    torch.manual_seed(1)
    torch.save(ScoreMLP(dim).state_dict(), folder / "mlp.pth")


@pytest.fixture(scope="module")
def reward_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewards")
    save_tiny_clip(root / "clip_model")
    (root / "aesthetic").mkdir()
    save_tiny_clip(root / "aesthetic" / "clip")
    _save_mlp(root / "aesthetic", 24)
    (root / "imagereward").mkdir()
    _save_blip(root / "imagereward" / "blip")
    _save_mlp(root / "imagereward", 32)
    return {
        "pickscore": root / "clip_model",
        "clipscore": root / "clip_model",
        "hpsv2": root / "clip_model",
        "aesthetic": root / "aesthetic",
        "imagereward": root / "imagereward",
    }


@pytest.mark.parametrize("name", ["pickscore", "clipscore", "hpsv2", "aesthetic", "imagereward"])
def test_real_reward_contract_and_gradients(name, reward_folders):
    reward = build_reward(name, path=str(reward_folders[name]))
    assert reward.differentiable
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = reward(images, PROMPTS)
    assert out.scores.shape == (3,) and torch.isfinite(out.scores).all()
    single = reward(images[1:2].detach(), PROMPTS[1:2]).scores  # a sample's score does not depend on its batch
    torch.testing.assert_close(single, out.scores[1:2].detach(), atol=1e-4, rtol=1e-4)
    # CLIPScore clips negative cosines to 0 (as random weights give); its gradient is checked on the cosine
    target = (
        (lambda f: (f[0] * f[1]).sum())(reward.features(images, PROMPTS)) if name == "clipscore" else out.scores.sum()
    )
    target.backward()
    assert images.grad is not None and images.grad.abs().sum() > 0


def test_clipscore_is_two_and_a_half_times_the_clipped_cosine(reward_folders):
    reward = build_reward("clipscore", path=str(reward_folders["clipscore"]))
    out = reward(torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(3)), PROMPTS)
    torch.testing.assert_close(out.scores, 2.5 * out.info["cosine"].clamp(min=0))


@pytest.mark.parametrize("name", ["pickscore", "hpsv2", "aesthetic", "imagereward", "clipscore"])
def test_missing_weights_get_one_clear_message(name, tmp_path):
    with pytest.raises(UserError, match=f"reward {name}: params.path {tmp_path / 'nowhere'} does not exist"):
        build_reward(name, path=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("name", ["pickscore", "hpsv2", "imagereward"])
def test_a_reward_folder_without_its_tokenizer_is_one_clear_error(name, reward_folders, tmp_path):
    """transformers makes an empty tokenizer of a folder without tokenizer files: every prompt would encode alike and
    the reward would score the image alone, silently."""
    import shutil

    source = reward_folders[name]
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    model_folder = folder / "blip" if name == "imagereward" else folder
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model_folder / file).unlink(missing_ok=True)
    with pytest.raises(UserError, match=rf"reward {name}: .*tokenizer has \d+ tokens for a text model of {VOCAB}"):
        build_reward(name, path=str(folder))


@pytest.mark.parametrize("height, width", [(240, 416), (640, 480), (224, 224)])
def test_hps_inputs_are_letterboxed_as_hpsv2s_own_transform(height, width):
    """HPSv2 scores with open_clip's longest-side transform (resize_longest_max; open_clip 3's resize_mode
    "longest"): the whole image, padded with black, where PickScore's processor crops the centre."""
    import numpy as np
    import open_clip
    from PIL import Image

    from flowrl.rewards.clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, clip_pixels

    coarse = torch.rand(1, 3, height // 8, width // 8, generator=torch.Generator().manual_seed(0))
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    pixels = (smooth * 255).round().byte()
    transform = open_clip.image_transform(224, is_train=False, resize_mode="longest")
    theirs = transform(Image.fromarray(np.ascontiguousarray(pixels[0].permute(1, 2, 0).numpy())))[None]
    ours = clip_pixels(pixels.float() / 255, 224, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, fit="pad")
    assert ours.shape == theirs.shape == (1, 3, 224, 224)
    assert (ours - theirs).abs().mean() < 0.01 and (ours - theirs).abs().max() < 0.03  # measured 0.003, 0.015


@pytest.mark.parametrize("height, width", [(240, 416), (640, 480), (1024, 1024)])
def test_clip_inputs_are_made_as_clips_image_processor_makes_them(height, width):
    """PickScore, CLIPScore, HPS and the safety checker see what CLIPImageProcessor gives them (the shorter side
    shrunk with PIL's antialiased bicubic, the centre cropped), from torch so gradients flow: a wide Wan frame is
    cropped, not squashed, and a large square image is not aliased. Measured: mean 0.004 apart in normalised units
    (PIL rounds to uint8 between resize and normalise); squashing without antialiasing was 0.77 (wide) and 0.047
    (1024 square) apart."""
    import numpy as np
    from PIL import Image

    from flowrl.rewards.clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, clip_pixels

    coarse = torch.rand(1, 3, height // 8, width // 8, generator=torch.Generator().manual_seed(0))
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    pixels = (smooth * 255).round().byte()
    processor = CLIPImageProcessor(
        size={"shortest_edge": 224},
        crop_size={"height": 224, "width": 224},
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
    )
    theirs = processor(
        images=[Image.fromarray(np.ascontiguousarray(pixels[0].permute(1, 2, 0).numpy()))], return_tensors="pt"
    ).pixel_values
    ours = clip_pixels(pixels.float() / 255, 224, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)
    assert ours.shape == theirs.shape == (1, 3, 224, 224)
    assert (ours - theirs).abs().mean() < 0.01 and (ours - theirs).abs().max() < 0.05
