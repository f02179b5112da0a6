"""The shapes-editing world as a task: condition items are an instruction plus the seed of its source scene, with the
rendered source image as the per-sample input `source_image` (what an editing pipeline is conditioned on);
evaluation is the edit verifier's success per kind, with the off-target pixel change beside it."""

from __future__ import annotations

import numpy as np

from flowrl.prompt_source import text_seed
from flowrl.tasks.base import TASKS, Condition, ConditionSet, GrammarTask, tag_metrics
from flowrl.worlds.shapes.world import render
from flowrl.worlds.shapes_edit.instructions import (
    KINDS,
    eval_instruction_set,
    parse_instruction,
    scene_for,
    train_instruction_set,
    val_instruction_set,
)

TRAIN_SCENES_PER_INSTRUCTION = 2
EVAL_ITEMS_PER_KIND = 16  # kinds with few held-out instructions (remove) get more scenes per instruction
EVAL_SEED = 2024
VAL_SEED = 9024  # validation scenes: far from eval's (2024 + 1000 x kind + k) and training's (text seeds + 0 / 1)


def edit_item(instruction: str, scene_seed: int) -> Condition:
    spec, source, _ = scene_for(instruction, scene_seed)
    return Condition(
        instruction, inputs={"source_image": render(source)}, meta={"tag": spec.kind, "scene_seed": int(scene_seed)}
    )


def scene_seed_of(item: Condition) -> int:
    return int(item.meta.get("scene_seed", text_seed(item.prompt)))


def item_scene(item: Condition):
    """(spec, source objects, target objects) an item names: its instruction with its scene seed."""
    return scene_for(item.prompt, scene_seed_of(item))


@TASKS.register("shapes_edit")
class ShapesEditTask(GrammarTask):
    """Sets: `train` (every training instruction with 2 scenes, drawn kind first), `eval` (16 items per kind of
    the held-out instructions, each with its own scene) and `val` (as eval, on other held-out instructions where the
    kind has any, remove's and replace's being all in eval, and other scenes: for choosing a recipe without touching
    eval)."""

    name = "shapes_edit"
    set_names = ("train", "eval", "val")
    metric_name = "edit success"
    train_prompts, eval_prompts, parse = (
        staticmethod(train_instruction_set),
        staticmethod(eval_instruction_set),
        staticmethod(parse_instruction),
    )

    def condition_set(self, name: str) -> ConditionSet:
        if name == "train":
            by_tag = {
                kind: [
                    edit_item(text, text_seed(text) + k) for text in texts for k in range(TRAIN_SCENES_PER_INSTRUCTION)
                ]
                for kind, texts in train_instruction_set().items()
            }
            return ConditionSet([c for items in by_tag.values() for c in items], by_tag)
        if name in ("eval", "val"):
            texts, seed = (eval_instruction_set(), EVAL_SEED) if name == "eval" else (val_instruction_set(), VAL_SEED)
            items = []
            for index, kind in enumerate(KINDS):
                mine = [t for t in texts if parse_instruction(t).kind == kind]
                items += [edit_item(mine[k % len(mine)], seed + 1000 * index + k) for k in range(EVAL_ITEMS_PER_KIND)]
            return ConditionSet(items)
        return super().condition_set(name)

    def check(self, item: Condition) -> None:
        self.parse(item.prompt)
        if item.meta.get("image"):
            raise ValueError(
                f"{item.prompt!r} edits its own source image ({item.meta['image']}); the edit verifier "
                "judges edits of the world's scenes only"
            )

    def condition_image(self, item: Condition) -> np.ndarray:
        """The source image (uint8 [32, 32, 3]) of an instruction of the grammar: its scene (meta "scene_seed",
        else the instruction's own); ValueError for an instruction outside the grammar."""
        return render(item_scene(item)[1])

    def evaluate(self, samples, conditions: list[Condition]) -> dict:
        judged = judge_items(samples.to_uint8(), conditions)
        kinds = [parse_instruction(c.prompt).kind for c in conditions]
        clusters = [(c.prompt, scene_seed_of(c)) for c in conditions]
        result = tag_metrics([j.success for j in judged], kinds, KINDS, clusters=clusters)
        result["metrics"] = {
            name: tag_metrics([getattr(j, name) for j in judged], kinds, KINDS, clusters=clusters)
            for name in ("requested", "preserved", "off_target", "sc", "pq", "editscore")
        }
        return result

    @classmethod
    def commands(cls):
        from flowrl.cli import TaskCommands

        return TaskCommands(
            pretrain={"shapes-kontext": pretrain_shapes_kontext},
            card_only=("shapes-kontext",),
            pretrain_out={"shapes-kontext": "pipelines/shapes-kontext"},
            pretrain_help="shapes-kontext -> pipelines/shapes-kontext (instruction-based image editor)",
            eval_suites={"editscore": eval_editscore},
            eval_arguments=editscore_arguments,
        )


