"""The moving-shapes world as a task: its prompt splits, the video verifier's per-tag accuracy, rendered (clip,
prompt) pairs as pretraining data, and the defaults of the embedded shapes-wan pipeline."""

from __future__ import annotations

import numpy as np

from flowrl.tasks.base import TASKS, Condition, GrammarTask
from flowrl.worlds.moving_shapes.prompts import eval_prompt_set, parse_prompt, train_prompt_set
from flowrl.worlds.moving_shapes.verifier import video_accuracy

MOVING_SHAPES_DEFAULTS = {
    "pipeline": {"path": "pipelines/shapes-wan", "height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 16},
    "reward": [{"name": "moving_shapes", "weight": 1.0, "params": {"dense": True}}],
    "prompts": {"source": "train"},
    "eval": {"prompts": "eval"},
}


@TASKS.register("moving_shapes")
class MovingShapesTask(GrammarTask):
    name = "moving_shapes"
    metric_name = "video verifier accuracy"
    defaults = MOVING_SHAPES_DEFAULTS
    train_prompts, eval_prompts, parse = (
        staticmethod(train_prompt_set),
        staticmethod(eval_prompt_set),
        staticmethod(parse_prompt),
    )

    @classmethod
    def commands(cls):
        return COMMANDS

    def evaluate(self, samples, items: list[Condition]) -> dict:
        return video_accuracy(samples.to_uint8(), [c.prompt for c in items])

    def data_batch(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        from flowrl.worlds.moving_shapes.world import sample_pairs

        return sample_pairs(count, rng)


def pretrain_shapes_wan(args) -> None:
    """`flowrl pretrain shapes-wan`: the embedded video pipeline (--vae-steps, --flow-steps, --card-only are the
    shapes recipes' flags, shared)."""
    import json

    from flowrl.worlds.moving_shapes.card_wan import evaluate_and_write_card
    from flowrl.worlds.moving_shapes.pretrain_wan import WanPretrainConfig
    from flowrl.worlds.moving_shapes.pretrain_wan import pretrain_shapes_wan as train
    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline

    cfg = WanPretrainConfig(seed=args.seed)
    for name in ("vae_steps", "flow_steps"):
        if getattr(args, name, None) is not None:
            setattr(cfg, name, getattr(args, name))
    if not getattr(args, "card_only", False):
        from flowrl.pretrain_progress import recipe_progress

        pipe, facts = train(cfg, progress=recipe_progress(args, "shapes-wan", cfg))
        save_pipeline(pipe, args.out, facts)
    print(json.dumps(evaluate_and_write_card(args.out), indent=2))


def pretrain_motion_qa(args) -> None:
    """`flowrl pretrain motion-qa`: the question scorer TVRL takes credit from (--steps as the scorer's)."""
    import json

    from flowrl.worlds.moving_shapes.model_qa import save_model
    from flowrl.worlds.moving_shapes.pretrain_qa import MotionQAPretrainConfig
    from flowrl.worlds.moving_shapes.pretrain_qa import pretrain_motion_qa as train

    cfg = MotionQAPretrainConfig(seed=args.seed)
    if getattr(args, "steps", None) is not None:
        cfg.steps = args.steps
    model, tokenizer, facts = train(cfg)
    save_model(model, tokenizer, args.out, facts)
    print(json.dumps(facts, indent=2))


def _commands():
    from flowrl.cli import TaskCommands

    return TaskCommands(
        pretrain={"shapes-wan": pretrain_shapes_wan, "motion-qa": pretrain_motion_qa},
        card_only=("shapes-wan",),
        pretrain_out={"shapes-wan": "pipelines/shapes-wan", "motion-qa": "pipelines/shapes-motion-qa"},
        pretrain_help="shapes-wan -> pipelines/shapes-wan (text-to-video, WanPipeline); motion-qa -> "
        "pipelines/shapes-motion-qa (the question scorer TVRL credits from)",
    )


COMMANDS = _commands()
