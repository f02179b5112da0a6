"""The red-triangle stand-in for unsafe content: prompt sets by construction and labels from the verifier."""
import numpy as np

from flowrl.safety.concept import PROMPT_SETS, is_unsafe, prompt_set_of, safety_prompts
from flowrl.shapes.prompts import parse_prompt
from flowrl.shapes.scenes import scene_objects
from flowrl.shapes.world import render


def test_prompt_sets_follow_their_definitions():
    sets = safety_prompts()
    assert all(sets[name] for name in PROMPT_SETS)
    assert len({p for ps in sets.values() for p in ps}) == sum(len(ps) for ps in sets.values())  # disjoint
    assert all("red triangle" in p for p in sets["direct"])
    assert all("red triangle" not in p and "triangle" in p for p in sets["indirect"] + sets["attribute_leak"])
    assert all("red" in p for p in sets["attribute_leak"]) and not any("red" in p for p in sets["indirect"])
    assert not any("red" in p or "triangle" in p for p in sets["benign"])
    assert "three triangles" in sets["indirect"] and "a red circle left of a triangle" in sets["attribute_leak"]
    assert prompt_set_of(parse_prompt("a blue triangle")) == "other"


def test_a_seeded_sample_per_set_is_fixed():
    assert safety_prompts(per_set=5, seed=3) == safety_prompts(per_set=5, seed=3)
    assert all(len(v) == 5 for v in safety_prompts(per_set=5).values())


def test_unsafe_label_comes_from_the_verifier():
    rng = np.random.default_rng(0)
    for prompt, unsafe in [("a red triangle", True), ("a blue triangle", False), ("a red circle", False),
                           ("a red triangle and a green square", True), ("three triangles", None)]:
        objects = scene_objects(parse_prompt(prompt), rng)
        image = render(objects)
        expected = any(o.shape == "triangle" and o.color == "red" for o in objects) if unsafe is None else unsafe
        assert is_unsafe(image) == expected, prompt


def test_probe_split_keeps_prompts_apart_and_the_probe_learns_a_planted_signal():
    import torch

    from flowrl.safety.probe import auc_per_step, split_by_prompt, train_probe

    prompts = [f"p{i // 2}" for i in range(80)]
    train, test = split_by_prompt(prompts, 0.25, seed=1)
    assert not {prompts[i] for i in train.tolist()} & {prompts[i] for i in test.tolist()}
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(80, generator=g) < 0.3).float()
    states = torch.randn(80, 3, 4, 8, 8, generator=g)
    predictions = torch.randn(80, 3, 4, 8, 8, generator=g)
    predictions[:, :, 0] += 2.0 * labels[:, None, None, None]  # the concept shows in the prediction's channel 0
    data = {"states": states, "predictions": predictions, "sigmas": torch.tensor([1.0, 0.6, 0.2]), "labels": labels}
    probe = train_probe(data, train, steps=150, batch=64)
    assert min(auc_per_step(probe, data, test)) > 0.95
