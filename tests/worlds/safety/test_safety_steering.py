"""Safety steering: the monitor fires where the probe says, each mode changes only fired samples and in the way
it claims, FK with the probe potential moves mass to the safe side, and the baselines do what they say."""

import json

import numpy as np
import pytest
import torch
from conftest import REPO
from run_helpers import run_flowrl
from toy_flows import GaussianMixtureFlow

from flowrl.fk import FKConfig
from flowrl.inference import generate
from flowrl.policies import load_pipeline, policy_for
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.worlds.safety.steering import ProbeFK, SafetyMonitor, SteeringConfig

PROMPTS = ["a red triangle", "a blue square", "a triangle", "two circles"]


class LinearProbe(torch.nn.Module):
    """logit = a * mean(x0_hat[:, 0]) + b: 'unsafe' when the prediction's first channel is high."""

    def __init__(self, a=4.0, b=0.0):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x_t, x0_pred, sigma):
        return self.a * x0_pred[:, 0].flatten(1).mean(1) + self.b


@pytest.fixture(scope="module")
def policy(tiny_sd3_dir):
    return policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)


def _run(policy, config, probe, prompts=PROMPTS, seeds=range(4)):
    cond = policy.encode(prompts, 4.5)
    monitor = SafetyMonitor(policy, probe, config, len(prompts)) if config else None
    traj = rollout(
        policy,
        cond,
        sample_generators(list(seeds)),
        policy.noise_shape(SampleSpec(32, 32)),
        6,
        "ode",
        0.0,
        4.5,
        guide=monitor,
    )
    return traj.final, monitor


def _split_probe(policy):
    """A probe offset so that it fires on some of the 4 samples and not on others."""
    _, monitor = _run(policy, SteeringConfig(mode="none"), LinearProbe(4.0, 0.0))
    base, _ = _run(policy, None, None)
    for b in np.linspace(-3, 3, 61):
        _, monitor = _run(policy, SteeringConfig(mode="none"), LinearProbe(4.0, float(b)))
        if 0 < int(monitor.fired.sum()) < 4:
            return LinearProbe(4.0, float(b)), monitor.fired.clone(), base
    pytest.skip("no offset splits the tiny model's samples")


@pytest.mark.parametrize("mode", ["negative", "probe_gradient"])
def test_steering_changes_exactly_the_samples_the_probe_fired_on(policy, mode):
    probe, fired, base = _split_probe(policy)
    monitored, monitor = _run(policy, SteeringConfig(mode="none"), probe)
    assert torch.equal(monitored, base)  # monitoring alone changes nothing
    steered, monitor = _run(policy, SteeringConfig(mode=mode, negative_scale=2.0, gradient_scale=2.0), probe)
    changed = (steered - base).flatten(1).abs().amax(1) > 1e-5
    assert torch.equal(monitor.fired, fired)
    assert torch.equal(changed, fired)
    assert (monitor.fired_at[fired] >= 0).all() and (monitor.fired_at[~fired] == -1).all()


def test_negative_guidance_and_probe_gradient_follow_their_formulas(policy):
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(["a triangle", "a square"], 4.5)
    v = policy.velocity(x, 0.6, cond, 4.5)
    always = LinearProbe(0.0, 10.0)  # fires on everything at once
    negative = SafetyMonitor(policy, always, SteeringConfig(mode="negative", negative_scale=3.0), 2)
    concept = policy.encode(["a red triangle"] * 2, 1.0)
    empty, toward = policy.branch_outputs(x, 0.6, [cond.negative, concept.tensors], 4.5)
    assert torch.allclose(negative(x, 0.6, cond, 4.5, v), v - 3.0 * (toward - empty), atol=1e-5)
    gradient = SafetyMonitor(
        policy, LinearProbe(4.0, 10.0), SteeringConfig(mode="probe_gradient", gradient_scale=0.5), 2
    )
    g = torch.zeros_like(x)
    g[:, 0] = 4.0 / x[0, 0].numel()  # d logit / d x through x0_hat with the network's Jacobian left out
    expected = v + 0.5 * g / g.flatten(1).pow(2).mean(1).sqrt().reshape(-1, 1, 1, 1)
    assert torch.allclose(gradient(x, 0.6, cond, 4.5, v), expected, atol=1e-5)


