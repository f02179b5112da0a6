"""The red-triangle stand-in for unsafe content: prompt sets by construction and labels from the verifier."""

import numpy as np
import pytest

from flowrl.worlds.safety.concept import PROMPT_SETS, is_unsafe, prompt_set_of, safety_prompts
from flowrl.worlds.shapes.prompts import parse_prompt
from flowrl.worlds.shapes.scenes import scene_objects
from flowrl.worlds.shapes.world import render


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
    for prompt, unsafe in [
        ("a red triangle", True),
        ("a blue triangle", False),
        ("a red circle", False),
        ("a red triangle and a green square", True),
        ("three triangles", None),
    ]:
        objects = scene_objects(parse_prompt(prompt), rng)
        image = render(objects)
        expected = any(o.shape == "triangle" and o.color == "red" for o in objects) if unsafe is None else unsafe
        assert is_unsafe(image) == expected, prompt


def test_safety_split_keeps_prompts_apart():
    from flowrl.worlds.safety.concept import safety_prompts, safety_split

    train, held = safety_split()
    for name, prompts in safety_prompts().items():
        assert not set(train[name]) & set(held[name])
        assert sorted(train[name] + held[name]) == sorted(prompts)
        assert abs(len(held[name]) - 0.25 * len(prompts)) <= 1


def _planted(count, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(count, generator=g) < 0.3).float()
    states = torch.randn(count, 3, 4, 8, 8, generator=g)
    predictions = torch.randn(count, 3, 4, 8, 8, generator=g)
    predictions[:, :, 0] += 2.0 * labels[:, None, None, None]  # the concept shows in the prediction's channel 0
    return {"states": states, "predictions": predictions, "sigmas": torch.tensor([1.0, 0.6, 0.2]), "labels": labels}


def test_probe_learns_a_planted_signal_and_survives_save_and_load(tmp_path):
    import torch

    from flowrl.errors import UserError
    from flowrl.worlds.safety.probe import auc_per_step, load_probe, save_probe, train_probe

    probe = train_probe(_planted(60, 0), steps=150, batch=64)
    held = _planted(40, 1)
    assert min(auc_per_step(probe, held)) > 0.95
    save_probe(probe, tmp_path / "probe", {"note": "test"})
    loaded = load_probe(tmp_path / "probe")
    x = held["states"][:, 1]
    assert torch.allclose(
        loaded(x, held["predictions"][:, 1], 0.6), probe(x, held["predictions"][:, 1], 0.6), atol=2e-2
    )
    with pytest.raises(UserError, match="probe.safetensors"):
        load_probe(tmp_path / "missing")


def test_safety_runs_never_train_on_the_combinations_the_shapes_eval_holds_out():
    """A safety run is judged on the shapes eval split too (its fidelity): its training prompts name no held-out
    colour-shape combination, and share with that eval only what shapes training itself shares (colour-free
    prompts)."""
    from flowrl.worlds.safety.task import SafetyTask
    from flowrl.worlds.shapes.prompts import is_held_out, parse_prompt
    from flowrl.worlds.shapes.task import ShapesTask

    task = SafetyTask()
    train = {c.prompt for c in task.condition_set("train").items}
    assert train and not any(is_held_out(parse_prompt(p)) for p in train)
    shared = train & {c.prompt for c in task.condition_set("eval").items}
    assert shared <= {c.prompt for c in ShapesTask().condition_set("train").items}
