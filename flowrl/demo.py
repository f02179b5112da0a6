"""`flowrl demo`: a Gradio page that generates one prompt with the base model and every checkpoint, for several
seeds at once: a grid with one labelled column per model and one row per seed, each sample shown pixel-exact (small
images upscaled by a whole factor, never smoothed) with its reward under it; example prompts from the run's task;
steps and guidance set on the page (3D pipelines: the first seed's meshes in gr.Model3D viewers and turntable
renders in the grid; editing pipelines: a source column first, the source uploaded or the editing world's scene).

LoRA checkpoints become named peft adapters on one network (switched per image, so memory grows by the adapters
only), each sampled with its own step gate as `flowrl sample` applies it (checkpoint.sampling_gate); full-weight
checkpoints are swapped in and out of the network's parameters.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from flowrl.errors import UserError

DISPLAY_SIZE = 192  # the shapes pipelines make 32x32 images; show them large, with crisp pixels


class CheckpointSet:
    """The base model plus checkpoints, any one of which can be made active."""

    def __init__(self, policy, checkpoints: list[str]):
        from flowrl.checkpoint import read_trained_weights

        self.policy = policy
        self.labels = ["base"]
        self.kinds: dict[str, tuple[str, object]] = {}
        self.gates: dict[str, float | None] = {}  # a LoRA's sampling gate, from its adapter.json
        params = policy.named_trained_parameters()
        for number, checkpoint in enumerate(checkpoints):
            path = Path(checkpoint)
            label = f"{path.parent.parent.name}/{path.name}" if path.parent.name == "checkpoints" else path.name
            label = label if label not in self.labels else f"{label} ({number})"
            weights = read_trained_weights(path)  # its EMA when it has one, as `flowrl sample` takes
            if not policy.extra_trained:
                policy.train_networks_named(weights, f"--checkpoint {path}")
                params = policy.named_trained_parameters()
            if any("lora_" in k for k in weights):
                self.gates[label] = self._add_adapter(path, f"ckpt{number}", weights)
                self.kinds[label] = ("lora", f"ckpt{number}")
            else:
                # (None for a weight missing here: no shape)
                unknown = [k for k in weights if getattr(full_weight(params, k), "shape", None) != weights[k].shape]
                if unknown:
                    raise UserError(
                        f"--checkpoint {path}: weights do not fit this pipeline (e.g. {unknown[0]}, "
                        "missing here or of another shape)"
                    )
                self.kinds[label] = ("full", weights)
            self.labels.append(label)
        params = policy.named_trained_parameters()  # the names once every adapter is in
        self.base_full = {
            k: full_weight(params, k).detach().clone()
            for _, (kind, w) in self.kinds.items()
            if kind == "full"
            for k in w
        }
        self.activate("base")

    def _add_adapter(self, path: Path, name: str, weights: dict) -> float | None:
        """Add the checkpoint's LoRA as adapter `name`; returns its sampling gate (None: every step)."""
        from peft import LoraConfig

        from flowrl.checkpoint import sampling_gate

        adapter_file = path / "adapter.json"
        if not adapter_file.is_file():
            raise UserError(f"--checkpoint {path}: LoRA weights without adapter.json describing the adapter")
        adapter = json.loads(adapter_file.read_text())
        unfit = f"--checkpoint {path}: its LoRA does not fit this pipeline (a checkpoint of another model?)"
        for prefix, module in self.policy.trained_modules().items():
            if prefix and not any(k.startswith(prefix) for k in weights):
                continue  # (an expert this checkpoint did not train)
            try:
                module.add_adapter(
                    LoraConfig(
                        r=adapter["rank"], lora_alpha=adapter["alpha"], target_modules=adapter["target_modules"]
                    ),
                    adapter_name=name,
                )
            except ValueError as error:  # peft: no module matches the targets (its NoMatchingPeftModuleError too)
                raise UserError(f"{unfit}: {str(error)[:200]}") from None
        params = self.policy.named_trained_parameters()
        with torch.no_grad():
            for key, value in weights.items():
                param = params.get(key.replace(".default.", f".{name}."))
                if param is None or param.shape != value.shape:
                    raise UserError(f"{unfit}: {key} is {'not here' if param is None else 'of another shape'}")
                param.data = value.to(device=param.device, dtype=torch.float32)  # fp32 over a half-precision base
        return sampling_gate(adapter)

    def activate(self, label: str) -> None:
        params = self.policy.named_trained_parameters()
        with torch.no_grad():
            for key, value in self.base_full.items():
                full_weight(params, key).copy_(value)
        self.policy.switch_adapters(False)
        self.policy.lora_active_from_sigma = self.gates.get(label)
        if label == "base":
            return
        kind, payload = self.kinds[label]
        if kind == "lora":
            for module in self.policy.trained_modules().values():
                if payload in getattr(module, "peft_config", {}):
                    module.enable_adapters()
                    module.set_adapter(payload)
        else:
            with torch.no_grad():
                for key, value in payload.items():
                    full_weight(params, key).copy_(value)


