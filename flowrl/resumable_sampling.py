"""`flowrl sample` as a job that survives its size: samples go to disk batch by batch (a VBench or GenEval set at
full resolution does not fit in host memory), a rerun with the same settings resumes where an interrupted one
stopped, and under torchrun / accelerate launch every process draws a contiguous share of what is left.

The folder holds `sampling.json` (the settings that fix every sample: pipeline, checkpoint, steps, ...), each
process's progress lines (`.progress-RANK.jsonl`, one per written sample, flushed per batch) and, once every
sample is written, `samples.jsonl` in sample order (what `flowrl eval` reads); the progress files then go.
Sample k of prompt p keeps its seed whatever is resumed or shared, so its noise never changes; which samples
share a batch does, and with it the last bits of float rounding (and an FK steer's resampling draws).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flowrl.atomic import write_whole
from flowrl.errors import UserError
from flowrl.inference import contiguous_share, sample_chunks, sample_seeds
from flowrl.sample_io import INDEX_FILE, index_line

SETTINGS_FILE = "sampling.json"
PROGRESS_GLOB = ".progress-*.jsonl"


def draw_samples(
    policy, conditions: list, num_per_prompt: int, seed: int, folder: Path, settings: dict, state, **sampling
) -> Path:
    """Draw num_per_prompt samples of every condition into `folder` (what is not there yet, this process's share
    of it; `state`: accelerate's PartialState) and, on the main process, write the index once all are there.
    `sampling`: inference.sample_chunks's settings (steps, guidance, spec, kind, noise, batch size, steer)."""
    items = [item for item in conditions for _ in range(num_per_prompt)]
    seeds = sample_seeds(seed, len(conditions), num_per_prompt)
    planned = [plan_key(item, s) for item, s in zip(items, seeds)]
    main = state.is_main_process
    if main:  # a new (or empty) folder starts; one with sampling.json resumes
        check_sample_folder(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # what the check cannot foresee: a read-only or special file system, a race
            raise UserError(f"--out {folder} cannot be created: {error.strerror} ({error.filename})") from None
        resume_or_start(
            folder / SETTINGS_FILE,
            settings,
            "delete the folder or choose another --out",
            [folder / INDEX_FILE, *folder.glob(PROGRESS_GLOB)],
        )
    state.wait_for_everyone()
    done = written_samples(folder, planned)
    state.wait_for_everyone()  # every process has read what is done before any writes more
    todo = [n for n in range(len(planned)) if n not in done]
    index = folder / INDEX_FILE
    if main and todo and index.is_file():  # a finished folder drawing again (an edited prompt file): its index would
        # name redrawn files with their old prompts until the end; its still-valid lines wait in a progress file
        with appending(folder / ".progress-kept.jsonl") as kept:
            kept.write("".join(json.dumps(line, default=str) + "\n" for line in done.values()))
        index.unlink()
    mine = [todo[i] for i in contiguous_share(len(todo), state.process_index, state.num_processes)]
    if done and main:
        print(f"{len(done)} of {len(planned)} samples already in {folder}; drawing the other {len(todo)}")
    if state.num_processes > 1:
        print(f"process {state.process_index} of {state.num_processes}: drawing {len(mine)} samples", flush=True)
    chunks = sample_chunks(
        policy,
        [items[n] for n in mine],
        1,
        seeds=[seeds[n] for n in mine],
        desc="sampling" if main else None,
        **sampling,
    )
    draw_into(folder, chunks, mine, [items[n] for n in mine], state.process_index, policy.fps, policy.modality)
    state.wait_for_everyone()
    if not main:
        return folder / INDEX_FILE
    index = finish(folder, planned)
    print(f"wrote {len(planned)} {policy.modality} samples and {index.name} to {folder}")
    return index


def plan_key(item, seed: int) -> str:
    """What a sample is drawn from (prompt, prompt-file fields, seed) as one text, kept in its index line as "plan":
    a rerun counts the sample written only when this is unchanged (an edited .jsonl line is drawn again). JSON text,
    anything else as text, so values JSON changes (tuples, numpy numbers, NaN) still compare equal."""
    return json.dumps([item.prompt, seed, item.meta], sort_keys=True, default=str)


def appending(path: Path):
    """`path` opened for appending lines; a last line an interruption cut short is ended first, so the next line
    starts on its own (the cut one is then skipped as unreadable)."""
    cut = path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    handle = path.open("a")
    if cut:
        handle.write("\n")
    return handle


def check_sample_folder(folder: Path) -> None:
    """`--out` must be a folder `flowrl sample` can own: new, empty, or an earlier sampling folder (sampling.json
    in it), so that starting over never deletes or overwrites files it did not write."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out {folder} is a file; pick a folder")
    if not folder.exists():  # said now, not as a traceback once the pipeline has loaded
        existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise UserError(f"--out {folder} cannot be created: {existing} is a file; pick a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"--out {folder} cannot be created: {existing} is not writable; pick a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / SETTINGS_FILE).is_file():
        raise UserError(
            f"--out {folder} is not empty and holds no {SETTINGS_FILE} (not a flowrl sample folder, or "
            f"one written before flowrl kept {SETTINGS_FILE}: delete it to draw anew); pick a new or empty "
            f"folder"
        )


def resume_or_start(path: Path, settings: dict, remedy: str, stale: list[Path]) -> None:
    """Resume the work the settings file `path` describes when it records `settings`; with no settings file, start
    over: remove the `stale` files and record `settings`. Other settings are an error naming them, then `remedy`,
    rather than a mix of two runs' results."""
    if check_settings(path, settings, remedy):
        return
    for file in stale:
        file.unlink(missing_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")


def json_lines(path: Path) -> list[dict]:
    """The JSON lines of `path` that read whole (a line an interruption cut short is skipped)."""
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def check_settings(path: Path, settings: dict, remedy: str) -> bool:
    """Whether the settings file `path` records `settings` (so a rerun resumes the work it describes); False when
    there is none; other settings are an error naming them, then `remedy`, rather than a mix of two runs' results."""
    if not path.is_file():
        return False
    try:
        old = json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{path} is not readable as JSON; {remedy}") from None
    changed = sorted(k for k in old.keys() | settings.keys() if old.get(k) != settings.get(k))
    if changed:
        raise UserError(
            f"{path} records other settings ("
            + "; ".join(f"{k}: {old.get(k)!r}, now {settings.get(k)!r}" for k in changed)
            + f"); {remedy}"
        )
    return True


def written_samples(folder: Path, planned: list[str]) -> dict[int, dict]:
    """The index lines of samples already on disk that are the `planned` ones (the same plan key at that index, every
    file present): from a finished samples.jsonl and from any process's progress lines (a line cut short by an
    interruption is skipped)."""
    lines = []
    index = folder / INDEX_FILE
    if index.is_file():
        lines += [
            {**json.loads(line), "index": n} for n, line in enumerate(index.read_text().splitlines()) if line.strip()
        ]
    for progress in sorted(folder.glob(PROGRESS_GLOB)):
        lines += json_lines(progress)
    done = {}
    for line in lines:
        n = line.get("index")
        if not isinstance(n, int) or not 0 <= n < len(planned):
            continue
        files = [line.get("file"), *line.get("extra_files", [])]
        if line.get("plan") == planned[n] and all(isinstance(f, str) and (folder / f).is_file() for f in files):
            done[n] = line
    return done


def draw_into(folder: Path, chunks, indices: list[int], items: list, rank: int, fps: int, modality: str) -> None:
    """Write what `chunks` (inference.sample_chunks over the condition `items` of the samples `indices`, in order)
    yields: each sample's files as `{index:05d}.*`, then its line (the condition's fields, the sample's record and
    its plan key) in this process's progress file, flushed after every batch."""
    from flowrl.faults import fault_point
    from flowrl.sample_io import as_samples

    position = batches = 0
    with appending(folder / f".progress-{rank}.jsonl") as progress:
        for decoded, records in chunks:
            samples = as_samples(decoded, fps=fps, modality=modality)
            for j, record in enumerate(records):
                n = indices[position]
                files = samples.write(folder, f"{n:05d}", j)
                item = items[position]
                line = index_line(samples, {**item.meta, **record, "plan": plan_key(item, record["seed"])}, files)
                progress.write(json.dumps({**line, "index": n}, default=str) + "\n")
                position += 1
            progress.flush()
            batches += 1
            fault_point("sample", batches)


def finish(folder: Path, planned: list[str]) -> Path:
    """samples.jsonl in sample order once every planned sample is on disk; the progress files are removed."""
    done = written_samples(folder, planned)
    missing = [n for n in range(len(planned)) if n not in done]
    if missing:
        raise UserError(
            f"--out {folder}: {len(missing)} of {len(planned)} samples were not written (first: "
            f"{missing[0]}); run the same command again to draw them"
        )
    index = folder / INDEX_FILE
    write_whole(
        index,
        "".join(json.dumps({k: v for k, v in done[n].items() if k != "index"}) + "\n" for n in range(len(planned))),
    )  # a reader never sees half an index
    for progress in folder.glob(PROGRESS_GLOB):
        progress.unlink()
    return index
