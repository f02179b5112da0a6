"""Several reference images per sample (an editor's source, then further references): read from .jsonl prompt
files, and trained on several processes as on one when rows with different numbers of images share a step."""

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from run_helpers import assert_two_processes_train_as_one
from tiny_pipelines import tiny_flux2_klein

from flowrl.errors import UserError
from flowrl.tasks.base import read_prompt_file


def _images(folder, names, sizes=((40, 24),)):
    """Random images saved as `names` in `folder`, of `sizes` (height, width) in turn."""
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        Image.fromarray(rng.integers(0, 255, (*sizes[i % len(sizes)], 3), dtype=np.uint8)).save(folder / name)


def _edits_of_two_and_one_images(folder, sizes=((40, 24),), swapped=False):
    """A saved tiny FLUX.2 [klein] in `folder`/klein and an edits.jsonl beside it whose lines give 2 images and 1
    (`swapped`: and a third line with the first's two images the other way round)."""
    tiny_flux2_klein().save_pretrained(folder / "klein")
    _images(folder, ["a.png", "b.png", "c.png"], sizes)
    lines = [{"prompt": "a red circle", "image": ["a.png", "b.png"]}, {"prompt": "two squares", "image": "c.png"}]
    if swapped:
        lines.append({"prompt": "a blue triangle", "image": ["b.png", "a.png"]})
    prompts = folder / "edits.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder / "klein", prompts


def test_a_jsonl_line_lists_its_images_relative_to_the_file(tmp_path):
    (tmp_path / "refs").mkdir()
    _images(tmp_path / "refs", ["a.png", "b.png"])
    prompts = tmp_path / "edits.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "put the hat on the cat", "image": ["refs/a.png", "refs/b.png"]})
        + "\n"
        + json.dumps({"prompt": "make it red", "image": "refs/a.png"})
        + "\n"
    )
    two, one = read_prompt_file(prompts)
    assert two.meta["image"] == [str((tmp_path / "refs" / n).absolute()) for n in ("a.png", "b.png")]
    assert one.meta["image"] == str((tmp_path / "refs/a.png").absolute())
    from flowrl.images import item_images

    assert [tuple(i.shape) for i in item_images(two, "source_image", None, "an editor")] == [(3, 40, 24)] * 2
    prompts.write_text(json.dumps({"prompt": "p", "image": ["a.png", 3]}) + "\n")
    with pytest.raises(UserError, match=r"edits.jsonl line 1: 'image' must be a file path or a list of file paths"):
        read_prompt_file(prompts)


def test_flowrl_sample_edits_from_a_jsonl_of_image_lists(tmp_path):
    """`flowrl sample` with FLUX.2 [klein] editing (`--policy Flux2KleinEdit`) on a .jsonl whose lines give two
    images and one: every edit is written, and the index keeps each line's images."""
    from flowrl.cli import main

    klein, prompts = _edits_of_two_and_one_images(tmp_path)
    out = tmp_path / "edits"
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(klein),
                "--policy",
                "Flux2KleinEdit",
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--steps",
                "2",
                "--height",
                "32",
                "--width",
                "32",
                "--max-sequence-length",
                "16",
                "--num-per-prompt",
                "2",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red circle"] * 2 + ["two squares"] * 2
    assert records[0]["image"] == [str(tmp_path / n) for n in ("a.png", "b.png")]
    for r in records:
        assert np.asarray(Image.open(out / r["file"])).shape == (32, 32, 3)
    # the images at their own sizes, as the pipeline sizes them: other edits, recorded with the setting
    sized = tmp_path / "sized"
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(klein),
                "--policy",
                "Flux2KleinEdit",
                "--prompts",
                str(prompts),
                "--out",
                str(sized),
                "--steps",
                "2",
                "--height",
                "32",
                "--width",
                "32",
                "--max-sequence-length",
                "16",
                "--num-per-prompt",
                "2",
                "--device",
                "cpu",
                "--reference-size",
                "1024",
            ]
        )
        == 0
    )
    assert json.loads((sized / "sampling.json").read_text())["reference_size"] == 1024
    first = [json.loads(line)["file"] for line in (sized / "samples.jsonl").read_text().splitlines()][0]
    assert not np.array_equal(np.asarray(Image.open(sized / first)), np.asarray(Image.open(out / records[0]["file"])))


