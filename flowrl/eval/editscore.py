"""Scripted EditScore: (source, instruction, edit) triples scored by the `editscore` package's own `EditScore`.

Backbones: a local Qwen2.5-VL folder (transformers; optionally with EditScore's LoRA folder) or an OpenAI-compatible
chat-completions endpoint (a vLLM server, or OpenAI). Per triple the package asks the judge twice (semantic
consistency on source + edit with the instruction, perceptual quality on the edit), parses the answers, and
reports prompt following and consistency (SC's two sub-scores), SC = their minimum, PQ, and Overall = sqrt(SC x PQ),
all on 0-10; flowrl averages each over the triples, as EditScore-Bench averages per-sample scores.

Deliberate deviation: the package's transformers backbone moves its inputs to "cuda" unconditionally; flowrl runs
its `prepare_input` with the inputs sent to the model's own device instead (so it also runs on a CPU), nothing else
changed. When the judge's answer cannot be parsed twice, the package falls back to a random guess and says so in
the reasoning ("guess_if_cannot_parse"); flowrl counts those per run (`unparsed`) so they are never silent.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from ..errors import UserError

SCORES = ("prompt_following", "consistency", "perceptual_quality", "overall")


@contextlib.contextmanager
def inputs_on(device):
    """BatchFeature.to("cuda") sends to `device` instead while the block runs."""
    from transformers.feature_extraction_utils import BatchFeature

    original = BatchFeature.to

    def to(self, *args, **kwargs):
        return original(self, *(device if a == "cuda" else a for a in args), **kwargs)

    BatchFeature.to = to
    try:
        yield
    finally:
        BatchFeature.to = original


def build_editscore(model: str | None = None, lora: str | None = None, url: str | None = None,
                    api_model: str | None = None, key: str | None = None, seed: int = 42, num_pass: int = 1,
                    temperature: float = 0.7, score_range: int = 25):
    """The package's EditScore on a local Qwen2.5-VL folder (`model`, `lora`) or an endpoint (`url`, `api_model`)."""
    try:
        from editscore import EditScore
    except ImportError:
        raise UserError("eval editscore: the editscore package is not installed; pip install editscore "
                        "qwen-vl-utils json-repair (or pip install -e '.[edit]')") from None
    common = {"seed": seed, "num_pass": num_pass, "temperature": temperature, "score_range": score_range}
    if url is not None:
        if not api_model:
            raise UserError("eval editscore: --editscore-url needs --editscore-model-name (the served model's name)")
        return EditScore(backbone="openai", openai_url=url, key=key or "EMPTY", model_name_or_path=api_model,
                         **common)
    if model is None:
        raise UserError("eval editscore: expected --editscore-model DIR (a local Qwen2.5-VL folder) or "
                        "--editscore-url URL (an OpenAI-compatible endpoint)")
    for flag, folder, marker, kind in (("--editscore-model", model, "config.json", "a Qwen2.5-VL folder"),
                                       ("--editscore-lora", lora, "adapter_config.json", "a LoRA folder")):
        if folder is not None and not (Path(folder) / marker).is_file():
            raise UserError(f"{flag} {folder}: expected {kind} with {marker}")
    scorer = EditScore(backbone="qwen25vl", model_name_or_path=str(model), lora_path=lora, **common)
    prepare = scorer.model.prepare_input

    def prepare_on_device(*args, **kwargs):
        with inputs_on(scorer.model.model.device):
            return prepare(*args, **kwargs)

    scorer.model.prepare_input = prepare_on_device
    return scorer


def score_triples(scorer, sources: list, instructions: list[str], edits: list, progress: bool = True) -> dict:
    """Each triple through `scorer.evaluate([source, edit], instruction)`; the four scores averaged over triples,
    with the per-triple rows (scores and the judge's reasoning) and the count of unparsed answers."""
    from PIL import Image
    from tqdm import tqdm

    rows = []
    for source, instruction, edit in tqdm(list(zip(sources, instructions, edits)), desc="editscore",
                                          disable=not progress):
        pil = [Image.fromarray(np.asarray(image)) if not hasattr(image, "convert") else image for image in (source, edit)]
        out = scorer.evaluate(pil, instruction)
        rows.append({"instruction": instruction, **{k: float(out[k]) for k in SCORES},
                     "SC_reasoning": str(out.get("SC_reasoning", "")), "PQ_reasoning": str(out.get("PQ_reasoning", ""))})
    unparsed = sum("guess_if_cannot_parse" in r["SC_reasoning"] + r["PQ_reasoning"] for r in rows)
    return {**{k: float(np.mean([r[k] for r in rows])) for k in SCORES}, "count": len(rows), "unparsed": unparsed,
            "rows": rows}


def samples_triples(folder) -> tuple[list, list[str], list]:
    """(sources, instructions, edits) of a samples folder an editing pipeline wrote with `flowrl sample`: each
    record's source is its meta "image" file or the shapes-editing world's scene for its instruction."""
    from ..cli import read_conditions
    from ..images import item_image, to_uint8
    from ..samples import read_samples

    samples, records = read_samples(folder)
    items = read_conditions(folder, records)
    sources = [to_uint8(item_image(item, "source_image", "shapes_edit", "EditScore")[None])[0] for item in items]
    return sources, [item.prompt for item in items], list(samples.to_uint8())
