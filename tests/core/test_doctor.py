"""`flowrl doctor`: each figure against a hand computation, and on the tiny pipeline two rewards whose answer is
known: one no sampler step can move (drawn from each sample's seed, so the step noise decides none of its spread)
and mean brightness (smooth: the step noise decides most of it)."""

import math

import numpy as np
import pytest
import torch
from run_helpers import run_flowrl, tiny_run_config

from flowrl.doctor import Rise, gaussian_kl, gradient_snr, gradient_terms, hint, noise_share

LOTTERY = "reward=[{name: toy_rewards:SeedLottery}]"
BRIGHTNESS = "reward=[{name: toy_rewards:Brightness}]"


def test_the_rise_compares_the_last_updates_with_the_first_with_welchs_interval():
    rewards = [0.1, 0.3, 0.2, 0.4, 0.5, 0.7, 0.6, 0.8]
    rise = Rise.of(rewards, window=3)
    first, last = np.array([0.1, 0.3, 0.2]), np.array([0.7, 0.6, 0.8])
    assert rise.first == pytest.approx(0.2) and rise.last == pytest.approx(0.7) and rise.gain == pytest.approx(0.5)
    se = math.sqrt(first.var(ddof=1) / 3 + last.var(ddof=1) / 3)  # 0.1 / sqrt(3) * sqrt(2)
    assert rise.half_width == pytest.approx(4.302653 * se, rel=1e-5)  # t(0.975, 2 degrees of freedom)
    assert rise.rose and "rose" in rise.line()
    flat = Rise.of([0.5, 0.6, 0.4, 0.5, 0.6, 0.4], window=3)
    assert not flat.rose and "did not rise" in flat.line()
    assert Rise.of([0.1, 0.9], window=8).window == 1 and not Rise.of([0.1, 0.9]).rose  # one update a side: no interval


def test_the_noise_share_is_the_variance_within_an_initial_noise_over_the_variance_within_a_prompt():
    # prompt 0: initial noises at 0 and 10, redraws +-1 -> within-init variance 2 (ddof 1 over [-1, 1]: 2),
    # prompt variance of [-1, 1, 9, 11] (mean 5): (36 + 16 + 16 + 36) / 3 = 104 / 3
    table = np.array([[[-1.0, 1.0], [9.0, 11.0]], [[0.0, 0.0], [0.0, 0.0]]])
    assert noise_share(table) == pytest.approx((2 + 2 + 0 + 0) / 4 / ((104 / 3 + 0) / 2))
    assert noise_share(np.repeat([[[0.0], [1.0]]], 2, axis=2)) == 0.0  # the initial noise decides all
    assert noise_share(np.zeros((2, 2, 2))) == 0.0


def test_the_gradient_snr_is_the_halves_agreement_over_their_difference_pooled_over_updates():
    halves = torch.tensor([[1.0, 0.0, 2.0], [1.0, 2.0, 0.0]])  # a . b = 1, |a - b|^2 / 4 = 2
    assert gradient_terms(halves) == pytest.approx((1.0, 2.0))
    assert gradient_snr([(1.0, 2.0)]) == pytest.approx(math.sqrt(1 / 2))
    assert gradient_snr([(1.0, 2.0), (-0.5, 1.0), (2.5, 3.0)]) == pytest.approx(math.sqrt(3 / 6))  # pooled
    assert gradient_snr([gradient_terms(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))]) == 0.0  # apart: no signal
    assert gradient_snr([gradient_terms(torch.ones(2, 3))]) == math.inf
    # two halves with a common signal G and independent noise: the estimate is |G| / (noise of their mean)
    generator = torch.Generator().manual_seed(0)
    signal, noise = torch.randn(20000, generator=generator), torch.randn(2, 20000, generator=generator)
    estimate = gradient_snr([gradient_terms(signal + 2.0 * noise)])  # |G|^2 = n, the mean's noise 4 n / 2 = 2 n
    assert estimate == pytest.approx(1 / math.sqrt(2), rel=0.05)


def test_the_kl_of_two_step_gaussians_is_torchs_averaged_over_the_elements():
    mean_old, mean_new, std = torch.randn(3, 4, 5), torch.randn(3, 4, 5), torch.rand(3, 4, 5) + 0.5
    exact = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean_old, std), torch.distributions.Normal(mean_new, std)
    )
    assert torch.allclose(gaussian_kl(mean_old, mean_new, std), exact.mean(dim=(1, 2)), atol=1e-6)


def _result(**figures) -> dict:
    base = {
        "ratio_at_first_step": [1.0],
        "logp_change_positive": [5e-2],
        "logp_change_negative": [-5e-2],
        "noise_share": 0.8,
        "clip_frac": [0.1],
        "kl": [1e-4],
        "lr": [1e-4],
        "grad_terms": {0: (9.0, 1.0)},
        "config": {"clip_range": 0.2},
        "rise": {"rose": False, "gain": 0.0, "half_width": 0.1},
    }
    return base | figures


