"""Toy rewards named by dotted path (`toy_rewards:Brightness`) in runs the tests start, in-process or as child
processes: mean brightness (smooth, unlike the JPEG reward, which turns last-bit differences into rounding flips), and
brightness that fails on purpose (NaN for some samples, raising for some calls, unavailable on one process, failing
on intermediate x0 predictions)."""

import torch

from flowrl.rewards import Reward, RewardOutput


class Brightness(Reward):
    """The mean pixel value of each sample."""

    name = "brightness"

    def __call__(self, samples, prompts, meta=None):
        return RewardOutput(samples.flatten(1).mean(1))


class NaNForSomeSeeds(Reward):
    """Brightness, but NaN for every sample whose seed is divisible by `modulus`."""

    name = "nan_for_some"

    def __init__(self, modulus: int = 5):
        super().__init__()
        self.modulus = modulus

    def __call__(self, samples, prompts, meta=None):
        scores = samples.flatten(1).mean(1)
        bad = torch.tensor([s % self.modulus == 0 for s in meta["seeds"]], device=scores.device)
        return RewardOutput(torch.where(bad, torch.full_like(scores, float("nan")), scores))


class RaisesOnSomeSeeds(Reward):
    """Brightness, but a call that includes a sample whose seed is divisible by 7 raises."""

    name = "raises_on_some"

    def __call__(self, samples, prompts, meta=None):
        if any(s % 7 == 0 for s in meta["seeds"]):
            raise RuntimeError("cannot score this one")
        return RewardOutput(samples.flatten(1).mean(1))


class UnavailableOnProcessOne(Reward):
    """Brightness with a scorer's own info key (as PickScore's `cosine`), unavailable on process 1 (RANK 1): there
    every sample fails, and the process's scores hold none of the scorer's keys."""

    name = "unavailable_on_one"

    def __call__(self, samples, prompts, meta=None):
        import os

        from flowrl.rewards.base import RewardUnavailable

        if os.environ.get("RANK") == "1":
            raise RewardUnavailable("the judge is down for this process")
        scores = samples.flatten(1).mean(1)
        return RewardOutput(scores, {"darkness": 1 - scores})


class NaNMidway(Reward):
    """Brightness, but NaN for the first sample of a call on intermediate x0 predictions (calls without seeds)."""

    name = "nan_midway"

    def __call__(self, samples, prompts, meta=None):
        scores = samples.flatten(1).mean(1)
        if "seeds" not in (meta or {}):
            scores = scores.clone()
            scores[0] = float("nan")
        return RewardOutput(scores)


class RaisesMidway(Reward):
    """Brightness on final samples; raises on intermediate x0 predictions (calls without seeds), as a served judge
    that went down mid-rollout would."""

    name = "raises_midway"

    def __call__(self, samples, prompts, meta=None):
        if "seeds" not in (meta or {}):
            raise RuntimeError("the judge is down")
        return RewardOutput(samples.flatten(1).mean(1))


class BrightnessForCircles(Reward):
    """Brightness for prompts that name a circle, 0.5 for every other prompt (groups of known zero spread), with a
    binary `accuracy`: brightness above `bar`."""

    name = "brightness_for_circles"

    def __init__(self, bar: float = 0.5):
        super().__init__()
        self.bar = bar

    def __call__(self, samples, prompts, meta=None):
        brightness = samples.flatten(1).mean(1)
        circle = torch.tensor(["circle" in p for p in prompts], device=brightness.device)
        return RewardOutput(
            torch.where(circle, brightness, torch.full_like(brightness, 0.5)), {"accuracy": (brightness > self.bar)}
        )


class SeedLottery(Reward):
    """A reward no policy can change: a number in [0, 1) drawn from each sample's seed alone (the seed of its
    initial noise), so it varies within a group but nothing a sampler step does moves it."""

    name = "seed_lottery"

    def __call__(self, samples, prompts, meta=None):
        drawn = [(s * 2654435761 % 2**32) / 2**32 for s in meta["seeds"]]  # Knuth's multiplicative hash
        return RewardOutput(torch.tensor(drawn, device=samples.device))