@pytest.mark.slow
@pytest.mark.parametrize("fsdp2", [False, True], ids=["ddp", "fsdp2"])
def test_two_processes_train_rows_with_different_image_layouts_as_one(tmp_path, fsdp2):
    """FLUX.2 [klein] editing from a .jsonl whose lines give 2 images, 1, and the 2 the other way round, of three
    sizes kept as the pipeline keeps them (pipeline.reference_size): a step whose rows mix the layouts calls the
    transformer once per layout (through its DDP wrapper, three times before one backward, with gradient
    checkpointing as the real edit configs train), and 2 gloo processes give the weights of one. Under FSDP2 a process
    with fewer layouts in a forward pass makes up the others' count with calls on one of its rows, weighted zero, so
    the processes gather the sharded denoiser equally often."""
    klein, prompts = _edits_of_two_and_one_images(tmp_path, sizes=((40, 24), (24, 40), (32, 32)), swapped=True)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "one", "out_dir": str(tmp_path / "runs"), "seed": 0},
                "task": {"name": "prompt_file"},
                "pipeline": {
                    "path": str(klein),
                    "height": 32,
                    "width": 32,
                    "max_sequence_length": 16,
                    "policy": "Flux2KleinEdit",
                    "reference_size": 1024,
                },
                "lora": {"rank": 4, "alpha": 8},
                "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 3, "guidance_scale": 2.0},
                "algorithm": {"name": "grpo", "params": {"clip_range": 1e-3}},
                "reward": [{"name": "toy_rewards:Brightness"}],  # smooth: compared value for value
                "prompts": {"source": str(prompts)},
                "train": {"updates": 1, "groups_per_update": 8, "group_size": 2, "checkpoint_every": 0},
                # SGD: this one step's weights mirror its gradients (Adam's first step would move a weight whose
                # gradient lies near Adam's eps by up to lr x its rounding / (4 eps): Adam's rounding, not the layouts)
                "optim": {"optimizer": "sgd", "lr": 1e-3, "ema_decay": 0.0},
                "memory": {  # as the real edit configs train
                    "microbatch_size": 32,
                    "mixed_precision": "no",
                    "weight_dtype": "fp32",
                    "gradient_checkpointing": True,
                },
                "runtime": {"threads": 1},
                "eval": {"enabled": False},
            }
        )
    )
    single = assert_two_processes_train_as_one(config, tmp_path / "two.safetensors", 29535 + 10 * fsdp2, fsdp2=fsdp2)
    assert all(torch.isfinite(v).all() for v in single.values())


