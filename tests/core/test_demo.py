"""The Gradio comparison demo, end to end in a real headless Chromium (Debian's chromium + chromedriver, driven by
selenium): pick an example prompt from the task, set the steps, guidance and seeds, press Generate, and see a grid
with a labelled column per model and a row per seed, each image pixel-exact with its reward under it.

Without a browser on the machine the test is skipped locally and fails in CI (CI=true), where .ci/run installs it.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from flowrl.checkpoint import save_checkpoint
from flowrl.policies import load_pipeline, policy_for

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
CHROMEDRIVER = shutil.which("chromedriver")


def _require_browser():
    missing = [name for name, found in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if not found]
    try:
        import gradio  # noqa: F401
        import selenium  # noqa: F401
    except ImportError as error:
        missing.append(error.name)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the demo test needs {missing}; .ci/run installs them")
        pytest.skip(f"no {missing} on this machine (.ci/run installs them)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lora_checkpoint(pipeline_dir, folder, gate=None, step=3):
    policy = policy_for(load_pipeline(pipeline_dir), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    adapter = {"rank": 4, "alpha": 8, "target_modules": policy.lora_targets, "active_from_sigma": gate}
    return save_checkpoint(folder / "tuned" / "checkpoints", step, policy.trainable_state_dict(), {}, None, adapter)


def test_the_demo_samples_each_lora_with_its_own_step_gate(tiny_sd3_dir, tmp_path):
    from flowrl.checkpoint import load_trained_weights
    from flowrl.demo import CheckpointSet
    from flowrl.inference import generate_samples

    gated = _lora_checkpoint(tiny_sd3_dir, tmp_path, gate=0.5, step=3)
    plain = _lora_checkpoint(tiny_sd3_dir, tmp_path, step=4)
    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    demo = CheckpointSet(policy, [str(gated), str(plain)])

    def draw(some_policy):
        return generate_samples(some_policy, ["a red circle"], num_steps=4, guidance_scale=1.0, desc=None)[0].tensor

    def image(label):
        demo.activate(label)
        return draw(policy)

    gated_image, plain_image, base_image = image("tuned/update_000003"), image("tuned/update_000004"), image("base")
    assert policy.lora_active_from_sigma is None  # the base and ungated adapters sample with no gate
    # what training and `flowrl sample` draw from the gated checkpoint: its LoRA only at sigma >= 0.5
    reference = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    load_trained_weights(reference, gated)
    assert reference.lora_active_from_sigma == 0.5
    assert torch.allclose(gated_image, draw(reference), atol=1e-5)
    assert not torch.allclose(gated_image, plain_image, atol=1e-3) and not torch.allclose(
        gated_image, base_image, atol=1e-3
    )


@pytest.fixture
def demo_url(tiny_sd3_dir, tmp_path):
    _require_browser()
    checkpoint = _lora_checkpoint(tiny_sd3_dir, tmp_path)
    (tmp_path / "tuned" / "config.yaml").write_text("task: {name: shapes}\n")  # the run's config: its task's prompts
    port = _free_port()
    scratch = tmp_path / "scratch"  # the server's temporary files
    scratch.mkdir()
    log = open(tmp_path / "demo.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowrl",
            "demo",
            "--pipeline",
            str(tiny_sd3_dir),
            "--checkpoint",
            str(checkpoint),
            "--reward",
            "shapes",
            "--port",
            str(port),
            "--steps",
            "4",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "TMPDIR": str(scratch)},
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            pytest.fail("the demo exited: " + (tmp_path / "demo.log").read_text()[-2000:])
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.terminate()
        pytest.fail("the demo did not start within 120 s: " + (tmp_path / "demo.log").read_text()[-2000:])
    yield url
    server.terminate()
    server.wait(timeout=30)
    log.close()
    # the folder the demo shows its files from goes with the server
    assert list(scratch.glob("flowrl_demo_*")) == [], (tmp_path / "demo.log").read_text()[-2000:]


def test_demo_generates_base_and_checkpoint_side_by_side_in_a_real_browser(demo_url, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        from flowrl.demo import example_prompts

        driver.get(demo_url)
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
        examples = example_prompts(str(tmp_path / "tuned" / "checkpoints" / "update_000003"), "image")
        assert len(examples) == 8 and examples[0] != "a red circle left of a blue square"  # the task's eval prompts
        example = driver.find_element(By.XPATH, f"//*[normalize-space(text())={examples[1]!r}]")
        example.click()  # an example fills the prompt box
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea").get_attribute("value") == examples[1])
        for control, value in (("#steps", "3"), ("#guidance", "2.5")):
            field = driver.find_element(By.CSS_SELECTOR, f"{control} input[type=number]")
            field.clear()
            field.send_keys(value)
        driver.find_element(By.CSS_SELECTOR, "#generate").click()
        # 2 models x 3 seeds (the default)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#comparison td img")) == 6)
        columns = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#comparison th.model")]
        assert columns == ["base", "tuned/update_000003"]
        rows = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#comparison th.seed")]
        assert rows == ["seed 0", "seed 1", "seed 2"]
        captions = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#comparison td .reward")]
        assert len(captions) == 6 and all(c.startswith("shapes: ") for c in captions)
        for image in driver.find_elements(By.CSS_SELECTOR, "#comparison td img"):
            natural, shown = (
                driver.execute_script(f"return arguments[0].{k}", image) for k in ("naturalWidth", "width")
            )
            assert natural == shown and natural % 32 == 0 and natural >= 192  # whole-factor upscale, shown 1:1
            assert driver.execute_script("return getComputedStyle(arguments[0]).imageRendering", image) == "pixelated"
        table = driver.find_element(By.ID, "scores").text  # the mean rewards, readable above the grid
        assert "base" in table and "tuned/update_000003" in table and "3 seeds" in table
        screenshot = tmp_path / "demo.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
        out = os.environ.get("FLOWRL_SCREENSHOT_DIR")
        if out:
            shutil.copy(screenshot, os.path.join(out, "demo.png"))
    finally:
        driver.quit()


def test_the_demo_shows_a_video_pipeline_as_animated_clips(tmp_path):
    """A Wan pipeline's samples come back as animated GIFs in the grid, scored by a video reward."""
    import base64
    import io
    import re

    from PIL import Image
    from tiny_pipelines import tiny_wan

    from flowrl.demo import build_demo

    def generated(demo, prompt):
        return demo.generate(prompt, 0, 1, 2, 1.0, progress=lambda *args, **kwargs: None)

    tiny_wan().save_pretrained(tmp_path / "wan")
    grid, table = generated(
        build_demo(str(tmp_path / "wan"), [], reward="moving_shapes", steps=2, size=(32, 32, 9)),
        "a red circle moving left",
    )
    (gif,) = re.findall(r"data:image/gif;base64,([^\"]+)", grid)
    with Image.open(io.BytesIO(base64.b64decode(gif))) as clip:
        assert clip.format == "GIF" and clip.n_frames == 9
    assert re.search(r'class="reward">moving_shapes: \d\.\d{3}<', grid) and "| base |" in table
    default = build_demo(str(tmp_path / "wan"), [], steps=2, size=(32, 32, 9))  # no --reward: one for any clip
    assert 'class="reward">frame_consistency: ' in generated(default, "a cat walking")[0]