def editscore_arguments(parser) -> None:
    import os

    parser.add_argument("--editscore-model", default=None, metavar="DIR", help="editscore: a local Qwen2.5-VL folder")
    parser.add_argument("--editscore-lora", default=None, metavar="DIR", help="editscore: EditScore's LoRA folder")
    parser.add_argument(
        "--editscore-url",
        default=None,
        help="editscore: an OpenAI-compatible chat-completions URL "
        "(e.g. http://127.0.0.1:8000/v1/chat/completions) instead of a local folder",
    )
    parser.add_argument("--editscore-model-name", default=None, help="editscore: the endpoint's model name")
    parser.add_argument(
        "--editscore-key",
        default=os.environ.get("FLOWRL_EDITSCORE_KEY"),
        help="editscore: the endpoint's API key (default: $FLOWRL_EDITSCORE_KEY)",
    )
    parser.add_argument("--editscore-passes", type=int, default=1, help="editscore: judge passes averaged per edit")


def eval_editscore(args) -> None:
    """`flowrl eval editscore --samples DIR`: the editscore package's scores of an editing pipeline's samples, to
    DIR/editscore_eval.json."""
    import json
    from pathlib import Path

    from flowrl.errors import UserError
    from flowrl.eval.editscore import SCORES, build_editscore, score_samples_folder

    if args.samples is None:
        raise UserError(
            "eval editscore: expected --samples DIR (edits written by `flowrl sample` with an editing pipeline)"
        )
    if args.editscore_passes < 1:
        raise UserError(f"--editscore-passes: expected an integer >= 1, got {args.editscore_passes}")
    scorer = build_editscore(
        args.editscore_model,
        args.editscore_lora,
        args.editscore_url,
        args.editscore_model_name,
        args.editscore_key,
        num_pass=args.editscore_passes,
    )
    judge = {
        "model": args.editscore_model,
        "lora": args.editscore_lora,
        "url": args.editscore_url,
        "model_name": args.editscore_model_name,
        "passes": args.editscore_passes,
    }
    result = score_samples_folder(scorer, args.samples, judge)
    out = Path(args.samples) / "editscore_eval.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        "  ".join(f"{k} {result[k]:.3f}" for k in SCORES) + f"  ({result['count']} edits, "
        f"{result['unparsed']} judge answers unparsed)"
    )
    print(f"written to {out}")


def pretrain_shapes_kontext(args) -> None:
    """`flowrl pretrain shapes-kontext`: the embedded editor and its card (--flow-steps and --card-only are the
    shapes recipes' flags, shared)."""
    import json
    from pathlib import Path

    import torch

    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
    from flowrl.worlds.shapes_edit.pretrain_kontext import (
        DEFAULT_VAE,
        KontextPretrainConfig,
        evaluate_editor,
        write_card,
    )
    from flowrl.worlds.shapes_edit.pretrain_kontext import pretrain_shapes_kontext as train

    out = args.out
    cfg = KontextPretrainConfig(seed=args.seed)
    if getattr(args, "flow_steps", None) is not None:
        cfg.flow_steps = args.flow_steps
    if not getattr(args, "card_only", False):
        from flowrl.worlds.shapes.pretrain_sd3 import source_vae

        pipe, facts = train(cfg, vae_dir=source_vae(getattr(args, "pipeline", DEFAULT_VAE)))
        save_pipeline(pipe, out, facts)
    facts = json.loads((Path(out) / "training_facts.json").read_text())
    torch.set_num_threads(cfg.threads)
    result, images, items = evaluate_editor(out)
    write_card(out, facts, result, images, items)
    print(json.dumps({k: result[k] for k in ("overall", "tags")}, indent=2))


def judge_items(images: np.ndarray, conditions: list[Condition]) -> list:
    """The edit verifier's judgement of each edited uint8 image against its item's source and target scenes."""
    from flowrl.worlds.shapes_edit.verifier import judge_edit

    return [judge_edit(image, *item_scene(item)) for image, item in zip(images, conditions)]
