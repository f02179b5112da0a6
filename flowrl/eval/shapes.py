"""The shapes suite: GenEval-style accuracy per tag; overall is the mean of the six tag accuracies."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import UserError
from ..shapes import TAGS, exact_score, parse_prompt, score
from ..tasks.base import tag_metrics


def shapes_accuracy(images: np.ndarray, prompts: list[str]) -> dict:
    """{'overall': mean over tags, 'tags': {tag: accuracy}, 'counts': {tag: n}, 'stderr', 'exact'} for uint8 images
    and prompts (standard errors with the prompt as the sampling unit). 'exact' ({'overall', 'tags'}) is the same
    with the verdict that also refuses objects the prompt does not name (`exact_score`): GenEval's rule, the
    headline, lets clutter pass, and RL finds that out."""
    tags = [parse_prompt(prompt).tag for prompt in prompts]
    result = tag_metrics([score(image, prompt) for image, prompt in zip(images, prompts)], tags, TAGS,
                         clusters=prompts)
    exact = tag_metrics([exact_score(image, prompt) for image, prompt in zip(images, prompts)], tags, TAGS)
    result["exact"] = {"overall": exact["overall"], "tags": exact["tags"]}
    return result


def read_samples_dir(folder: str | Path) -> tuple[np.ndarray, list[str]]:
    """Images and prompts listed in DIR/samples.jsonl (one {"prompt", "seed", "file"} object per line)."""
    folder = Path(folder)
    index = folder / "samples.jsonl"
    if not index.is_file():
        raise UserError(f"{index} does not exist; expected a folder written by `flowrl sample` "
                        "(PNG files plus samples.jsonl with prompt, seed, file per line)")
    images, prompts = [], []
    for number, line in enumerate(index.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            file, prompt = folder / record["file"], record["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{index} line {number}: expected a JSON object with 'prompt' and 'file'") from None
        if not file.is_file():
            raise UserError(f"{index} line {number}: image file {file} does not exist")
        try:
            parse_prompt(prompt)
        except ValueError as error:
            raise UserError(f"{index} line {number}: {error}") from None
        images.append(np.asarray(Image.open(file).convert("RGB")))
        prompts.append(prompt)
    if not images:
        raise UserError(f"{index} lists no samples")
    return np.stack(images), prompts


def evaluate_samples_dir(folder: str | Path) -> dict:
    """Score a samples folder, write DIR/shapes_eval.json and return the result."""
    from ..report import save_json

    images, prompts = read_samples_dir(folder)
    result = shapes_accuracy(images, prompts)
    save_json(Path(folder) / "shapes_eval.json", result)  # (a NaN interval as null)
    return result