def test_flux2_sizes_each_reference_as_the_pipeline_with_a_reference_size():
    """pipeline.reference_size 1024 (the pipeline's own): images of other sizes and aspect ratios keep them (cropped
    to whole patches) where the sample size would have squashed them, and a batch whose rows differ in their
    images' number and sizes decodes to the pipeline's own edit of each list; a smaller area shrinks an image as the
    pipeline shrinks one over 1024 x 1024 (worked out by hand below); the setting is refused where it does not
    apply."""
    from tiny_pipelines import tiny_flux_kontext, tiny_shapes_sd3

    from flowrl.errors import ConfigError
    from flowrl.policies import policy_for
    from flowrl.policies.base import SampleSpec
    from flowrl.rollout import rollout, sample_generators
    from flowrl.tasks.base import Condition

    pipe = tiny_flux2_klein()
    policy = policy_for(pipe, "Flux2KleinEdit", max_sequence_length=16)
    policy.set_reference_size(1024, "pipeline.reference_size")
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)) for size in [(64, 96), (80, 64), (98, 66)]
    ]  # (height, width); the last is off the 4-pixel grid
    lists = [images[:2], images[2:], images[1::-1]]  # two layouts of two images, and one of one
    prompts = ["a red circle", "two squares", "a blue triangle"]
    spec = SampleSpec(64, 64)
    cond = policy.encode([Condition(p, inputs={"source_image": given}) for p, given in zip(prompts, lists)], 4.0, spec)
    # in latent patches of 4 pixels a side (the tiny VAE's 2x, then 2x2 patches); 98 x 66 cropped to 96 x 64
    assert cond.tensors["reference_shapes"].tolist() == [[[16, 24], [20, 16]], [[24, 16], [0, 0]], [[20, 16], [16, 24]]]
    shape = policy.noise_shape(spec)
    noise = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0))
    ode = rollout(policy, cond, sample_generators([1, 2, 3]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    expected = torch.cat(
        [
            pipe(
                image=given,
                prompt=[p],
                guidance_scale=4.0,
                num_inference_steps=3,
                latents=noise[i : i + 1],
                output_type="pt",
                height=64,
                width=64,
                max_sequence_length=16,
            ).images
            for i, (p, given) in enumerate(zip(prompts, lists))
        ]
    )
    torch.testing.assert_close(policy.decode(ode.final), expected, atol=1e-5, rtol=1e-5)
    squashed = policy_for(pipe, "Flux2KleinEdit", max_sequence_length=16)  # every image at the sample size
    at_sample_size = rollout(
        squashed,
        squashed.encode([Condition(prompts[0], inputs={"source_image": lists[0]})], 4.0, spec),
        sample_generators([1]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise[:1],
    )
    assert (at_sample_size.final - ode.final[:1]).abs().max() > 1e-3
    # 96 x 80 over a 64 x 64 area: scale sqrt(4096 / 7680) -> 70 x 58 (int), cropped to the 4-pixel grid: 68 x 56
    policy.set_reference_size(64, "pipeline.reference_size")
    shrunk = policy.pipeline_sized(torch.rand(3, 96, 80))
    assert tuple(shrunk.shape) == (3, 68, 56) and 0 <= float(shrunk.min()) and float(shrunk.max()) <= 1
    for other, message in [
        (tiny_shapes_sd3(), "takes no input images"),
        (tiny_flux_kontext(), "takes its input image at the sample size"),
    ]:
        with pytest.raises(ConfigError, match=f"pipeline.reference_size: .*{message}"):
            policy_for(other, max_sequence_length=16).set_reference_size(512, "pipeline.reference_size")
    with pytest.raises(ConfigError, match="expected a positive number of pixels, got 0"):
        policy.set_reference_size(0, "--reference-size")
    with pytest.raises(UserError, match="'a red circle' gives an empty list of images"):
        policy.encode([Condition(prompts[0], inputs={"source_image": []})], 4.0, spec)
    # under FSDP2 (every call gathers the sharded weights on every process) a process whose pass holds fewer layouts
    # than another's calls the denoiser as often as that one, on one of its rows, and its output does not change
    calls = []
    transformer_call = policy.call_transformer
    policy.call_transformer = lambda *a, **k: calls.append(1) or transformer_call(*a, **k)
    with torch.no_grad():
        alone = policy.velocity(noise, 0.5, cond, 4.0)
        assert len(calls) == 3  # one per layout (CFG-free klein)
        policy.sharded, policy.most_calls_of_any_process = lambda: True, lambda count: count + 2
        assert torch.equal(policy.velocity(noise, 0.5, cond, 4.0), alone) and len(calls) == 3 + 5


def test_the_demo_edits_with_further_reference_images(tmp_path):
    """An editor that takes several images (FLUX.2 [klein] as Flux2KleinEdit) gets an upload for further reference
    images beside its source: the page shows the source and each reference, and the reference changes the edit;
    references without a source, or a file that is no image, are one message on the page."""
    import gradio as gr
    from demo_grid import read_grid

    from flowrl.demo import build_demo

    klein, _ = _edits_of_two_and_one_images(tmp_path)
    demo = build_demo(
        str(klein), [], steps=2, size=(32, 32, None), max_sequence_length=16, policy_name="Flux2KleinEdit"
    )
    handler = demo.generate
    source = np.asarray(Image.open(tmp_path / "a.png"))

    def edit(*references):
        html, _ = handler("put the hat on the cat", 0, 1, 2, 4.5, source, list(references), progress=lambda *a, **k: 0)
        return read_grid(html)

    with_reference = edit(str(tmp_path / "b.png"))
    assert with_reference["columns"] == ["source", "reference 1", "base"]
    alone = edit()
    assert alone["columns"] == ["source", "base"]
    assert not np.array_equal(with_reference["images"][-1], alone["images"][-1])
    with pytest.raises(gr.Error, match="upload the source image too"):
        handler("put the hat on the cat", 0, 1, 2, 4.5, None, [str(tmp_path / "b.png")], progress=lambda *a, **k: None)
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(gr.Error, match="notes.txt is not an image file"):
        edit(str(tmp_path / "notes.txt"))
