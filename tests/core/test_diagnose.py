"""`flowrl diagnose`: its figures on a hand-computed table, and on a tiny pipeline with a reward of known spread."""

import numpy as np
import pytest
from run_helpers import tiny_run_config

from flowrl.cli import main
from flowrl.config import load_config
from flowrl.diagnose import SignalStats, diagnose, tag_stats, write_report


def test_figures_of_a_table_computed_by_hand():
    rewards = np.array([[0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1]])
    stats = SignalStats.of(rewards, rewards >= 1)
    assert stats.reward_mean == pytest.approx(5 / 12)
    # total variance 4/12 - (5/12)^2 = 23/144; within-group variances 1/4, 0, 3/16
    assert stats.reward_std == pytest.approx((23 / 144) ** 0.5)
    assert stats.within_group_share == pytest.approx((1 / 4 + 0 + 3 / 16) / 3 / (23 / 144))
    assert stats.group_std == pytest.approx([0.5, 0.0, (3 / 16) ** 0.5])
    assert stats.zero_spread_share == pytest.approx(1 / 3)
    assert stats.signal_share == pytest.approx(2 / 3)
    assert (stats.pass_at_1, stats.pass_at_g) == (pytest.approx(3 / 12), pytest.approx(2 / 3))
    assert "signal on 67% of prompts" in stats.verdict()


def test_a_group_lost_in_the_spread_across_prompts_carries_no_signal():
    """Within-group std 0.01 against prompts 1 apart: below a tenth of the batch's std, so no signal."""
    rewards = np.array([[0.0, 0.02, 0.0, 0.02], [1.0, 1.02, 1.0, 1.02]])
    stats = SignalStats.of(rewards)
    assert stats.zero_spread_share == 0 and stats.signal_share == 0
    assert "change the testbed" in stats.verdict()


def test_a_tag_is_judged_against_the_whole_batch():
    """Tag "flat": two groups whose small spread is all the tag has (within-group share 1 of its own variance), but
    lost against the batch's: no signal there. Tag "open": groups spread 0 to 1. Untagged groups are left out."""
    rewards = np.array([[0.5, 0.52, 0.5, 0.52], [0.5, 0.52, 0.5, 0.52], [0, 1, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    stats = tag_stats(rewards, rewards >= 1, ["flat", "flat", "open", "open", None])
    assert list(stats) == ["flat", "open"]
    flat, open_ = stats["flat"], stats["open"]
    assert flat.within_group_share == pytest.approx(1.0) and flat.signal_share == 0
    assert open_.signal_share == 1 and open_.within_group_share == pytest.approx(1.0)
    assert len(open_.group_std) == 2 and open_.pass_at_1 == pytest.approx(0.5) and open_.pass_at_g == 1
    # judged by its own spread, "flat" would carry signal
    assert SignalStats.of(rewards[:2]).signal_share == 1


def test_diagnose_on_a_tiny_pipeline_matches_the_hand_computation(tmp_path, tiny_sd3_dir):
    config_path = tiny_run_config(tmp_path / "run.yaml", tiny_sd3_dir, tmp_path / "runs", "diag", groups_per_update=4)
    config = load_config(config_path, ["reward=[{name: toy_rewards:BrightnessForCircles, params: {bar: 0.45}}]"])
    result = diagnose(config, updates=2, progress=False)
    rows = result["prompts"]
    assert len(rows) == 8 and all(len(r["rewards"]) == 4 for r in rows)
    table = np.array([r["rewards"] for r in rows])
    circles = np.array(["circle" in r["prompt"] for r in rows])
    assert 0 < circles.sum() < 8  # the draw has both kinds
    # groups of prompts without a circle score 0.5 each: exactly those have zero spread
    assert np.all(table[~circles] == 0.5) and np.all(table[circles].std(1) > 0)
    stats = result["stats"]
    assert stats["zero_spread_share"] == pytest.approx((~circles).mean())
    centred = table - table.mean()
    within = ((table - table.mean(1, keepdims=True)) ** 2).sum() / (centred**2).sum()
    assert stats["within_group_share"] == pytest.approx(within, rel=1e-6)
    assert stats["reward_mean"] == pytest.approx(table.mean(), rel=1e-6)
    # the reward's accuracy is brightness > 0.45 for every prompt, circle or not: pass@1 <= pass@G
    assert 0 <= stats["pass_at_1"] <= stats["pass_at_g"] <= 1
    assert result["sde_ode_gap"] is not None  # the config samples with the flow SDE
    assert result["clip_fraction"] is not None and 0 <= result["clip_fraction"] <= 1
    # per tag: the figures of that tag's rows, judged against the whole batch's std
    tags = [r["tag"] for r in rows]
    assert None not in tags and set(result["tags"]) == set(tags)
    for tag, figures in result["tags"].items():
        mine = np.array([t == tag for t in tags])
        by_hand = SignalStats.of(table[mine], reference_std=table.std())
        assert figures["groups"] == mine.sum()
        assert figures["reward_mean"] == pytest.approx(by_hand.reward_mean, rel=1e-6)
        assert figures["signal_share"] == pytest.approx(by_hand.signal_share)
        assert figures["within_group_share"] == pytest.approx(by_hand.within_group_share, rel=1e-6)
    written = write_report(result, tmp_path / "report")
    assert [p.name for p in written] == ["diagnose.json", "prompts.md", "rewards.png"]
    report = (tmp_path / "report" / "prompts.md").read_text()
    # the tag table (a separator and one row per tag) and the prompt table (a separator and 8 prompts)
    assert report.count("\n| ") == 1 + len(result["tags"]) + 1 + 8


def test_bad_input_is_one_line(tmp_path, tiny_sd3_dir, capsys):
    config_path = tiny_run_config(tmp_path / "run.yaml", tiny_sd3_dir, tmp_path / "runs", "diag")
    assert main(["diagnose", str(config_path), "--updates", "0"]) == 2
    assert "--updates" in capsys.readouterr().err
