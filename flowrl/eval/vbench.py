"""Scripted VBench: a `flowrl sample` folder of clips -> VBench's custom-input layout -> the real `vbench` package
(PyPI, 0.1.5), run in its own Python environment -> flowrl's eval JSON with VBench's Quality / Semantic / Total and,
for VBench-2.0 result files, its five category means.

`vbench` pins transformers 4.33, numpy < 2 and timm <= 1.0.12, which flowrl cannot share, so it never runs in
flowrl's interpreter: `make_environment` creates a virtual environment beside (not inside) flowrl's, and
`vbench_runner.py` (stdlib + vbench only) is executed there. The aggregation follows VBench's
`scripts/cal_final_score.py` + `scripts/constant.py` and VBench-2.0's `scripts/cal_final_score.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flowrl.errors import UserError

VBENCH_VERSION = "0.1.5"

# dimension: (min, max, weight) as in VBench's constant.py; every unlisted bound is 0 / 1, every weight 1
QUALITY = {
    "subject_consistency": (0.1462, 1.0, 1.0),
    "background_consistency": (0.2615, 1.0, 1.0),
    "temporal_flickering": (0.6293, 1.0, 1.0),
    "motion_smoothness": (0.706, 0.9975, 1.0),
    "dynamic_degree": (0.0, 1.0, 0.5),
    "aesthetic_quality": (0.0, 1.0, 1.0),
    "imaging_quality": (0.0, 1.0, 1.0),
}
SEMANTIC = {
    "object_class": (0.0, 1.0, 1.0),
    "multiple_objects": (0.0, 1.0, 1.0),
    "human_action": (0.0, 1.0, 1.0),
    "color": (0.0, 1.0, 1.0),
    "spatial_relationship": (0.0, 1.0, 1.0),
    "scene": (0.0, 0.8222, 1.0),
    "appearance_style": (0.0009, 0.2855, 1.0),
    "temporal_style": (0.0, 0.364, 1.0),
    "overall_consistency": (0.0, 0.364, 1.0),
}
QUALITY_WEIGHT, SEMANTIC_WEIGHT = 4, 1

# VBench-2.0: every dimension on 0..1 with weight 1; Total = mean of the five category means
VBENCH2_CATEGORIES = {
    "creativity": ["Composition", "Diversity"],
    "commonsense": ["Instance_Preservation", "Motion_Rationality"],
    "controllability": [
        "Camera_Motion",
        "Complex_Landscape",
        "Complex_Plot",
        "Dynamic_Attribute",
        "Dynamic_Spatial_Relationship",
        "Human_Interaction",
        "Motion_Order_Understanding",
    ],
    "human_fidelity": ["Human_Anatomy", "Human_Clothes", "Human_Identity"],
    "physics": ["Material", "Mechanics", "Multi-View_Consistency", "Thermotics"],
}

# what each dimension reads from VBench's cache folder in local mode (vbench/utils.py: init_submodules); with no
# network its download fallback cannot work, so flowrl checks these first and names what is missing
WEIGHT_FILES = {
    "temporal_flickering": [],
    "subject_consistency": ["dino_model/facebookresearch_dino_main", "dino_model/dino_vitbase16_pretrain.pth"],
    "background_consistency": ["clip_model/ViT-B-32.pt"],
    "motion_smoothness": ["amt_model/amt-s.pth"],
    "dynamic_degree": ["raft_model/models/raft-things.pth"],
    "aesthetic_quality": ["clip_model/ViT-L-14.pt", "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth"],
    "imaging_quality": ["pyiqa_model/musiq_spaq_ckpt-358bb6af.pth"],
    "human_action": ["umt_model/l16_ptk710_ftk710_ftk400_f16_res224.pth"],
    # (ViCLIP's tokenizer vocabulary too: VBench fetches it with wget when missing)
    "temporal_style": ["ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"],
    "overall_consistency": ["ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"],
}
# these need VBench's own prompt suite (auxiliary info per prompt), which custom input has not got
STANDARD_ONLY = {"object_class", "multiple_objects", "color", "spatial_relationship", "scene", "appearance_style"}


def _normalised(score: float, bounds: tuple[float, float, float]) -> float:
    low, high, weight = bounds
    return (score - low) / (high - low) * weight


def vbench_scores(results: dict[str, float]) -> dict:
    """Quality, Semantic and Total from per-dimension scores, VBench's way: each score min-max normalised and
    weighted, a missing dimension taking the raw score 0 before normalising, as scripts/cal_final_score.py fills it
    (so below 0 where the dimension's minimum is above 0); `missing` lists them: the aggregates then say little."""

    def group(table):
        return sum(_normalised(results.get(d, 0.0), bounds) for d, bounds in table.items()) / sum(
            weight for _, _, weight in table.values()
        )

    quality, semantic = group(QUALITY), group(SEMANTIC)
    total = (QUALITY_WEIGHT * quality + SEMANTIC_WEIGHT * semantic) / (QUALITY_WEIGHT + SEMANTIC_WEIGHT)
    missing = [d for d in (*QUALITY, *SEMANTIC) if d not in results]
    return {"quality_score": quality, "semantic_score": semantic, "total_score": total, "missing": missing}


def vbench2_scores(results: dict[str, float]) -> dict:
    """VBench-2.0: each category the plain mean of its dimensions (a missing one counting 0), Total the mean of the
    five categories."""
    categories = {name: sum(results.get(d, 0.0) for d in dims) / len(dims) for name, dims in VBENCH2_CATEGORIES.items()}
    missing = [d for dims in VBENCH2_CATEGORIES.values() for d in dims if d not in results]
    return {
        **{f"{name}_score": value for name, value in categories.items()},
        "total_score": sum(categories.values()) / len(categories),
        "missing": missing,
    }


def parse_results(path: Path) -> dict:
    """A VBench / VBench-2.0 `<name>_eval_results.json` ({dim: [score, [{video_path, video_results}, ...]]}) ->
    flowrl's eval JSON: per-dimension scores, per-video scores and the suite's aggregate."""
    try:
        raw = json.loads(Path(path).read_text())
        scores = {d: float(v[0]) for d, v in raw.items()}
        per_video = {
            d: [{"video": Path(r["video_path"]).name, "score": r["video_results"]} for r in v[1]]
            for d, v in raw.items()
        }
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:  # e.g. *_full_info.json
        raise UserError(
            f"{path}: expected VBench's results JSON ({{dimension: [score, [{{video_path, "
            f"video_results}}, ...]]}}): {error}"
        ) from None
    vbench2 = {d for dims in VBENCH2_CATEGORIES.values() for d in dims}
    if scores and set(scores) <= vbench2:
        return {"suite": "vbench2", "dimensions": scores, **vbench2_scores(scores), "per_video": per_video}
    unknown = set(scores) - set(QUALITY) - set(SEMANTIC)
    if unknown:
        raise UserError(f"{path}: unknown VBench dimensions {sorted(unknown)}")
    return {"suite": "vbench", "dimensions": scores, **vbench_scores(scores), "per_video": per_video}


def check_dimensions(dimensions: list[str], cache_dir: Path) -> None:
    """One clear error for a dimension custom input cannot run or whose weights are not in the cache folder."""
    for dimension in dimensions:
        if dimension in STANDARD_ONLY:
            raise UserError(
                f"--dimensions: {dimension} needs VBench's own prompt suite (auxiliary info per prompt); "
                f"custom samples can be scored on {sorted(WEIGHT_FILES)}"
            )
        if dimension not in WEIGHT_FILES:
            raise UserError(
                f"--dimensions: unknown VBench dimension {dimension!r}; expected some of {sorted(WEIGHT_FILES)}"
            )
        missing = [f for f in WEIGHT_FILES[dimension] if not (cache_dir / f).exists()]
        if missing:
            raise UserError(
                f"--dimensions {dimension}: model weights not found: {cache_dir / missing[0]} (VBench "
                f"reads them from --vbench-cache, default $VBENCH_CACHE_DIR or ~/.cache/vbench; "
                f"place the files there, nothing can be downloaded)"
            )


def write_custom_input(samples_dir: Path, records: list[dict], out: Path) -> dict[str, str]:
    """Link every clip of a samples folder into `out` (VBench scores every video file in its folder, and a
    `flowrl sample` folder also holds GIF previews); `records` as `read_records` gives them; returns {file name:
    prompt} for VBench's prompt_list."""
    out.mkdir(parents=True, exist_ok=True)
    prompts = {}
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("file"), str) or not isinstance(record.get("prompt"), str):
            raise UserError(f"{samples_dir / 'samples.jsonl'} line {number}: expected 'file' and 'prompt' strings")
        if record.get("modality") != "video":  # records as read_records gives them
            raise UserError(f"{samples_dir}: {record['file']} is not a video; VBench scores clips (MP4)")
        relative = Path(record["file"])
        if relative.is_absolute() or ".." in relative.parts:
            raise UserError(
                f"{samples_dir / 'samples.jsonl'} line {number}: {record['file']} is not a path inside {samples_dir}"
            )
        name = "__".join(relative.parts)  # one folder for VBench: clips in subfolders keep apart
        if name in prompts:
            raise UserError(f"{samples_dir / 'samples.jsonl'} line {number}: {record['file']} is listed twice")
        target = out / name
        if target.is_symlink() or target.exists():  # a link left from another folder's run
            target.unlink()
        os.symlink((samples_dir / record["file"]).resolve(), target)
        prompts[name] = record["prompt"]
    return prompts


