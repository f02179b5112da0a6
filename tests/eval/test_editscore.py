"""Scripted EditScore: how the package turns raw judge answers into scores under flowrl's
averaging, and the package's own code end to end on a tiny random Qwen2.5-VL folder built offline, on CPU."""

import json
import math

import pytest
import torch

pytest.importorskip("editscore")

from flowrl.eval.editscore import score_triples  # noqa: E402
from flowrl.worlds.shapes.world import render  # noqa: E402
from flowrl.worlds.shapes_edit.instructions import scene_for  # noqa: E402


class ScriptedJudge:
    """Stands in for the package's VLM backbone: answers by which of EditScore's two prompts it is asked."""

    def __init__(self, semantic: list[str], quality: str):
        self.semantic, self.quality, self.calls = list(semantic), quality, 0

    def prepare_input(self, images, text_prompt=""):
        return text_prompt

    def inference(self, prompt, seed=None):
        self.calls += 1
        return self.semantic.pop(0) if "editing instruction" in prompt.lower() else self.quality


def test_raw_judge_answers_become_scores_the_package_way():
    from editscore import EditScore

    scorer = EditScore(backbone="scripted", score_range=25, seed=0)  # an unknown backbone builds no model
    assert "editing instruction" in scorer.SC_prompt.lower() and "editing instruction" not in scorer.PQ_prompt.lower()
    scorer.model = ScriptedJudge(
        ['{"reasoning": "recoloured, rest kept", "score": [20, 15]}', "no score here", "still none", "nor here"],
        '{"reasoning": "clean", "score": [25]}',
    )
    image = render(scene_for("make the red circle blue", 0)[1])
    result = score_triples(scorer, [image, image], ["make the red circle blue"] * 2, [image, image], progress=False)
    first, second = result["rows"]
    # on 0-25 answers: prompt following 20 / 2.5, consistency 15 / 2.5; SC = their minimum; Overall = sqrt(SC x PQ)
    assert (first["prompt_following"], first["consistency"], first["perceptual_quality"]) == (8.0, 6.0, 10.0)
    assert first["overall"] == pytest.approx(math.sqrt(6.0 * 10.0))
    # an answer unparsed twice becomes the package's random guess (equal sub-scores), counted, never silent
    assert second["prompt_following"] == second["consistency"] and "guess_if_cannot_parse" in second["SC_reasoning"]
    assert result["unparsed"] == 1 and result["count"] == 2
    assert result["overall"] == pytest.approx((first["overall"] + second["overall"]) / 2)


def test_a_guess_in_an_earlier_pass_is_counted():
    """With several passes the package averages them all but returns the last pass's reasoning only: a random guess
    in pass one went uncounted."""
    from editscore import EditScore

    scorer = EditScore(backbone="scripted", score_range=25, seed=0, num_pass=2)
    scorer.model = ScriptedJudge(
        [
            "no score here",
            "still none",
            "nor here",  # pass 1: the package guesses
            '{"reasoning": "recoloured", "score": [20, 15]}',
        ],  # pass 2 parses
        '{"reasoning": "clean", "score": [25]}',
    )
    image = render(scene_for("make the red circle blue", 0)[1])
    result = score_triples(scorer, [image], ["make the red circle blue"], [image], progress=False)
    assert "guess_if_cannot_parse" not in result["rows"][0]["SC_reasoning"]  # the last pass parsed
    # giving up, the package guesses both of that try's answers (its parser guesses whatever it is given)
    assert result["rows"][0]["guesses"] == 2 and result["unparsed"] == 1


def test_editscore_runs_the_package_on_a_tiny_qwen25_vl_through_the_cli(tmp_path):
    from tiny_vlm import save_tiny_qwen25_vl

    from flowrl.cli import main
    from flowrl.sample_io import as_samples, write_samples

    save_tiny_qwen25_vl(tmp_path / "qwen")
    instruction, scene_seed = "make the red circle blue", 3
    _, source, target = scene_for(instruction, scene_seed)
    edit = torch.from_numpy(render(target)).permute(2, 0, 1)[None].float() / 255
    write_samples(tmp_path / "edits", as_samples(edit), [{"prompt": instruction, "scene_seed": scene_seed, "seed": 0}])
    assert (
        main(["eval", "editscore", "--samples", str(tmp_path / "edits"), "--editscore-model", str(tmp_path / "qwen")])
        == 0
    )
    result = json.loads((tmp_path / "edits" / "editscore_eval.json").read_text())
    (row,) = result["rows"]
    assert all(0 <= row[k] <= 10 for k in ("prompt_following", "consistency", "perceptual_quality", "overall"))
    assert row["overall"] == pytest.approx(
        math.sqrt(min(row["prompt_following"], row["consistency"]) * row["perceptual_quality"])
    )
    # a random judge's answer is unparseable: the package's guess, counted; its text is the tiny model's own words
    from tiny_vlm import SPECIAL, WORDS

    assert result["unparsed"] == 1 and row["SC_reasoning"].startswith("guess_if_cannot_parse | ")
    answer = row["SC_reasoning"].split(" | ", 1)[1].split()
    assert answer and set(answer) <= set(SPECIAL + WORDS)
    # a missing judge folder is one clear error naming the flag
    assert (
        main(
            ["eval", "editscore", "--samples", str(tmp_path / "edits"), "--editscore-model", str(tmp_path / "nowhere")]
        )
        == 2
    )