def test_negative_guidance_without_cfg_guides_away_from_the_empty_prompt(policy):
    """At guidance 1 (or on a guidance-distilled family) there is no unconditional branch to guide against: the
    empty prompt's output takes its place (it raised KeyError: 'embeds')."""
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(["a triangle", "a square"], 1.0)
    assert not cond.negative
    v = policy.velocity(x, 0.6, cond, 1.0)
    negative = SafetyMonitor(policy, LinearProbe(0.0, 10.0), SteeringConfig(mode="negative", negative_scale=3.0), 2)
    concept, empty_prompt = policy.encode(["a red triangle"] * 2, 1.0), policy.encode([""] * 2, 1.0)
    empty, toward = policy.branch_outputs(x, 0.6, [empty_prompt.tensors, concept.tensors], 1.0)
    assert torch.allclose(negative(x, 0.6, cond, 1.0, v), v - 3.0 * (toward - empty), atol=1e-5)


def test_a_probe_for_other_latents_is_one_error_before_sampling(policy, tmp_path):
    """The probe's convolutions read [C, H, W] latents of its channel count: another pipeline's (16-channel SD3,
    video) is named up front, not a convolution error at the first step."""
    from flowrl.errors import UserError
    from flowrl.worlds.safety.probe import StateProbe, save_probe
    from flowrl.worlds.safety.steering import load_steering

    channels = policy.noise_shape(SampleSpec(32, 32))[0]
    save_probe(StateProbe(channels + 1, 8), tmp_path / "probe", {})
    with pytest.raises(UserError, match=rf"reads image latents of {channels + 1} channels"):
        load_steering(policy, SteeringConfig(mode="negative", probe=str(tmp_path / "probe")))


def test_steering_lora_acts_only_on_fired_samples(policy):
    from flowrl.checkpoint import load_trained_weights  # noqa: F401  (the path --steer lora uses)

    probe, fired, base = _split_probe(policy)
    policy.add_lora(4, 8, ["to_q", "to_k", "to_v", "to_out.0"])
    try:
        with torch.no_grad():
            for name, p in policy.transformer.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.3)
        policy.transformer.disable_adapters()
        assert torch.equal(_run(policy, None, None)[0], base)  # adapter off: the base model
        steered, monitor = _run(policy, SteeringConfig(mode="lora", lora="unused"), probe)
        changed = (steered - base).flatten(1).abs().amax(1) > 1e-5
        assert torch.equal(changed, fired)
    finally:
        policy.transformer.delete_adapters("default")


class _Probe1D(torch.nn.Module):
    def forward(self, x_t, x0_pred, sigma):
        return 3.0 * x0_pred[:, 0]  # unsafe: the right-hand mode of the mixture


def test_fk_with_the_probe_potential_moves_mass_to_the_safe_mode():
    policy = GaussianMixtureFlow()
    groups, k, steps = 200, 4, 20

    def sample(with_fk):
        n = groups * k if with_fk else groups
        cond = Conditioning({"id": torch.zeros(n, 1)}, {}, ["p"] * n)
        monitor = SafetyMonitor(policy, _Probe1D(), SteeringConfig(mode="fk"), n)
        callbacks = (
            [ProbeFK(monitor, FKConfig(num_particles=k, lam=10.0), steps, groups, torch.Generator().manual_seed(0))]
            if with_fk
            else []
        )
        traj = rollout(
            policy, cond, sample_generators(range(n)), (2,), steps, "flow", 0.5, 1.0, callbacks=callbacks, guide=monitor
        )
        return traj.final[::k] if with_fk else traj.final

    plain, steered = (sample(False)[:, 0] < 0).float().mean(), (sample(True)[:, 0] < 0).float().mean()
    assert 0.35 < plain < 0.65
    assert steered > plain + 0.25


def test_probe_fk_weighs_each_final_particle_by_exp_minus_lambda_p_unsafe():
    """The potential is exp(-lambda p); it was (1 - p)^lambda (log P(safe) as the reward)."""
    policy, groups, k, lam = GaussianMixtureFlow(), 8, 4, 3.0
    cond = Conditioning({"id": torch.zeros(groups * k, 1)}, {}, ["p"] * (groups * k))
    monitor = SafetyMonitor(policy, _Probe1D(), SteeringConfig(mode="fk"), groups * k)
    fk = ProbeFK(monitor, FKConfig(num_particles=k, lam=lam), 10, groups, torch.Generator().manual_seed(0))
    traj = rollout(
        policy, cond, sample_generators(range(groups * k)), (2,), 10, "flow", 0.5, 1.0, callbacks=[fk], guide=monitor
    )
    p_unsafe = torch.sigmoid(_Probe1D()(traj.final, traj.final, torch.tensor(0.0)).double())
    torch.testing.assert_close(fk.final_rewards, -p_unsafe)
    torch.testing.assert_close(fk.log_product, -lam * p_unsafe)  # the product of potentials, after the last resampling


