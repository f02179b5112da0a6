"""Distances between samples: how far a tuned model moved from its base, and how varied its samples are.

Pixel distances are root-mean-square differences of images in [0, 1] (so 0 = identical, ~0.5 = unrelated).
"""

from __future__ import annotations

import numpy as np


def _unit(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float64) / 255.0 if images.dtype == np.uint8 else images.astype(np.float64)


def paired_pixel_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over pairs of the RMS pixel difference between a[i] and b[i] (e.g. same-seed base and tuned samples)."""
    a, b = _unit(a), _unit(b)
    return float(np.sqrt(((a - b) ** 2).reshape(len(a), -1).mean(1)).mean())


def within_prompt_pixel_distance(images: np.ndarray, num_per_prompt: int) -> float:
    """Mean RMS pixel difference over all pairs of samples of the same prompt (images grouped consecutively)."""
    x = _unit(images).reshape(-1, num_per_prompt, images[0].size)
    total, count = 0.0, 0
    for i in range(num_per_prompt):
        for j in range(i + 1, num_per_prompt):
            total += np.sqrt(((x[:, i] - x[:, j]) ** 2).mean(1)).sum()
            count += len(x)
    return float(total / max(count, 1))


def feature_distance(features: np.ndarray, num_per_prompt: int) -> float:
    """Mean cosine distance (1 - cos) over all pairs of the same prompt's samples, on feature vectors [N, D]."""
    f = features / np.linalg.norm(features, axis=1, keepdims=True).clip(min=1e-12)
    f = f.reshape(-1, num_per_prompt, f.shape[-1])
    sims = np.einsum("gid,gjd->gij", f, f)
    upper = np.triu_indices(num_per_prompt, 1)
    return float((1 - sims[:, upper[0], upper[1]]).mean())


def vendi_score(features: np.ndarray) -> float:
    """Vendi score (Friedman & Dieng, arXiv 2210.02410) of one set [n, D] under the cosine kernel: the exponential
    of the entropy of the eigenvalues of K / n; 1 for identical samples, n for orthogonal ones."""
    f = features / np.linalg.norm(features, axis=1, keepdims=True).clip(min=1e-12)
    eigenvalues = np.linalg.eigvalsh(f @ f.T / len(f)).clip(min=0)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    return float(np.exp(-(eigenvalues * np.log(eigenvalues)).sum()))


def mean_vendi(features: np.ndarray, num_per_prompt: int) -> float:
    """Vendi score of each prompt's samples, averaged over prompts."""
    groups = features.reshape(-1, num_per_prompt, features.shape[-1])
    return float(np.mean([vendi_score(g) for g in groups]))


def free_attribute_spread(images: np.ndarray, prompts: list[str], num_per_prompt: int) -> dict:
    """How varied the attributes a prompt leaves open are, in the shapes world.

    colour_entropy: for phrases without a colour, the entropy (bits; 2 = all four colours equally) of the colour
    of the first detected object of that shape across the prompt's samples. position_spread: for prompts without a
    relation, the standard deviation of that object's centroid (in image widths, averaged over x and y).
    Prompts whose samples show no such object are skipped; counts say how many prompts entered each mean.
    """
    from flowrl.worlds.shapes import parse_prompt
    from flowrl.worlds.shapes.verifier import detect
    from flowrl.worlds.shapes.world import IMAGE_SIZE

    entropies, spreads = [], []
    for start in range(0, len(images), num_per_prompt):
        spec = parse_prompt(prompts[start])
        found = [detect(image) for image in images[start : start + num_per_prompt]]
        for phrase in spec.phrases:
            firsts = [next((d for d in objects if d.shape == phrase.shape), None) for objects in found]
            firsts = [d for d in firsts if d is not None]
            if len(firsts) < 2:
                continue
            if phrase.color is None:
                _, counts = np.unique([d.color for d in firsts], return_counts=True)
                p = counts / counts.sum()
                entropies.append(float(-(p * np.log2(p)).sum()))
            if spec.relation is None:
                centres = np.array([[d.cx, d.cy] for d in firsts]) / IMAGE_SIZE
                spreads.append(float(centres.std(axis=0).mean()))
    return {
        "colour_entropy": float(np.mean(entropies)) if entropies else float("nan"),
        "colour_prompts": len(entropies),
        "position_spread": float(np.mean(spreads)) if spreads else float("nan"),
        "position_prompts": len(spreads),
    }


def evaluate_diversity_dir(folder) -> dict:
    """Within-prompt diversity of a `flowrl sample` folder (k >= 2 images per prompt), written to
    DIR/diversity_eval.json: pixel distance, the learned scorer's feature distance and Vendi score, and the spread
    of the attributes each prompt leaves open (NaN where no prompt leaves it open: null in the JSON)."""
    from pathlib import Path

    import torch

    from flowrl.errors import UserError
    from flowrl.images import to_unit
    from flowrl.report import save_json
    from flowrl.rewards import build_reward
    from flowrl.worlds.shapes.evaluation import read_samples_dir

    images, prompts = read_samples_dir(folder)
    order = sorted(range(len(prompts)), key=lambda i: (prompts.index(prompts[i]), i))  # group by prompt, stable
    images, prompts = images[order], [prompts[i] for i in order]
    counts = {p: prompts.count(p) for p in prompts}
    k = min(counts.values())
    if k < 2 or len(set(counts.values())) != 1:
        raise UserError(
            f"{folder}: diversity needs the same number (>= 2) of samples per prompt; "
            f"found {sorted(set(counts.values()))}"
            " (use `flowrl sample --num-per-prompt K`)"
        )
    scorer = build_reward("shapes_clip")
    with torch.no_grad():
        features = scorer.image_embeddings(to_unit(images)).numpy()
    result = {
        "samples_per_prompt": k,
        "prompts": len(counts),
        "pixel_distance": within_prompt_pixel_distance(images, k),
        "feature_distance": feature_distance(features, k),
        "vendi": mean_vendi(features, k),
        **free_attribute_spread(images, prompts, k),
    }
    save_json(Path(folder) / "diversity_eval.json", result)
    return result
