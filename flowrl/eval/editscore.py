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

from flowrl.errors import UserError

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


def build_editscore(
    model: str | None = None,
    lora: str | None = None,
    url: str | None = None,
    api_model: str | None = None,
    key: str | None = None,
    seed: int = 42,
    num_pass: int = 1,
    temperature: float = 0.7,
    score_range: int = 25,
):
    """The package's EditScore on a local Qwen2.5-VL folder (`model`, `lora`) or an endpoint (`url`, `api_model`)."""
    try:
        from editscore import EditScore
    except ImportError:
        raise UserError(
            "eval editscore: the editscore package is not installed; pip install editscore "
            "qwen-vl-utils json-repair (or pip install -e '.[edit]')"
        ) from None
    common = {"seed": seed, "num_pass": num_pass, "temperature": temperature, "score_range": score_range}
    if url is not None:
        if not api_model:
            raise UserError("eval editscore: --editscore-url needs --editscore-model-name (the served model's name)")
        return EditScore(backbone="openai", openai_url=url, key=key or "EMPTY", model_name_or_path=api_model, **common)
    if model is None:
        raise UserError(
            "eval editscore: expected --editscore-model DIR (a local Qwen2.5-VL folder) or "
            "--editscore-url URL (an OpenAI-compatible endpoint)"
        )
    for flag, folder, marker, kind in (
        ("--editscore-model", model, "config.json", "a Qwen2.5-VL folder"),
        ("--editscore-lora", lora, "adapter_config.json", "a LoRA folder"),
    ):
        if folder is not None and not (Path(folder) / marker).is_file():
            raise UserError(f"{flag} {folder}: expected {kind} with {marker}")
    scorer = EditScore(backbone="qwen25vl", model_name_or_path=str(model), lora_path=lora, **common)
    prepare = scorer.model.prepare_input

    def prepare_on_device(*args, **kwargs):
        with inputs_on(scorer.model.model.device):
            return prepare(*args, **kwargs)

    scorer.model.prepare_input = prepare_on_device
    return scorer


ROWS_FILE = "editscore_rows.jsonl"  # in a samples folder: one judged edit per line, appended as judged
SETTINGS_FILE = "editscore_settings.json"  # the judge those rows come from


GUESS = "guess_if_cannot_parse"  # the package's reasoning for a random score it put in place of an unparsed answer


@contextlib.contextmanager
def counting_guesses():
    """A list that collects every random guess the package's parser makes in the block: `evaluate` averages its
    passes but returns only the last pass's reasoning, so a guess in an earlier pass would go unseen."""
    import editscore

    parse, guesses = editscore.mllm_output_to_dict, []

    def counted(*args, **kwargs):
        parsed = parse(*args, **kwargs)
        if isinstance(parsed, dict) and str(parsed.get("reasoning") or "").startswith(GUESS):
            guesses.append(parsed)
        return parsed

    editscore.mllm_output_to_dict = counted  # the name evaluate() calls
    try:
        yield guesses
    finally:
        editscore.mllm_output_to_dict = parse


def score_one(scorer, source, instruction: str, edit) -> dict:
    """One triple through `scorer.evaluate([source, edit], instruction)`: its scores, the judge's reasoning and
    how many of its answers (over every pass, semantic and quality) were the package's random guesses."""
    from PIL import Image

    pil = [Image.fromarray(np.asarray(image)) if not hasattr(image, "convert") else image for image in (source, edit)]
    with counting_guesses() as guesses:
        out = scorer.evaluate(pil, instruction)
    return {
        "instruction": instruction,
        **{k: float(out[k]) for k in SCORES},
        "SC_reasoning": str(out.get("SC_reasoning", "")),
        "PQ_reasoning": str(out.get("PQ_reasoning", "")),
        "guesses": len(guesses),
    }


def summary(rows: list[dict]) -> dict:
    """The four scores averaged over the triples, with the rows and the count of triples whose score holds a random
    guess for an unparsed answer (in any pass)."""
    unparsed = sum(r.get("guesses", GUESS in r["SC_reasoning"] + r["PQ_reasoning"]) > 0 for r in rows)
    return {
        **{k: float(np.mean([r[k] for r in rows])) for k in SCORES},
        "count": len(rows),
        "unparsed": unparsed,
        "rows": rows,
    }


def score_triples(scorer, sources: list, instructions: list[str], edits: list, progress: bool = True) -> dict:
    """Each triple scored (`score_one`), averaged over the triples (`summary`)."""
    from tqdm import tqdm

    triples = list(zip(sources, instructions, edits))
    return summary([score_one(scorer, *t) for t in tqdm(triples, desc="editscore", disable=not progress)])


def score_samples_folder(scorer, folder, settings: dict, progress: bool = True) -> dict:
    """The edits an editing pipeline wrote with `flowrl sample`, judged one at a time (one edit read from disk at a
    time) against its source (its meta "image" file, or the shapes-editing world's scene for its instruction). Each
    row is appended to ROWS_FILE as it is judged, so a rerun with the same judge `settings` judges only the edits
    not yet there (a judge can take hours over thousands of edits); another judge's rows are an error, not a mix."""
    import json

    from tqdm import tqdm

    from flowrl.images import item_image, to_uint8
    from flowrl.resumable_sampling import SETTINGS_FILE as SAMPLING_SETTINGS
    from flowrl.resumable_sampling import appending, json_lines, resume_or_start
    from flowrl.sample_io import load_samples, read_conditions, read_records

    folder = Path(folder)
    records = read_records(folder)
    items = read_conditions(folder, records)
    # the source as the editor was given it: stretched to the edit's (sample) size, or as it is where the editor
    # took it at its own aspect (`--reference-size`, in the folder's sampling settings)
    sampled = folder / SAMPLING_SETTINGS
    at_own_size = sampled.is_file() and json.loads(sampled.read_text()).get("reference_size") is not None
    rows_path = folder / ROWS_FILE
    resume_or_start(folder / SETTINGS_FILE, settings, f"delete it and {ROWS_FILE} to judge afresh", [rows_path])
    done = {(row.get("file"), row.get("instruction")): row for row in json_lines(rows_path)}
    with appending(rows_path) as out:
        for record, item in tqdm(list(zip(records, items)), desc="editscore", disable=not progress):
            key = (record["file"], item.prompt)
            if key in done:
                continue
            edit = load_samples(folder, [record]).to_uint8()[0]
            source = to_uint8(
                item_image(
                    item, "source_image", "shapes_edit", "EditScore", resize_to=None if at_own_size else edit.shape[:2]
                )[None]
            )[0]
            done[key] = {"file": record["file"], **score_one(scorer, source, item.prompt, edit)}
            out.write(json.dumps(done[key]) + "\n")
            out.flush()
    return summary([done[(record["file"], item.prompt)] for record, item in zip(records, items)])