def test_prompt_filter_blanks_refused_prompts_and_keeps_the_others_noise(policy):
    from flowrl.worlds.safety.baselines import PromptFilter, filtered_generate

    assert [
        PromptFilter().refuses(p)
        for p in [
            "a red triangle",
            "three red triangles",
            "a red circle and a blue triangle",
            "a triangle",
            "a red square",
        ]
    ] == [True, True, True, False, False]
    base, _ = generate(policy, PROMPTS, 2, seed=3, desc=None)
    filtered, records = filtered_generate(policy, PROMPTS, PromptFilter(), 2, seed=3, desc=None)
    assert (filtered[:2] == 0).all() and records[0]["refused"]
    assert np.array_equal(filtered[2:], base[2:])
    from flowrl.policies.base import SampleSpec

    wide, _ = filtered_generate(policy, PROMPTS[:2], PromptFilter(), 1, seed=3, desc=None, spec=SampleSpec(16, 32))
    assert wide.shape == (2, 16, 32, 3) and (wide[0] == 0).all()  # the black image once stayed 32 x 32


def test_reject_and_resample_redraws_flagged_images_and_blacks_out_the_rest(policy):
    from flowrl.worlds.safety.baselines import reject_and_resample

    def flag(image):
        return image.mean() > threshold

    base, _ = generate(policy, PROMPTS * 2, 1, seed=5, desc=None)
    threshold = float(np.median([im.mean() for im in base]))
    images, records = reject_and_resample(policy, PROMPTS * 2, flag, 1, seed=5, max_tries=3, desc=None)
    kept = [not flag(b) for b in base]
    for image, record, was_safe, before in zip(images, records, kept, base):
        assert not flag(image)
        if was_safe:
            assert record["tries"] == 1 and np.array_equal(image, before)
        else:
            assert record["tries"] > 1 or record["blacked_out"]
            assert record["blacked_out"] == bool((image == 0).all())


def test_eval_safety_writes_a_table_and_monitoring_changes_nothing(tiny_sd3_dir, tmp_path):
    from flowrl.worlds.safety.probe import StateProbe, save_probe

    torch.manual_seed(0)
    save_probe(StateProbe(4), tmp_path / "probe", {"note": "random"})
    out = tmp_path / "eval"
    cmd = [
        "eval",
        "safety",
        "--pipeline",
        str(tiny_sd3_dir),
        "--probe",
        str(tmp_path / "probe"),
        "--modes",
        "base,prompt_filter,monitor,negative",
        "--num-per-prompt",
        "1",
        "--steer-threshold",
        "0.3",
        "--out",
        str(out),
    ]
    result = run_flowrl(*cmd)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "safety_eval.json").read_text())["modes"]
    assert set(data) == {"base", "prompt_filter", "monitor", "negative"}
    for name in ("direct", "indirect", "attribute_leak", "benign"):
        assert data["monitor"][f"unsafe/{name}"] == data["base"][f"unsafe/{name}"]
    assert data["monitor"]["benign_dense"] == data["base"]["benign_dense"]
    assert data["prompt_filter"]["unsafe/direct"] == 0.0  # every direct prompt names a red triangle
    assert data["prompt_filter"]["benign_dense"] == data["base"]["benign_dense"]  # benign prompts pass untouched
    assert 0 <= data["negative"]["fired/benign"] <= 1 and data["base"]["time_ratio"] == 1.0
    assert "| negative |" in (out / "safety_eval.md").read_text() and (out / "safety_eval.png").stat().st_size > 0
    bad = run_flowrl(*cmd[:-6], "--modes", "base,bogus")
    assert bad.returncode == 2 and "--modes" in bad.stderr and "Traceback" not in bad.stderr


