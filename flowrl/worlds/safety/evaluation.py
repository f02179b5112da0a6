"""`flowrl eval safety`: every steering mode and baseline side by side on the held-out safety prompts.

Per mode: the unsafe rate of each prompt set (direct, indirect, attribute-leak, benign), the safe fidelity of the
non-benign sets (the safe-RL reward: what the image keeps of the request bar the unsafe attribute, 0 for an unsafe,
blank or refused image), benign shapes accuracy (binary verifier verdict) and dense score, the share of images
on which the probe fired, and the wall time of producing the images relative to plain sampling (the cost of
monitoring and steering; reject-and-resample's checker calls count, the evaluation's own scoring does not).
All modes use the same prompts and seeds, so a mode changes an image only where it acts; the FK modes excepted:
their particles take a stochastic sampler (inference.particle_sampler: the Flow-SDE at noise level 0.7, DDIM with
eta 1 on epsilon pipelines, as `flowrl sample --fk-particles`), since resampled copies of a particle under the ODE
stay identical (FK would only choose among the starting noises), and their own seeds.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from flowrl.errors import UserError
from flowrl.inference import generate, particle_sampler
from flowrl.report import figure
from flowrl.worlds.safety.baselines import PromptFilter, filtered_generate, reject_and_resample
from flowrl.worlds.safety.concept import PROMPT_SETS, is_unsafe, safety_split
from flowrl.worlds.safety.reward import judge
from flowrl.worlds.safety.steering import SafetySteer, SteeringConfig, load_steering

MODES = (
    "base",
    "prompt_filter",
    "reject_resample",
    "monitor",
    "negative",
    "probe_gradient",
    "fk",
    "fk_negative",
    "lora",
    "safe_rl",
    "safe_rl_negative",
)
LORA_MODES = ("lora", "safe_rl", "safe_rl_negative")  # need --steer-lora
LORA_ALWAYS_ON = ("safe_rl", "safe_rl_negative")  # the safe-RL LoRA on from the first step (plain RL-tuned model)
STEERED = {
    "monitor": "none",
    "negative": "negative",
    "probe_gradient": "probe_gradient",
    "fk": "fk",
    "fk_negative": "fk_negative",
    "lora": "lora",
    "safe_rl_negative": "negative",
}


def parse_modes(text: str, lora: str | None) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UserError(f"--modes: expected a comma-separated list of {list(MODES)}, got {text!r}")
    if lora is None and set(LORA_MODES) & set(modes):
        raise UserError(
            f"--modes {' / '.join(LORA_MODES)}: expected --steer-lora CHECKPOINT (a safe-RL run's checkpoint)"
        )
    return modes


def _images_for(mode, policy, prompts, steering: SteeringConfig, probe, label, sampling: dict):
    if mode in ("base", "safe_rl"):
        return generate(policy, prompts, **sampling)
    if mode == "prompt_filter":
        return filtered_generate(policy, prompts, PromptFilter(), **sampling)
    if mode == "reject_resample":
        return reject_and_resample(policy, prompts, label, **sampling)
    steer = SafetySteer(probe, replace(steering, mode=STEERED[mode]))
    if steer.particles > 1:  # resampled copies must diverge after a resampling (see the module docstring)
        kind, noise_level = particle_sampler(policy)
        sampling = {**sampling, "kind": kind, "noise_level": noise_level}
    return generate(policy, prompts, steer=steer, **sampling)


def evaluate_safety(
    policy,
    modes: list[str],
    steering: SteeringConfig,
    num_per_prompt: int = 4,
    seed: int = 0,
    label=is_unsafe,
    prompt_sets: dict | None = None,
) -> dict:
    prompt_sets = prompt_sets or safety_split()[1]
    sampling = {"num_per_prompt": num_per_prompt, "seed": seed, "desc": None}
    probe = load_steering(policy, replace(steering, mode="none"))
    generate(policy, prompt_sets["benign"][:2], desc=None)  # warm-up, so the first timed mode pays no start-up cost
    results = {}
    for mode in modes:
        if mode in LORA_MODES:
            load_steering(policy, replace(steering, mode="lora"))  # adds the adapter, switched off
        if mode in LORA_ALWAYS_ON:
            policy.switch_adapters(True)
        sampling_seconds, row = 0.0, {}
        for name in PROMPT_SETS:
            started = time.perf_counter()
            images, records = _images_for(mode, policy, prompt_sets[name], steering, probe, label, sampling)
            sampling_seconds += time.perf_counter() - started  # scoring below is not the mode's cost
            # a refused or blacked-out image shows nothing; it is not sent to the label source (a real checker may
            # flag a black frame)
            row[f"unsafe/{name}"] = float(
                np.mean(
                    [not (r.get("refused") or r.get("blacked_out")) and label(im) for im, r in zip(images, records)]
                )
            )
            # (safe fidelity, unsafe, verdict) per image; a benign prompt's safe fidelity is its dense score
            judged = np.array([judge(im, r["prompt"]) for im, r in zip(images, records)])
            if name != "benign":  # what is kept of the request: a blank or refused image scores 0
                row[f"safe_fidelity/{name}"] = float(judged[:, 0].mean())
            fired = [r["probe_fired_at"] >= 0 for r in records if "probe_fired_at" in r]
            if fired:
                row[f"fired/{name}"] = float(np.mean(fired))
            if name == "benign":
                row["benign_accuracy"] = float(judged[:, 2].mean())
                row["benign_dense"] = float(judged[:, 0].mean())
        row["seconds"] = sampling_seconds
        if mode in LORA_ALWAYS_ON:
            policy.switch_adapters(False)
        results[mode] = row
        print(f"  {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    base = results.get("base")
    for row in results.values():
        if base is not None:
            row["time_ratio"] = row["seconds"] / base["seconds"]
            for name in ("indirect", "attribute_leak", "direct"):
                before = base[f"unsafe/{name}"]
                row[f"cut/{name}"] = 1 - row[f"unsafe/{name}"] / before if before > 0 else float("nan")
    return {
        "num_per_prompt": num_per_prompt,
        "seed": seed,
        "prompts": {k: len(v) for k, v in prompt_sets.items()},
        "steering": steering.__dict__,
        "modes": results,
    }


def markdown_table(result: dict) -> str:
    head = (
        "| mode | unsafe direct | unsafe indirect | unsafe attr-leak | cut indirect | cut attr-leak | "
        "safe fidelity (direct / indirect / attr-leak) | benign acc | benign dense | "
        "probe fired (indirect / attr-leak / benign) | time vs base |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for mode, r in result["modes"].items():

        def joined(key, names, fmt="{:.2f}"):
            return " / ".join(fmt.format(r[f"{key}/{n}"]) for n in names) if f"{key}/{names[-1]}" in r else "-"

        cells = [mode] + [f"{r[f'unsafe/{n}']:.3f}" for n in ("direct", "indirect", "attribute_leak")]
        cells += [f"{r.get(f'cut/{n}', float('nan')):.0%}" for n in ("indirect", "attribute_leak")]
        cells += [
            joined("safe_fidelity", ("direct", "indirect", "attribute_leak")),
            f"{r['benign_accuracy']:.3f}",
            f"{r['benign_dense']:.3f}",
            joined("fired", ("indirect", "attribute_leak", "benign")),
            f"{r.get('time_ratio', 1):.2f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    with figure(path, 1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]}) as (fig, (left, right)):
        modes = list(result["modes"])
        sets = ["direct", "indirect", "attribute_leak"]
        width = 0.8 / len(sets)
        x = np.arange(len(modes))
        for i, name in enumerate(sets):
            left.bar(x + i * width, [result["modes"][m][f"unsafe/{name}"] for m in modes], width, label=name)
        left.set_xticks(x + width, modes, rotation=30, ha="right")
        left.set_ylabel("unsafe rate (red triangle in image)")
        left.legend()
        right.bar(x, [result["modes"][m]["benign_accuracy"] for m in modes], color="grey")
        right.set_xticks(x, modes, rotation=45, ha="right", fontsize=8)
        right.set_ylabel("benign accuracy")


def write_safety_eval(result: dict, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "safety_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "safety_eval.md").write_text(markdown_table(result) + "\n")
    plot(result, out / "safety_eval.png")
    return out
