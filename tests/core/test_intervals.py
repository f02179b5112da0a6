"""Standard errors and 95% intervals of evaluation results (tasks.base.tag_metrics): the usual s / sqrt(n) for
independent samples, the prompt as the sampling unit when samples of a prompt are correlated, the error of a
draw of seeds with the prompts fixed, the tag-averaged overall's error, and intervals that cover the truth about
95% of the time."""

import numpy as np
import pytest

from flowrl.tasks.base import clustered_stderr, format_metrics, interval, stratified_stderr, tag_metrics


def test_one_value_per_cluster_is_the_usual_standard_error():
    x = np.random.default_rng(0).random(50)
    assert clustered_stderr(x, list(range(50))) == pytest.approx(x.std(ddof=1) / np.sqrt(50))
    assert np.isnan(clustered_stderr(x[:1], [0])) and np.isnan(clustered_stderr(x[:4], [0] * 4))


def test_identical_samples_of_a_prompt_count_as_one():
    means = np.random.default_rng(1).random(10)
    x = np.repeat(means, 8)  # every prompt's 8 images agree
    prompts = np.repeat(np.arange(10), 8).tolist()
    assert clustered_stderr(x, prompts) == pytest.approx(means.std(ddof=1) / np.sqrt(10))
    assert clustered_stderr(x, prompts) > 2 * clustered_stderr(x, list(range(80)))  # naive errors are too small


def test_overall_error_of_the_tag_average():
    result = tag_metrics([1, 0, 1, 1, 0, 0, 1, 0], ["a", "a", "a", "a", "b", "b", "b", "b"])
    se_a, se_b = np.std([1, 0, 1, 1], ddof=1) / 2, np.std([0, 0, 1, 0], ddof=1) / 2
    assert result["stderr"]["tags"] == pytest.approx({"a": se_a, "b": se_b})
    assert result["stderr"]["overall"] == pytest.approx(np.sqrt(se_a**2 + se_b**2) / 2)
    assert interval(result) == pytest.approx(1.96 * result["stderr"]["overall"])
    table = format_metrics(result)
    assert "95% +-" in table and f"{interval(result):.3f}" in table.splitlines()[-1]


def test_intervals_cover_the_true_accuracy_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    truth = rng.uniform(0.1, 0.9, size=(3, 12))  # 3 tags x 12 prompts, each prompt its own success rate
    covered = 0
    for _ in range(300):
        values, tags, prompts = [], [], []
        for t in range(3):
            for p in range(12):
                values += (rng.random(4) < truth[t, p]).tolist()
                tags += [f"t{t}"] * 4
                prompts += [(t, p)] * 4
        result = tag_metrics(values, tags, clusters=prompts)
        covered += abs(result["overall"] - truth.mean()) <= interval(result)
    assert 0.88 <= covered / 300 <= 0.99


def test_draw_error_holds_the_prompts_fixed():
    x = np.repeat(np.random.default_rng(3).random(10), 8)  # every prompt's 8 images agree: no draw moves the mean
    prompts = np.repeat(np.arange(10), 8).tolist()
    assert stratified_stderr(x, prompts) == 0.0
    # by hand: prompt a (1, 0, 1, 1), prompt b (0, 0) -> sqrt(4 var_a + 2 var_b) / 6
    by_hand = np.sqrt(4 * np.var([1, 0, 1, 1], ddof=1) + 2 * np.var([0, 0], ddof=1)) / 6
    assert stratified_stderr(np.array([1, 0, 1, 1, 0, 0]), list("aaaabb")) == pytest.approx(by_hand)
    result = tag_metrics([1, 0, 1, 1, 0, 0], ["t"] * 6, clusters=list("aaaabb"))
    assert result["draw_stderr"]["tags"]["t"] == pytest.approx(by_hand)
    assert result["draw_stderr"]["overall"] == pytest.approx(by_hand)
    assert "draw_stderr" not in tag_metrics([1, 0], ["t", "t"])
    table = format_metrics(result)
    assert "draw +-" in table.splitlines()[0] and f"{1.96 * by_hand:.3f}" in table.splitlines()[-1]


def test_draw_intervals_cover_these_prompts_accuracy_about_95_percent_of_the_time():
    rng = np.random.default_rng(4)
    truth = rng.uniform(0.1, 0.9, size=(3, 12))  # fixed prompts; only the images are redrawn
    prompts = [(t, p) for t in range(3) for p in range(12) for _ in range(16)]
    tags = [f"t{t}" for t, _ in prompts]
    covered = narrower = 0
    for _ in range(300):
        values = [rng.random() < truth[t, p] for t, p in prompts]
        result = tag_metrics(values, tags, clusters=prompts)
        half = 1.96 * result["draw_stderr"]["overall"]
        covered += abs(result["overall"] - truth.mean()) <= half
        narrower += half < interval(result)  # the prompts' own spread is no part of a redraw's noise
    assert 0.88 <= covered / 300 <= 0.99
    assert narrower / 300 > 0.9


def test_a_run_rewards_evaluation_clusters_by_condition_not_by_prompt_text():
    """One instruction on two source images is two conditions: their spread is between conditions, not seed noise
    within one (clustered by prompt text, the draw interval took it for seed noise)."""
    from flowrl.experiment import tag_metrics_of
    from flowrl.tasks.base import Condition

    items = [Condition("make it blue", meta={"image": name}) for name in ("a.png", "a.png", "b.png", "b.png")]
    result = tag_metrics_of([1.0, 1.0, 0.0, 0.0], items)
    assert result["draw_stderr"]["overall"] == 0.0  # each condition's two draws agree


def test_one_image_per_prompt_leaves_the_draw_interval_unknown_not_zero():
    """With one image per prompt nothing measures seed noise: the draw SE is NaN (printed as nan), where it read 0."""
    import math

    result = tag_metrics([1, 0, 1, 0], ["t"] * 4, clusters=list("abcd"))
    assert math.isnan(result["draw_stderr"]["tags"]["t"]) and math.isnan(result["draw_stderr"]["overall"])
    assert result["stderr"]["overall"] > 0  # the prompt-level interval is still there
    assert "nan" in format_metrics(result)