def full_weight(params: dict, key: str):
    """The parameter a full fine-tune's weight `key` names, also once a LoRA wraps its layer (peft moves a wrapped
    layer's own weight to `<layer>.base_layer.weight`); None when there is none."""
    layer, leaf = key.rsplit(".", 1) if "." in key else ("", key)
    return params.get(key, params.get(f"{layer}.base_layer.{leaf}"))


def upscale(image: np.ndarray, size: int = DISPLAY_SIZE) -> np.ndarray:
    factor = max(1, size // max(image.shape[:2]))
    return image.repeat(factor, 0).repeat(factor, 1)


# shown by default per page kind (else shapes_clip); frame_consistency scores any clip, whatever its prompt
DEFAULT_REWARD = {"3d": "silhouette_iou", "edit": "shapes_edit", "video": "frame_consistency"}
DEFAULT_PROMPT = {
    "video": "a red circle moving left",
    "3d": "a sphere on top of a cylinder",
    "edit": "make the red circle blue",
}


def example_prompts(checkpoint: str | None, kind: str, count: int = 8) -> list[str]:
    """Prompts to offer on the page: `count` from the eval set (else the first set) of the task the checkpoint's
    run trained on, spread over the set; the page kind's default prompt where no run config names a task."""
    import yaml

    from flowrl.checkpoint import run_config_file
    from flowrl.config import upgraded
    from flowrl.tasks.base import build_task

    fallback = [DEFAULT_PROMPT.get(kind, "a red circle left of a blue square")]
    config_file = run_config_file(checkpoint) if checkpoint else None
    try:
        config = upgraded(yaml.safe_load(config_file.read_text())) if config_file else {}
        task = build_task(config["task"]["name"], config["task"].get("params") or {})
        name = "eval" if "eval" in task.set_names else task.set_names[0]
        prompts = list(dict.fromkeys(item.prompt for item in task.condition_set(name).items))
    except (OSError, yaml.YAMLError, KeyError, TypeError, IndexError, UserError):
        return fallback
    if not prompts:
        return fallback
    step = max(1, len(prompts) // count)
    return prompts[::step][:count]


def data_uri(shown) -> str:
    """An image (uint8 [H, W, 3] array) as a PNG data URI, or a file (a GIF) as its own."""
    import base64
    import io

    from PIL import Image

    if isinstance(shown, np.ndarray):
        buffer = io.BytesIO()
        Image.fromarray(shown).save(buffer, format="PNG")
        payload, kind = buffer.getvalue(), "png"
    else:
        payload, kind = Path(shown).read_bytes(), Path(shown).suffix.lstrip(".").lower()
    return f"data:image/{kind};base64," + base64.b64encode(payload).decode()


def comparison_grid(rows: list[tuple[int, list[dict]]], reward: str) -> str:
    """The grid: a header of model labels, one row per (seed, entries), each cell the sample at its own pixel size
    (already upscaled by a whole factor; `image-rendering: pixelated` keeps the browser from smoothing it) and its
    reward under it."""
    import html

    labels = [e["label"] for e in rows[0][1]] if rows else []
    head = "".join(f'<th class="model">{html.escape(label)}</th>' for label in labels)
    body = []
    for seed, entries in rows:
        cells = []
        for e in entries:
            image = e["shown"]
            size = f' width="{image.shape[1]}" height="{image.shape[0]}"' if isinstance(image, np.ndarray) else ""
            caption = (
                "input"
                if e.get("input")
                else f"{html.escape(reward)}: " + ("-" if e["score"] is None else f"{e['score']:.3f}")
            )
            cells.append(
                f'<td><img src="{data_uri(image)}"{size} alt="{html.escape(e["label"])}, seed {seed}" '
                f'style="image-rendering: pixelated; display: block"><div class="reward">{caption}</div></td>'
            )
        body.append(f'<tr><th class="seed">seed {seed}</th>{"".join(cells)}</tr>')
    style = (
        "<style>#comparison table{border-collapse:collapse} #comparison td,#comparison th{padding:6px;"
        "text-align:center;vertical-align:top} #comparison .reward{font-family:monospace;margin-top:4px}</style>"
    )
    return f"{style}<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


def page_kind(policy) -> str:
    """What the page shows: "edit" for editing pipelines, else the policy's modality (image-to-video pages are
    "video", with a first-frame upload)."""
    return "edit" if policy.source_input and policy.modality == "image" else policy.modality


def edit_condition(policy, instruction: str, seed: int, source: np.ndarray | None, references=()):
    """The condition of an edit: an uploaded source (uint8 [H, W, 3]) as it is, followed by any further reference
    images (editors that take several: FLUX.2, Qwen-Image-Edit-2509 / -2511), or else the scene the editing
    pipeline's world makes for the instruction (scene seed = the page's seed), asked of it through the registry; an
    instruction outside its grammar without an upload is a UserError, and so are references without a source."""
    from flowrl.images import item_image, to_uint8
    from flowrl.tasks.base import Condition

    if references and source is None:
        raise UserError("upload the source image too: further reference images follow it")
    if source is not None:
        images = [np.ascontiguousarray(image[..., :3], np.uint8) for image in [source, *references]]
        return Condition(instruction, inputs={policy.source_input: images if references else images[0]})
    if policy.source_world is None:  # no world makes a source for it (image to video): the page needs the upload
        raise UserError(f"upload a {source_noun(policy)}: {type(policy.pipeline).__name__} starts from one")
    condition = Condition(instruction, meta={"scene_seed": int(seed)})
    try:
        image = item_image(condition, policy.source_input, policy.source_world, "the demo")
    except UserError:
        raise UserError(
            f"{instruction!r} is not an instruction of the {policy.source_world} world; upload a source "
            "image to edit with any instruction"
        ) from None
    condition.inputs[policy.source_input] = to_uint8(image[None])[0]
    return condition


def uploaded_images(files) -> list[np.ndarray]:
    """Uploaded image files (paths, or objects with a .name path, as gradio gives them) as uint8 [H, W, 3] arrays;
    a UserError naming a file that is not an image."""
    from PIL import Image, UnidentifiedImageError

    images = []
    for file in files:
        path = getattr(file, "name", file)
        try:
            with Image.open(path) as opened:
                images.append(np.asarray(opened.convert("RGB")))
        except (OSError, UnidentifiedImageError, Image.DecompressionBombError):
            raise UserError(f"{Path(path).name} is not an image file") from None
    return images


def source_noun(policy) -> str:
    """What a source-image pipeline's upload is called on its page."""
    return "first frame" if policy.modality == "video" else "source image"


class Comparison:
    """One prompt and seed through the base model and every checkpoint: (label, reward, what to show) per model.
    Images are shown upscaled, videos as GIFs, 3D shapes as turntable strips plus a GLB for gr.Model3D."""

    def __init__(
        self,
        policy,
        models: CheckpointSet,
        scorer,
        steps: int,
        guidance_scale: float,
        spec,
        folder: Path,
        precision=contextlib.nullcontext,
    ):
        self.policy, self.models, self.scorer = policy, models, scorer
        self.steps, self.guidance_scale, self.spec, self.folder = steps, guidance_scale, spec, folder
        self.precision = precision  # a new context per generation (autocast for half-precision weights)

    def __call__(
        self,
        prompt: str,
        seed: int,
        progress=None,
        source: np.ndarray | None = None,
        references=(),
        steps: int | None = None,
        guidance_scale: float | None = None,
    ) -> list[dict]:
        """Editing pipelines take the instruction as `prompt` and `source` (else the world's scene), then any
        further `references` (uint8 [H, W, 3] each); the first entries are then the source and each reference,
        unscored (`input`: True), and an uploaded source's edits go unscored too (the world's verifier needs the
        world's scene). `steps` and `guidance_scale` default to the page's."""
        from flowrl.inference import generate_samples
        from flowrl.tasks.base import Condition

        if not 0 <= seed < 2**63:  # seeds are hashed into 63-bit ones (numpy's SeedSequence takes no negatives)
            raise UserError(f"seed: expected an integer from 0 to 2**63 - 1, got {seed}")
        steps = self.steps if steps is None else int(steps)
        guidance_scale = self.guidance_scale if guidance_scale is None else float(guidance_scale)
        if steps < 1:
            raise UserError(f"steps: expected a whole number >= 1, got {steps}")

        modality = self.policy.modality
        out = []
        condition = Condition(prompt)
        if self.policy.source_input:
            condition = edit_condition(self.policy, prompt, seed, source, references)
            given = condition.inputs[self.policy.source_input]
            for number, image in enumerate(given if isinstance(given, list) else [given]):
                label = "source" if number == 0 else f"reference {number}"
                out.append({"label": label, "score": None, "shown": upscale(image), "input": True})
        for number, label in enumerate(self.models.labels):
            if progress is not None:
                progress(number / len(self.models.labels), desc=f"generating with {label}")
            self.models.activate(label)
            with self.precision():
                samples, _ = generate_samples(
                    self.policy, [condition], 1, seed, steps, guidance_scale, self.spec, desc=None
                )
            with torch.no_grad():  # the reward sees what the file would hold (uint8 for pixels), the page a preview
                decoded = samples.decoded() if modality == "3d" else torch.round(samples.decoded() * 255) / 255
                score = None
                if not (self.policy.source_world and source is not None):  # a world's verifier needs its scene
                    score = float(self.scorer(decoded, [prompt], {"conditions": [condition]}).scores[0])
            stem = f"{label.replace('/', '_')}_{seed}"
            entry = {"label": label, "score": score}
            if modality == "video":
                entry["shown"] = str(self.folder / samples.write(self.folder, stem, 0)[1])
            else:
                entry["shown"] = upscale(samples.preview()[0])
            if modality == "3d":
                entry["mesh"] = str(self.folder / samples.write(self.folder, stem, 0)[0])  # the GLB
            out.append(entry)
        self.models.activate("base")
        return out


def build_demo(
    pipeline_dir: str,
    checkpoints: list[str],
    reward: str | None = None,
    steps: int = 20,
    guidance_scale: float = 4.5,
    max_sequence_length: int | None = None,
    size: tuple = (None, None, None),
    device: str | None = None,
    weight_dtype: str | None = None,
    reward_params: dict | None = None,
    guidance_2: float | None = None,
    policy_name: str | None = None,
    policy_where: str = "--policy",
    shift: float | None = None,
    reference_size: int | None = None,
    memory=None,
    text_encoders_on_host: bool = False,
):
    """The page; `size` (height, width, frames) overrides the pipeline's default sample size where given; `reward`
    defaults to the page kind's (shapes_clip; silhouette_iou for 3D, shapes_edit for editing, frame_consistency
    for video), built with `reward_params`; `device` and `weight_dtype` as `flowrl sample` places the model
    (policies.sampling_placement); `guidance_2` is Wan2.2's low-noise CFG scale; `policy_name` overrides the
    adapter (as pipeline.policy; `policy_where` names where it came from in errors); `shift` the flow schedule's
    (as pipeline.shift); `reference_size` an editor's reference image size (as pipeline.reference_size); `memory`
    sets the placed policy's memory options (the command's flags; `text_encoders_on_host` when they offload the text
    encoders, which then never reach the device)."""
    import gradio as gr

    from flowrl.policies import load_pipeline, place_for_sampling, policy_for, sampling_placement
    from flowrl.rewards import build_reward, check_reward

    placement = sampling_placement(device, weight_dtype)
    if reward is not None:  # a wrong name or folder is said before the pipeline loads (minutes for a large one)
        check_reward(reward, reward_params or {}, "--reward")
    policy = policy_for(
        load_pipeline(pipeline_dir, placement[1]), policy_name, policy_where, max_sequence_length=max_sequence_length
    )
    policy.set_guidance_scale_2(guidance_2, "--guidance-2")
    policy.set_shift(shift, "--shift")
    policy.set_reference_size(reference_size, "--reference-size")
    models = CheckpointSet(policy, checkpoints)
    # every checkpoint's adapter, and the base weights kept aside; offloaded text encoders never reach the device
    precision = place_for_sampling(policy, placement, text_encoders_on_host)
    if memory is not None:
        memory(policy)
    modality, kind = policy.modality, page_kind(policy)
    reward = reward or DEFAULT_REWARD.get(kind, "shapes_clip")
    scorer = build_reward(reward, where="--reward", **(reward_params or {})).to(placement[0])
    scorer.bind_policy(policy)
    if modality not in scorer.modalities:
        from flowrl.errors import ConfigError

        raise ConfigError(
            f"--reward: {reward} scores {' and '.join(scorer.modalities)}, but the pipeline samples {modality}"
        )
    spec = policy.sample_spec(size[0], size[1], size[2], ("--height", "--width"))  # as `flowrl sample` sizes them
    folder = Path(tempfile.mkdtemp(prefix="flowrl_demo_"))  # GIFs and meshes are shown from files written here
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # served while the demo runs; gone when it exits
    compare = Comparison(policy, models, scorer, steps, guidance_scale, spec, folder, precision)

    examples = example_prompts(checkpoints[0] if checkpoints else None, kind)

    def run(prompt, seed, count, steps_shown, guidance, source=None, references=None, progress=gr.Progress()):
        prompt = (prompt or "").strip()
        if not prompt:
            raise gr.Error("Enter a prompt.")
        rows = []
        try:
            first, count = int(seed), int(count)
            uploads = uploaded_images(references or [])  # read once for every seed's row
            for number, row_seed in enumerate(range(first, first + count)):
                if progress is not None:
                    progress(number / count, desc=f"seed {row_seed}")
                rows.append((row_seed, compare(prompt, row_seed, None, source, uploads, steps_shown, guidance)))
        except UserError as error:
            raise gr.Error(str(error)) from None

        def mean(label):
            scores = [e["score"] for _, entries in rows for e in entries if e["label"] == label]
            return "-" if None in scores else f"{np.mean(scores):.3f}"

        table = f"| model | {reward} (mean over {count} seed{'s' * (count > 1)}) |\n|---|---|\n" + "\n".join(
            f"| {label} | {mean(label)} |" for label in models.labels
        )
        return [comparison_grid(rows, reward), table, *[e["mesh"] for e in rows[0][1] if "mesh" in e]]

    with gr.Blocks(title="flowrl: base vs tuned") as demo:
        what = "shape" if modality == "3d" else "image"
        gr.Markdown(
            f"## flowrl: base and fine-tuned side by side\nPipeline `{pipeline_dir}`: one column per model, one row "
            f"per seed; under each {what} its `{reward}` reward."
        )
        with gr.Row():
            prompt = gr.Textbox(
                label="instruction" if kind == "edit" else "prompt", value=examples[0], elem_id="prompt", scale=3
            )
            seed = gr.Number(label="first seed", value=0, precision=0, minimum=0, elem_id="seed")
            count = gr.Slider(1, 8, value=3, step=1, label="seeds", elem_id="seeds")
        with gr.Row():
            steps_shown = gr.Slider(1, max(100, steps), value=steps, step=1, label="steps", elem_id="steps")
            guidance = gr.Number(label="guidance (CFG)", value=guidance_scale, minimum=0, elem_id="guidance")
        gr.Examples([[e] for e in examples], inputs=[prompt], label="example prompts from the task")
        sources = []
        if policy.source_input:  # an uploaded source, or (left empty) the editing world's scene for the instruction
            label = (
                f"{source_noun(policy)} (empty: the {policy.source_world} world's scene, chosen by the seed)"
                if policy.source_world
                else f"{source_noun(policy)} (required)"
            )
            sources = [gr.Image(label=label, type="numpy", image_mode="RGB", height=200, elem_id="source")]
            if policy.max_references is None:  # editors that take several images: the rest, in order
                sources.append(
                    gr.File(
                        label="further reference images (in order; optional)",
                        file_count="multiple",
                        file_types=["image"],
                        elem_id="references",
                    )
                )
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        scores = gr.Markdown(elem_id="scores")
        meshes = []
        if modality == "3d":  # the first seed's base and tuned meshes side by side, each turnable
            with gr.Row():
                meshes = [
                    gr.Model3D(label=label, height=300, elem_id=f"mesh{i}") for i, label in enumerate(models.labels)
                ]
        grid = gr.HTML(elem_id="comparison")
        button.click(
            run, inputs=[prompt, seed, count, steps_shown, guidance, *sources], outputs=[grid, scores, *meshes]
        )
    demo.generate = run  # what Generate calls, for scripts and tests that skip the browser
    return demo
