"""The shapes suite: GenEval-style accuracy per tag; overall is the mean of the six tag accuracies."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flowrl.errors import UserError
from flowrl.tasks.base import tag_metrics
from flowrl.worlds.shapes import TAGS, exact_score, parse_prompt, score


def shapes_accuracy(images: np.ndarray, prompts: list[str]) -> dict:
    """{'overall': mean over tags, 'tags': {tag: accuracy}, 'counts': {tag: n}, 'stderr', 'exact'} for uint8 images
    and prompts (standard errors with the prompt as the sampling unit). 'exact' ({'overall', 'tags'}) is the same
    with the verdict that also refuses objects the prompt does not name (`exact_score`): GenEval's rule, the
    headline, lets clutter pass, and RL finds that out."""
    tags = [parse_prompt(prompt).tag for prompt in prompts]
    result = tag_metrics([score(image, prompt) for image, prompt in zip(images, prompts)], tags, TAGS, clusters=prompts)
    exact = tag_metrics([exact_score(image, prompt) for image, prompt in zip(images, prompts)], tags, TAGS)
    result["exact"] = {"overall": exact["overall"], "tags": exact["tags"]}
    return result


def read_samples_dir(folder: str | Path) -> tuple[np.ndarray, list[str]]:
    """Images (uint8 [N, H, W, 3]) and prompts of a `flowrl sample` folder (its samples.jsonl), each prompt one of
    the shapes grammar's."""
    from flowrl.sample_io import INDEX_FILE, load_samples, read_records

    records = read_records(folder)
    index = Path(folder) / INDEX_FILE
    for number, record in enumerate(records, start=1):
        if record["modality"] != "image":
            raise UserError(
                f"{index} line {number}: a {record['modality']} sample ({record['file']}); the shapes "
                "suite judges images"
            )
        if not isinstance(record.get("prompt"), str):
            raise UserError(f"{index} line {number}: expected a JSON object with 'prompt' and 'file'")
        try:
            parse_prompt(record["prompt"])
        except ValueError as error:
            raise UserError(f"{index} line {number}: {error}") from None
    return load_samples(folder, records).to_uint8(), [r["prompt"] for r in records]


def evaluate_samples_dir(folder: str | Path) -> dict:
    """Score a samples folder, write DIR/shapes_eval.json and return the result."""
    from flowrl.report import save_json

    images, prompts = read_samples_dir(folder)
    result = shapes_accuracy(images, prompts)
    save_json(Path(folder) / "shapes_eval.json", result)  # (a NaN interval as null)
    return result
