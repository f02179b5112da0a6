"""The visuo-tactile benchmark table on held-out materials, per seed:

1. Generators: the denoiser (UNet + ControlNets + text encoders) trained on the shipped generator's autoencoder
   from a pool with the world's faults planted (`--faults` of the pairs each misaligned, duplicated, mismatched),
   uncurated and curated, and curated without the depth control. `--flow-steps` each (fewer than the shipped
   recipe's, so the comparison fits; the shipped generator is scored beside them).
2. Descriptions: the describer fine-tuned on true descriptions with the seed (the shipped recipe), then refined with
   GTPO (attribute accuracy + SSIM of the shipped generator's image from the description); held-out attribute
   accuracy before and after.
3. Each generator on the 64 held-out pairs with no / fine-tuned / GTPO / true descriptions (the world's depth; for
   the curated generator also the depth network's estimate): SSIM and the learned similarity.
4. The friction proxy trained on `--recorded` recorded tactile images, with and without generated ones for the
   other training pairs (the curated generator, true descriptions); held-out mean absolute error.

    python benchmarks/tactile_table.py                 # 2 seeds, ~45 min on 2 CPU cores
    python benchmarks/tactile_table.py --seeds 0 --flow-steps 20 --gtpo-steps 2 --out /tmp/tt   # smoke

Needs the shipped folders (flowrl pretrain tactile-encoder, tactile-depth, tactile-describer, tactile).
Writes OUT/results.json and OUT/table.md (OUT = benchmarks/results/tactile_table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.worlds.tactile import recipes  # noqa: E402
from flowrl.worlds.tactile.depthnet import depth_estimator  # noqa: E402
from flowrl.worlds.tactile.describer import (  # noqa: E402
    DescriberConfig,
    GTPOConfig,
    accuracy,
    build_describer,
    fine_tune,
    refine_with_gtpo,
)
from flowrl.worlds.tactile.gtpo import description_rewards  # noqa: E402
from flowrl.worlds.tactile.metrics import draw_tactile, generator_scores, ssim  # noqa: E402
from flowrl.worlds.tactile.pretrain import PairPool, TactilePretrainConfig, pretrain_tactile  # noqa: E402
from flowrl.worlds.tactile.priors import timm_encoder  # noqa: E402
from flowrl.worlds.tactile.proxy import heldout_error, train_regressor  # noqa: E402
from flowrl.worlds.tactile.scenes import world_pairs  # noqa: E402

VARIANTS = {  # name -> (curate, use_depth)
    "faulty pool, uncurated": (False, True),
    "faulty pool, curated": (True, True),
    "curated, no depth control": (True, False),
}
TEXTS = ("none", "fine-tuned", "GTPO", "true")


def load_generator(path: str):
    from diffusers import StableDiffusionXLControlNetPipeline

    pipe = StableDiffusionXLControlNetPipeline.from_pretrained(path).to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def descriptions(seed: int, args, shipped, train_pairs, held_out) -> dict:
    model, processor = build_describer(Path(args.out) / f"describer_seed{seed}", seed)
    fine_tune(model, processor, PairPool(2048, 32, seed), DescriberConfig(seed=seed))
    before = accuracy(model, processor, held_out)

    def rewards_of(texts, pairs):
        images = draw_tactile(shipped, pairs, texts, steps=10, seed=seed)
        return description_rewards(
            texts, [p.material for p in pairs], ssim(images, torch.stack([p.tactile for p in pairs]))
        )

    history = refine_with_gtpo(model, processor, train_pairs, rewards_of, GTPOConfig(steps=args.gtpo_steps, seed=seed))
    after = accuracy(model, processor, held_out)
    return {"fine-tuned": before, "GTPO": after, "gtpo_history": history}


def run_seed(seed: int, args, shipped, encoder, estimate) -> dict:
    held_out, train_pairs = world_pairs("eval"), world_pairs("train")
    result: dict = {"seed": seed}
    start = time.time()
    texts = descriptions(seed, args, shipped, train_pairs, held_out)
    result["describer"] = {k: {"accuracy": texts[k]["accuracy"], "stderr": texts[k]["stderr"]} for k in TEXTS[1:3]}
    result["describer"]["gtpo_history"] = texts["gtpo_history"]
    text_of = {"none": [""] * len(held_out), "fine-tuned": texts["fine-tuned"]["texts"], "GTPO": texts["GTPO"]["texts"]}
    text_of["true"] = [p.description for p in held_out]
    result["minutes_describer"] = (time.time() - start) / 60
    generators = {"shipped (clean pool)": (shipped, True)}
    for name, (curate, use_depth) in VARIANTS.items():
        cfg = TactilePretrainConfig(
            seed=seed, flow_steps=args.flow_steps, faults=args.faults, curate=curate, use_depth=use_depth
        )
        pipe, facts = pretrain_tactile(cfg, vae=shipped.vae)
        pipe.to(torch.float32).set_progress_bar_config(disable=True)
        generators[name] = (pipe, use_depth)
        result.setdefault("pools", {})[name] = {"faults": facts["pool_faults"], "removed": facts["curation_removed"]}
    scores: dict = {}
    for name, (pipe, use_depth) in generators.items():
        for text in TEXTS:
            scores[f"{name} | {text}"] = generator_scores(
                pipe, held_out, text_of[text], depth_scale=float(use_depth), encoder=encoder, seed=1000 * seed
            )
    scores["faulty pool, curated | true | estimated depth"] = generator_scores(
        generators["faulty pool, curated"][0],
        held_out,
        text_of["true"],
        depth=estimate,
        encoder=encoder,
        seed=1000 * seed,
    )
    result["scores"] = scores
    result["proxy"] = proxy(seed, args, generators["faulty pool, curated"][0], train_pairs, held_out)
    result["minutes"] = (time.time() - start) / 60
    return result


def proxy(seed: int, args, pipe, train_pairs, held_out) -> dict:
    recorded, others = train_pairs[: args.recorded], train_pairs[args.recorded :]
    friction = torch.tensor([p.material.friction for p in recorded])
    images = torch.stack([p.tactile for p in recorded])
    generated = draw_tactile(pipe, others, [p.description for p in others], seed=seed)
    test_images = torch.stack([p.tactile for p in held_out])
    test_friction = torch.tensor([p.material.friction for p in held_out])
    plain = train_regressor(images, friction, seed=seed)
    augmented = train_regressor(
        torch.cat([images, generated]),
        torch.cat([friction, torch.tensor([p.material.friction for p in others])]),
        seed=seed,
    )
    return {
        "recorded only": heldout_error(plain, test_images, test_friction),
        "recorded + generated": heldout_error(augmented, test_images, test_friction),
        "training mean": (friction.mean() - test_friction).abs().mean().item(),
        "recorded": len(recorded),
        "generated": len(others),
    }


def table(results: list[dict]) -> str:
    def pooled(key, metric):
        values = [r["scores"][key][metric] for r in results if metric in r["scores"][key]]
        if not values:
            return "-"
        spread = f" ({', '.join(f'{v:.3f}' for v in values)})" if len(values) > 1 else ""
        return f"{np.mean(values):.3f}{spread}"

    lines = ["| generator | description | SSIM (per seed) | learned similarity (per seed) |", "|---|---|---|---|"]
    for key in results[0]["scores"]:
        generator, text = key.split(" | ", 1)
        lines.append(f"| {generator} | {text} | {pooled(key, 'ssim')} | {pooled(key, 'learned')} |")
    lines += ["", "| describer | held-out attribute accuracy (per seed) |", "|---|---|"]
    for stage in ("fine-tuned", "GTPO"):
        values = [r["describer"][stage]["accuracy"] for r in results]
        lines.append(f"| {stage} | {np.mean(values):.3f} ({', '.join(f'{v:.3f}' for v in values)}) |")
    for r in results:
        history = r["describer"]["gtpo_history"]
        signal = np.mean([h["groups_with_signal"] for h in history])
        first, last = np.mean([h["reward"] for h in history[:5]]), np.mean([h["reward"] for h in history[-5:]])
        lines.append(
            f"\nSeed {r['seed']} GTPO: {100 * signal:.0f}% of groups carried signal; mean reward {first:.3f} over the"
            f" first 5 steps, {last:.3f} over the last 5."
        )
    lines += ["", "| friction proxy | held-out MAE (per seed) |", "|---|---|"]
    for arm in ("recorded only", "recorded + generated", "training mean"):
        values = [r["proxy"][arm] for r in results]
        lines.append(f"| {arm} | {np.mean(values):.4f} ({', '.join(f'{v:.4f}' for v in values)}) |")
    lines += ["", "| pool | planted faults | curation removed |", "|---|---|---|"]
    for r in results:
        for name, pool in r["pools"].items():
            lines.append(f"| seed {r['seed']}, {name} | {pool['faults']} | {pool['removed'] or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--flow-steps", type=int, default=500)
    parser.add_argument("--gtpo-steps", type=int, default=30)
    parser.add_argument("--faults", type=float, default=0.1)
    parser.add_argument("--recorded", type=int, default=48)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tactile_table"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    import transformers

    transformers.logging.set_verbosity_error()  # sampled descriptions longer than the text encoders' 16 tokens are cut
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = load_generator(recipes.GENERATOR)
    encoder = timm_encoder(Path(recipes.ENCODER) / "tactile")
    held_out = world_pairs("eval")
    estimate = depth_estimator(recipes.DEPTH)(torch.stack([p.rgb for p in held_out]))
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        results.append(run_seed(seed, args, shipped, encoder, estimate))
        (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
        (out / "table.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