def test_a_samples_folder_is_judged_one_edit_at_a_time_and_a_rerun_judges_only_the_rest(tmp_path):
    """Each judged edit is appended to editscore_rows.jsonl as it is judged: after an interruption (here: two rows
    of three kept) the same judge scores only the third; another judge's settings are an error."""
    from editscore import EditScore

    from flowrl.errors import UserError
    from flowrl.eval.editscore import ROWS_FILE, score_samples_folder
    from flowrl.sample_io import as_samples, write_samples
    from flowrl.tasks.base import build_task
    from flowrl.worlds.shapes_edit.task import scene_seed_of

    items = build_task("shapes_edit").condition_set("train").items[:3]
    edits = torch.stack(
        [
            torch.from_numpy(render(scene_for(i.prompt, scene_seed_of(i))[2])).permute(2, 0, 1).float() / 255
            for i in items
        ]
    )
    write_samples(
        tmp_path,
        as_samples(edits),
        [{"prompt": i.prompt, "scene_seed": scene_seed_of(i), "seed": n} for n, i in enumerate(items)],
    )
    answer = '{"reasoning": "ok", "score": [20, 15]}'

    def scorer():
        judge = EditScore(backbone="scripted", score_range=25, seed=0)
        judge.model = ScriptedJudge([answer] * 3, '{"reasoning": "clean", "score": [25]}')
        return judge

    first = scorer()
    whole = score_samples_folder(first, tmp_path, {"model": "scripted"}, progress=False)
    assert whole["count"] == 3 and first.model.calls == 6  # two questions per edit
    rows = (tmp_path / ROWS_FILE).read_text().splitlines()
    (tmp_path / ROWS_FILE).write_text(rows[0] + "\n" + rows[1] + "\n" + rows[2][:15])  # cut short mid-line
    again = scorer()
    resumed = score_samples_folder(again, tmp_path, {"model": "scripted"}, progress=False)
    assert again.model.calls == 2 and resumed == whole
    with pytest.raises(UserError, match="model: 'scripted', now 'other'"):
        score_samples_folder(scorer(), tmp_path, {"model": "other"}, progress=False)


@pytest.mark.parametrize("reference_size", [None, 384])
def test_the_judge_sees_the_source_as_the_editor_was_given_it(reference_size, tmp_path):
    """Edits sampled at 16x16 from a 24x40 source: stretched to 16x16 as the editor took it, or as it is where the
    editor took it at its own aspect (`--reference-size`, read from the folder's sampling.json)."""
    import numpy as np
    from PIL import Image

    import flowrl.eval.editscore as editscore
    from flowrl.sample_io import as_samples, write_samples

    source = np.random.default_rng(0).integers(0, 255, (24, 40, 3), dtype=np.uint8)
    Image.fromarray(source).save(tmp_path / "source.png")
    write_samples(
        tmp_path,
        as_samples(torch.rand(1, 3, 16, 16)),
        [{"prompt": "make it blue", "image": str(tmp_path / "source.png"), "seed": 0}],
    )
    (tmp_path / "sampling.json").write_text(json.dumps({"reference_size": reference_size}))
    shown = []

    class Judge:  # the package's EditScore.evaluate: images [source, edit], the instruction
        def evaluate(self, images, instruction):
            shown.append(np.asarray(images[0]))
            return {key: 1.0 for key in editscore.SCORES}

    editscore.score_samples_folder(Judge(), tmp_path, {"model": "scripted"}, progress=False)
    assert shown[0].shape == ((24, 40, 3) if reference_size else (16, 16, 3))
    if reference_size:
        assert np.array_equal(shown[0], source)