@pytest.mark.parametrize("lora_first", [False, True])
def test_the_demo_shows_a_full_fine_tune_beside_a_lora(tiny_sd3_dir, tmp_path, lora_first):
    """A full fine-tune's weights keep naming their layers once a LoRA checkpoint wraps them (peft moves a wrapped
    layer's weight to base_layer.weight), in either order: each label samples as its checkpoint does alone."""
    from flowrl.checkpoint import load_trained_weights, save_checkpoint
    from flowrl.demo import CheckpointSet
    from flowrl.inference import generate_samples

    lora = _lora_checkpoint(tiny_sd3_dir, tmp_path, step=3)
    full_policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    with torch.no_grad():
        for p in full_policy.transformer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    weights = {f"{n}": p.detach().clone() for n, p in full_policy.transformer.named_parameters()}
    full = save_checkpoint(tmp_path / "full" / "checkpoints", 5, weights, {}, None)
    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    demo = CheckpointSet(policy, [str(lora), str(full)] if lora_first else [str(full), str(lora)])

    def draw(some_policy):
        return generate_samples(some_policy, ["a red circle"], num_steps=3, guidance_scale=1.0, desc=None)[0].tensor

    for checkpoint, label in [(lora, "tuned/update_000003"), (full, "full/update_000005")]:
        demo.activate(label)
        alone = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
        load_trained_weights(alone, checkpoint)
        assert torch.allclose(draw(policy), draw(alone), atol=1e-5), label
    demo.activate("base")
    assert torch.allclose(
        draw(policy), draw(policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)), atol=1e-5
    )


def test_a_checkpoint_of_another_pipeline_is_one_error_naming_it(tiny_sd3_dir, tmp_path):
    """A LoRA whose targets this pipeline lacks, or whose tensors are of other shapes, and full weights of other
    shapes: one error naming the checkpoint (they gave peft's or torch's tracebacks, some only at the first
    Generate)."""
    import json

    from safetensors.torch import load_file

    from flowrl.demo import CheckpointSet
    from flowrl.errors import UserError

    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    lora = _lora_checkpoint(tiny_sd3_dir, tmp_path)
    adapter = json.loads((lora / "adapter.json").read_text())
    elsewhere = save_checkpoint(
        tmp_path / "other" / "checkpoints",
        1,
        {"blocks.0.mlp.lora_A.default.weight": torch.zeros(4, 8)},
        {},
        None,
        {**adapter, "target_modules": ["mlp.fc_in"]},
    )
    with pytest.raises(UserError, match=f"--checkpoint {elsewhere}: its LoRA does not fit this pipeline"):
        CheckpointSet(policy, [str(elsewhere)])
    name, value = next(iter(load_file(lora / "trainable.safetensors").items()))
    resized = save_checkpoint(
        tmp_path / "resized" / "checkpoints",
        1,
        {name: torch.zeros(value.shape[0] + 1, value.shape[1])},
        {},
        None,
        adapter,
    )
    with pytest.raises(UserError, match=f"--checkpoint {resized}: its LoRA does not fit .* of another shape"):
        CheckpointSet(policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16), [str(resized)])
    weight = next(n for n, p in policy.named_trained_parameters().items() if p.ndim == 2)
    full = save_checkpoint(tmp_path / "full" / "checkpoints", 1, {weight: torch.zeros(3, 3)}, {}, None)
    with pytest.raises(UserError, match=f"--checkpoint {full}: weights do not fit this pipeline"):
        CheckpointSet(policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16), [str(full)])


def test_a_negative_seed_is_one_message(tiny_sd3_dir, tmp_path):
    from flowrl.demo import CheckpointSet, Comparison
    from flowrl.errors import UserError
    from flowrl.policies.base import SampleSpec

    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    compare = Comparison(policy, CheckpointSet(policy, []), None, 2, 1.0, SampleSpec(32, 32), tmp_path)
    with pytest.raises(UserError, match="seed: expected an integer from 0"):
        compare("a red circle", -1)