def default_python() -> str | None:
    return os.environ.get("FLOWRL_VBENCH_PYTHON")


def run_vbench(
    samples_dir, dimensions: list[str], python: str | None = None, cache_dir: str | None = None, device: str = "cpu"
) -> dict:
    """Score a `flowrl sample` folder of clips with the real vbench package (flowrl's eval JSON, see
    `parse_results`)."""
    from flowrl.sample_io import read_records

    samples_dir = Path(samples_dir)
    python = python or default_python()
    if not python:
        raise UserError(
            "eval vbench: no VBench environment; create one with `flowrl eval vbench --make-env DIR` "
            "and pass --python DIR/bin/python (or set FLOWRL_VBENCH_PYTHON)"
        )
    if not Path(python).is_file():
        raise UserError(
            f"--python: {python} does not exist; expected the python of a VBench environment "
            "(`flowrl eval vbench --make-env DIR` creates one)"
        )
    cache = Path(cache_dir or os.environ.get("VBENCH_CACHE_DIR") or Path.home() / ".cache" / "vbench")
    check_dimensions(dimensions, cache)
    records = read_records(samples_dir)  # the records only: VBench decodes the clips itself
    with tempfile.TemporaryDirectory(prefix="flowrl_vbench_") as work:
        work = Path(work)
        prompts = write_custom_input(samples_dir, records, work / "videos")
        request = {
            "videos": str(work / "videos"),
            "output": str(work / "results"),
            "name": "flowrl",
            "dimensions": dimensions,
            "prompts": prompts,
            "device": device,
        }
        (work / "request.json").write_text(json.dumps(request))
        env = {**os.environ, "VBENCH_CACHE_DIR": str(cache), "PYTHONNOUSERSITE": "1"}
        runner = Path(__file__).with_name("vbench_runner.py")
        done = subprocess.run(
            [python, str(runner), str(work / "request.json")], env=env, cwd=work, capture_output=True, text=True
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise UserError(f"eval vbench: the vbench run in {python} failed (exit {done.returncode}):\n{tail}")
        result = parse_results(work / "results" / "flowrl_eval_results.json")
    result["protocol"] = {"vbench": VBENCH_VERSION, "mode": "custom_input", "videos": len(records), "device": device}
    return result


def make_environment(env_dir) -> Path:
    """Create VBench's environment: a venv that sees flowrl's interpreter's packages (torch, torchvision, opencv,
    decord come from there) and installs vbench with its own pins over them. Returns its python."""
    env_dir = Path(env_dir)
    if env_dir.exists() and any(env_dir.iterdir()):
        raise UserError(f"--make-env: {env_dir} exists and is not empty; expected a new folder")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    # numpy < 2 is vbench's own pin; stated again so pip does not keep the shared numpy 2
    # pip's notes that the shared packages' own pins (flowrl's, diffusers') are broken inside this environment are
    # expected and kept out of sight; its output is shown when it fails
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"vbench=={VBENCH_VERSION}", "numpy<2", "decord"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        raise UserError(f"--make-env: pip could not install vbench=={VBENCH_VERSION} into {env_dir}:\n{tail}")
    return python


def format_scores(result: dict) -> str:
    lines = [f"{d:<28}{v:8.4f}" for d, v in result["dimensions"].items()]
    keys = [k for k in result if k.endswith("_score")]
    lines += [f"{k:<28}{result[k]:8.4f}" for k in keys]
    if result["missing"]:
        lines.append(
            f"({len(result['missing'])} dimensions missing: each counts as a raw score of 0, as VBench's "
            "cal_final_score.py fills it; the aggregates are not comparable with a run of every dimension)"
        )
    return "\n".join(lines)