@pytest.mark.parametrize(
    "figures, says",
    [
        ({"ratio_at_first_step": [1.01]}, "ratio at the first inner step is 1.0100"),
        ({"logp_change_positive": [-6e-2]}, "lower the positive-advantage"),
        ({"rise": {"rose": False, "gain": -0.2, "half_width": 0.1}, "noise_share": 0.05}, "reward fell (-0.200)"),
        ({"rise": {"rose": False, "gain": -0.2, "half_width": 0.1}}, "at the start, or let it decay"),
        ({"rise": {"rose": False, "gain": -0.2, "half_width": 0.1}, "lr": [1e-3, 1e-5]}, "1.0e-03 at the start)"),
        ({"noise_share": 0.05}, "step noise decides 5%"),
        ({"clip_frac": [0.8]}, "80% of items clip"),
        ({"logp_change_positive": [1e-4], "logp_change_negative": [-1e-4]}, "barely moves"),
        ({"grad_terms": {0: (1.0, 4.0)}}, "signal-to-noise 0.50"),
        ({}, "no figure looks wrong"),
        ({"rise": {"rose": True, "gain": 0.3, "half_width": 0.1}}, "nothing looks wrong"),
    ],
)
def test_the_hint_names_the_first_figure_that_looks_wrong(figures, says):
    assert says in hint(_result(**figures))


@pytest.fixture(scope="module")
def doctored(tiny_sd3_dir, tmp_path_factory):
    """`flowrl doctor` on the tiny pipeline, 6 updates on 2 prompts, with each known-answer reward."""
    import json

    folder = tmp_path_factory.mktemp("doctor")
    config = tiny_run_config(folder / "c.yaml", tiny_sd3_dir, folder / "runs", "doc")
    results = {}
    for name, reward in (("lottery", LOTTERY), ("brightness", BRIGHTNESS)):
        out = folder / name
        settings = ["--updates", 6, "--prompts", 2, "--noise-draws", 3, "--probe-every", 3, "--out", out]
        done = run_flowrl("doctor", config, reward, "algorithm.params.clip_range=0.2", "optim.lr=3e-3", *settings)
        assert done.returncode == 0, done.stderr
        results[name] = (json.loads((out / "doctor.json").read_text()), done.stdout, out)
    return results


@pytest.mark.slow
def test_the_doctor_finds_a_reward_no_step_can_move(doctored):
    result, printed, out = doctored["lottery"]
    assert result["noise_share"] == 0.0  # every redraw of an initial noise scores the same
    assert "step noise decides 0%" in result["hint"] and printed.splitlines()[-2].startswith("what looks wrong")
    assert printed.splitlines()[0].startswith("training reward did not rise")
    assert {p.name for p in out.iterdir()} == {"doctor.json", "doctor.md", "doctor.png"}


@pytest.mark.slow
def test_the_doctors_figures_on_a_smooth_reward_are_its_raw_measurements(doctored):
    result, printed, _ = doctored["brightness"]
    assert len(result["prompts"]) == 2 and len(result["reward"]) == 6
    rewards = np.asarray(result["reward"]).mean(1)  # the verdict's line, by hand from the per-prompt rewards
    assert result["rise"]["gain"] == pytest.approx(rewards[-3:].mean() - rewards[:3].mean())
    assert result["noise_share"] == pytest.approx(noise_share(np.asarray(result["noise_share_rewards"])), abs=1e-4)
    assert result["noise_share"] > 0.5  # the step noise decides most of brightness's spread (0.83 measured)
    # rollout and training agree on the log-probs before any step; afterwards the policy has moved, each update
    # raised the positive-advantage samples' log-prob above the negative ones', and over the run raised the first and
    # lowered the second
    assert all(abs(r - 1) < 1e-4 for r in result["ratio_at_first_step"])
    assert all(kl > 0 for kl in result["kl"])
    up, down = result["logp_change_positive"], result["logp_change_negative"]
    assert all(p > n for p, n in zip(up, down)) and np.mean(up) > 0 > np.mean(down)
    assert sorted(result["grad_terms"]) == ["0", "3"] and all(noise > 0 for _, noise in result["grad_terms"].values())
    assert "step noise" not in result["hint"] and "ratio" not in result["hint"]
    assert "ratio at the first inner step: 1.0000" in printed


def test_the_doctor_refuses_bad_flags_with_one_line(tmp_path):
    for flags, says in [
        (["--updates", "1"], "--updates: expected a whole number >= 2, got 1"),
        (["--noise-draws", "1"], "--noise-draws: expected 0 (skip) or at least 2"),
        (["--probe-every", "-1"], "--probe-every: expected a whole number >= 0, got -1"),
        (["--prompt", "a purple hexagon"], "--prompt: 'a purple hexagon' is not a prompt of the config's prompt set"),
    ]:
        done = run_flowrl("doctor", "configs/shapes_grpo.yaml", *flags)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
