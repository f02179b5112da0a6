"""A plug-in package outside flowrl, as a user would write one: a reward, an algorithm and a task, used from YAML
by dotted path (toy_plugin:Name). The test in test_plugins.py trains with all three."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowrl.algorithms import Algorithm, WorkItems
from flowrl.algorithms.advantages import group_advantages
from flowrl.rewards import Reward, RewardOutput
from flowrl.tasks import Condition, ConditionSet, Task
from flowrl.tasks.base import tag_metrics


class Redness(Reward):
    """Mean red minus mean green of each sample."""

    name = "redness"

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, samples, prompts, meta=None):
        assert meta is not None and len(meta["conditions"]) == len(prompts)  # conditions reach the reward
        return RewardOutput(self.scale * (samples[:, 0].flatten(1).mean(1) - samples[:, 1].flatten(1).mean(1)))


@dataclass
class ReinforceParams:
    adv_clip_max: float = 5.0


class Reinforce(Algorithm):
    """Plain REINFORCE on every stochastic step: loss = -A log pi(x_{j+1} | x_j)."""

    name = "reinforce"
    Params = ReinforceParams

    def prepare(self, batch, policy):
        self.advantages = group_advantages(
            batch.global_rewards, batch.global_group_ids, "group", clip=self.params.adv_clip_max
        )[batch.local_index]
        steps = torch.nonzero(batch.trajectory.stochastic).flatten().tolist()
        samples = [i for i in range(len(batch.rewards)) for _ in steps]
        return WorkItems.build(samples, steps * len(batch.rewards)), {}

    def loss(self, policy, batch, items):
        traj = batch.trajectory
        _, _, _, log_prob, _ = policy.step(
            traj.kind,
            traj.latents[items.step, items.sample],
            traj.sigmas[items.step],
            traj.sigmas[items.step + 1],
            traj.cond.select(items.sample),
            traj.guidance_scale,
            traj.noise_level,
            prev_sample=traj.latents[items.step + 1, items.sample],
        )
        return -self.advantages[items.sample].to(log_prob.device) * log_prob, {"log_prob": log_prob.detach()}


class Colours(Task):
    """Prompts naming a colour; the evaluation is the share of samples whose mean colour is that colour."""

    name = "colours"
    metric_name = "dominant colour"
    set_names = ("train", "eval")
    defaults = {"reward": [{"name": "toy_plugin:Redness"}]}
    COLOURS = {"red": 0, "green": 1, "blue": 2}

    def condition_set(self, name):
        items = [Condition(f"a {c} square", meta={"tag": c}) for c in self.COLOURS]
        return ConditionSet(items if name == "train" else items[:2])

    def evaluate(self, samples, conditions):
        means = samples.tensor.flatten(2).mean(2)  # [B, 3]
        hits = [float(means[i].argmax() == self.COLOURS[c.meta["tag"]]) for i, c in enumerate(conditions)]
        return tag_metrics(hits, [c.meta["tag"] for c in conditions])