def test_steering_is_switchable_in_a_run_config_with_clear_errors():
    from flowrl.config import load_config
    from flowrl.errors import UserError
    from flowrl.tasks import build_task

    config = load_config(
        REPO / "configs/shapes_safe_grpo.yaml", ["task.params.steering={mode: probe_gradient, threshold: 0.3}"]
    )
    task = build_task(config.task.name, config.task.params)
    assert task.steering.mode == "probe_gradient" and task.steering.threshold == 0.3
    where = "task.params.steering"
    for override, field in [
        (f"{where}={{mode: bogus}}", f"{where}.mode"),
        (f"{where}={{mode: negative, threshold: 1.5}}", f"{where}.threshold"),
        (f"{where}={{mode: lora, lora: pipelines/shapes-safety-lora}}", f"{where}.mode"),
    ]:
        with pytest.raises(UserError, match=field):
            load_config(REPO / "configs/shapes_safe_grpo.yaml", [override])


def test_sample_steer_records_firing_and_names_missing_pieces(tiny_sd3_dir, tmp_path):
    from flowrl.worlds.safety.probe import StateProbe, save_probe

    torch.manual_seed(0)
    save_probe(StateProbe(4), tmp_path / "probe", {"note": "random"})
    (tmp_path / "prompts.txt").write_text("a triangle\na blue square\n")
    base = [
        "sample",
        "--pipeline",
        str(tiny_sd3_dir),
        "--prompts",
        str(tmp_path / "prompts.txt"),
        "--steps",
        "4",
        "--probe",
        str(tmp_path / "probe"),
    ]
    done = run_flowrl(*base, "--out", str(tmp_path / "out"), "--steer", "negative", "--steer-threshold", "0.01")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0 <= r["probe_fired_at"] < 4 for r in records)
    # FK particles sample with the SDE (under the ODE resampled copies stay identical): they once took the ODE
    fk = run_flowrl(*base, "--out", str(tmp_path / "fk"), "--steer", "fk", "--steer-particles", "2")
    assert fk.returncode == 0, fk.stderr
    settings = json.loads((tmp_path / "fk" / "sampling.json").read_text())
    assert (settings["kind"], settings["noise_level"]) == ("flow", 0.7), settings
    no_lora = run_flowrl(*base, "--out", str(tmp_path / "o2"), "--steer", "lora")
    assert no_lora.returncode == 2 and "--steer-lora" in no_lora.stderr and "Traceback" not in no_lora.stderr
    no_probe = run_flowrl(
        *base[:-2], "--probe", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o3"), "--steer", "none"
    )
    assert no_probe.returncode == 2 and "probe.safetensors" in no_probe.stderr


def test_eval_safetys_fk_modes_sample_with_the_sde_and_the_others_with_the_ode(policy, monkeypatch):
    import flowrl.worlds.safety.evaluation as safety

    taken = {}
    monkeypatch.setattr(
        safety,
        "generate",
        lambda policy, prompts, **kw: taken.setdefault(
            kw.get("steer").config.mode if kw.get("steer") else "base",
            (kw.get("kind", "ode"), kw.get("noise_level", 0.0)),
        ),
    )
    for mode in ("base", "negative", "fk", "fk_negative"):
        safety._images_for(mode, policy, PROMPTS, SteeringConfig(), LinearProbe(), None, {"seed": 0})
    assert taken == {"base": ("ode", 0.0), "negative": ("ode", 0.0), "fk": ("flow", 0.7), "fk_negative": ("flow", 0.7)}


def test_eval_safety_labels_with_a_real_checker_folder(tiny_sd3_dir, tmp_path):
    from tiny_reward_models import tiny_safety_checker

    from flowrl.images import to_unit
    from flowrl.worlds.safety.concept import safety_split
    from flowrl.worlds.safety.probe import StateProbe, save_probe

    save_probe(StateProbe(4), tmp_path / "probe", {"note": "random"})
    images, _ = generate(
        policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16), safety_split()[1]["direct"][:8], desc=None
    )
    tiny_safety_checker(tmp_path / "checker", to_unit(images))
    out = tmp_path / "eval"
    done = run_flowrl(
        "eval",
        "safety",
        "--pipeline",
        str(tiny_sd3_dir),
        "--probe",
        str(tmp_path / "probe"),
        "--modes",
        "base,reject_resample",
        "--num-per-prompt",
        "1",
        "--checker",
        str(tmp_path / "checker"),
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    modes = json.loads((out / "safety_eval.json").read_text())["modes"]
    assert modes["reject_resample"]["unsafe/direct"] == 0.0  # the checker is the label source and the rejecter
