"""benchmarks/time_to_quality.py: a rerun with the same seeds reproduces every number but the clock; the table's
times to a gain and gains at the budget read the curves as stated."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("time_to_quality", ROOT / "benchmarks" / "time_to_quality.py")
ttq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ttq)

ONE_PER_TAG = [
    "a circle",
    "a blue triangle",
    "a circle and a square",
    "two circles",
    "a red square and a yellow circle",
    "a square left of a yellow circle",
]


def strip_clock(results: dict) -> str:
    """Every number but the clock, as JSON text (one prompt per tag: the prompt-level errors are NaN, which equal
    each other only as text)."""
    return json.dumps(
        {
            key: {
                "curve": [{k: v for k, v in p.items() if k != "train_seconds"} for p in run["curve"]],
                "train_rewards": run["train_rewards"],
            }
            for key, run in results.items()
        },
        sort_keys=True,
    )


def test_a_rerun_with_the_same_seeds_is_identical(tmp_path):
    tiny = [
        "--methods",
        "grpo",
        "--seeds",
        "0",
        "--updates",
        "2",
        "--groups",
        "2",
        "--group-size",
        "2",
        "--eval-every",
        "1",
        "--per-tag",
        "2",
        "--eval-steps",
        "3",
        "--override",
        "sampler.num_steps=4",
        "sampler.sde_window_range=[0,2]",
    ]
    first = ttq.main(tiny + ["--out", str(tmp_path / "a")], prompts=ONE_PER_TAG)
    again = ttq.main(tiny + ["--out", str(tmp_path / "b")], prompts=ONE_PER_TAG)
    assert strip_clock(first) == strip_clock(again)
    run = first["grpo/seed0"]
    assert [p["update"] for p in run["curve"]] == [0, 1, 2] and len(run["train_rewards"]) == 2
    assert run["curve"][0]["gain"]["overall"] == 0.0  # the base is its own reference
    assert run["curve"][0]["exact"]["gain"]["overall"] == 0.0
    for p in run["curve"]:  # the exact verdict refuses what GenEval's does, and more
        assert p["exact"]["accuracy"]["overall"] <= p["accuracy"]["overall"]
    assert (tmp_path / "a" / "table.md").is_file() and (tmp_path / "a" / "curves.png").is_file()
    other = ttq.main(tiny + ["--out", str(tmp_path / "c"), "--seeds", "1"], prompts=ONE_PER_TAG)
    assert other["grpo/seed1"]["train_rewards"] != run["train_rewards"]  # the seed matters


def point(update, seconds, gain):
    return {"update": update, "train_seconds": seconds, "samples": 64 * update, "gain": {"overall": gain}}


def test_times_to_a_gain_and_the_gain_at_the_budget():
    curve = [
        point(0, 0, 0.0),
        point(40, 300, 0.06),
        point(80, 600, 0.12),
        point(120, 900, 0.21),
        point(160, 1300, 0.25),
    ]
    assert ttq.time_to_gain(curve, 0.10) == 600
    assert ttq.time_to_gain(curve, 0.20, key="samples") == 64 * 120
    assert ttq.time_to_gain(curve, 0.30) is None
    assert ttq.gain_at(curve, 1200) == 0.21  # the last eval within 20 minutes, not the one after
    assert ttq.mean_se([0.1, 0.2, 0.3]) == pytest.approx((0.2, 0.1 / 3**0.5))
    assert ttq.gain_at(curve, 1200, "exact") is None  # a run recorded before the exact verdict
    for p, exact in zip(curve, (0.0, -0.02, 0.03, 0.05, 0.08)):
        p["exact"] = {"gain": {"overall": exact}}
    assert ttq.gain_at(curve, 1200, "exact") == 0.05
    assert ttq.exact_gain_at([{"curve": curve}, {"curve": curve[:3]}], 1200) == pytest.approx((0.04, 0.01))
    assert ttq.exact_gain_at([{"curve": curve}, {"curve": [point(0, 0, 0.0)]}], 1200) is None


def test_unknown_methods_are_refused():
    with pytest.raises(SystemExit):
        ttq.parse_args(["--methods", "grpo,nope"])


def test_the_anchor_ratio_is_a_lower_bound_when_the_anchor_never_gets_there():
    def row(minutes_to_10, trained):
        return {
            "minutes_to_10": minutes_to_10,
            "reached_10": "1/1" if minutes_to_10 else "0/1",
            "train_minutes": trained,
        }

    table = {"grpo": row(6.5, 26.0), "nft": row(None, 30.0), "grpo_anchor": row(None, 27.3)}
    assert ttq.anchor_ratio(table).endswith("at least 4.2x faster.")
    table["grpo_anchor"] = row(13.0, 27.3)
    assert "grpo 6.5 min vs grpo_anchor 13.0 min: 2.0x faster" in ttq.anchor_ratio(table)
    assert ttq.anchor_ratio({"grpo": row(6.5, 26.0)}) == ""  # no anchor run, no ratio


def test_the_anchor_ratio_names_another_base_and_adds_the_best_on_the_anchors():
    def row(minutes_to_10, pipeline):
        return {"minutes_to_10": minutes_to_10, "reached_10": "1/1", "train_minutes": 27.0, "pipeline": pipeline}

    table = {"ddpo": row(6.0, "shapes-sd"), "grpo": row(6.6, "shapes-sd3"), "grpo_anchor": row(13.2, "shapes-sd3")}
    lines = ttq.anchor_ratio(table).strip().splitlines()
    assert lines == [
        "Time to +10 points: ddpo (on shapes-sd, the anchor on shapes-sd3) 6.0 min vs grpo_anchor "
        "13.2 min: 2.2x faster.",
        "Time to +10 points: grpo 6.6 min vs grpo_anchor 13.2 min: 2.0x faster.",
    ]
    del table["grpo"]  # nothing else on the anchor's base reached +10: one line
    assert len(ttq.anchor_ratio(table).strip().splitlines()) == 1


def test_the_anchor_ratio_leaves_out_methods_timed_on_another_cpu():
    def row(minutes_to_10, cpu):
        return {
            "minutes_to_10": minutes_to_10,
            "reached_10": "1/1",
            "train_minutes": 27.0,
            "pipeline": "shapes-sd3",
            "cpu": cpu,
        }

    table = {"fast_box": row(3.0, "Intel Xeon"), "grpo": row(6.6, "AMD EPYC"), "grpo_anchor": row(13.2, "AMD EPYC")}
    assert ttq.anchor_ratio(table).strip() == "Time to +10 points: grpo 6.6 min vs grpo_anchor 13.2 min: 2.0x faster."
    del table["grpo"]
    assert ttq.anchor_ratio(table) == ""  # only another machine's times: no ratio


def test_every_method_builds_and_accepts_its_reward(tmp_path):
    """Each entry's config passes the checks a Trainer makes before training: its algorithm builds with its sampler
    and binds its reward (a method that backpropagates through the reward gets a differentiable one)."""
    from flowrl.algorithms.base import build_algorithm
    from flowrl.builders import build_rewards

    args = ttq.parse_args([])
    for name in ttq.METHODS:
        config = ttq.method_config(name, 0, tmp_path, args)
        algorithm = build_algorithm(config.algorithm.name, config.algorithm.params, config.sampler)
        algorithm.bind_reward(build_rewards(config))  # raises ConfigError on a reward the method cannot use
        if not algorithm.needs_reward_gradient:  # the rest train on the verifier's reward, as the table says
            assert [t.name for t in config.reward] == ["shapes"], name


def test_a_method_sampled_at_another_scale_gains_against_the_base_at_the_eval_scale():
    class Scripted(ttq.LowNoiseEval):  # verdicts by (model, scale) instead of sampling
        def __init__(self):
            super().__init__(per_tag=1, steps=1, prompts=ONE_PER_TAG)
            self.calls = []

        def both_verdicts(self, policy, guidance_scale=ttq.EVAL_CFG, **sampler):
            self.calls.append((policy, guidance_scale))
            value = {("base", ttq.EVAL_CFG): 0.25, ("base", 1.0): 0.5, ("tuned", 1.0): 0.75}[(policy, guidance_scale)]
            verdicts = ttq.np.full(len(self.expanded), value)
            return verdicts, verdicts / 2

    evaluator = Scripted()
    start = evaluator("base", "pipe", untrained=True, guidance_scale=1.0)
    assert start["accuracy"]["overall"] == 0.5 and start["gain"]["overall"] == pytest.approx(0.25)
    assert start["exact"]["gain"]["overall"] == pytest.approx(0.125)
    later = evaluator("tuned", "pipe", guidance_scale=1.0)
    assert later["gain"]["overall"] == pytest.approx(0.5)  # 0.75 against the base at the eval's 4.5, not at 1.0
    evaluator("base", "pipe", untrained=True, guidance_scale=1.0)  # the stored base: nothing sampled again
    same_scale = evaluator("base", "pipe", untrained=True)
    assert same_scale["gain"]["overall"] == 0.0
    assert evaluator.calls == [("base", ttq.EVAL_CFG), ("base", 1.0), ("tuned", 1.0)]
