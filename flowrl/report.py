"""Run-dir outputs people read: metrics.csv, TensorBoard events, a reward-curve PNG, a before/after grid and
report.html."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import platform
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from flowrl.atomic import write_whole


def cpu_model() -> str:
    """The CPU's model name (lscpu), for timings: per-update costs differ widely between CPU models."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


class MetricsLog:
    """Appends one row per update to metrics.csv (columns grow as new metrics appear), to TensorBoard, and to
    Weights & Biases when `wandb` is given (its init arguments; offline unless WANDB_MODE says otherwise)."""

    def __init__(
        self, run_dir: Path, tensorboard: bool = True, wandb: dict | None = None, resumed_at: int | None = None
    ):
        self.path = run_dir / "metrics.csv"
        self.rows = self._read()
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # a resumed run drops an abandoned attempt's events past its checkpoint, as metrics.csv its rows
                purge = resumed_at + 1 if resumed_at is not None else None
                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
            except ImportError:  # tensorboard is a core dependency; keep training if a user removed it
                self.writer = None
        self.wandb = None
        if wandb is not None:
            import os

            try:
                import wandb as wandb_module
            except ImportError:
                from flowrl.errors import ConfigError

                raise ConfigError("run.wandb: the wandb package is not installed (pip install wandb)") from None
            self.wandb = wandb_module.init(dir=str(run_dir), mode=os.environ.get("WANDB_MODE", "offline"), **wandb)

    def _read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with self.path.open() as f:
            return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]

    def append(self, update: int, metrics: dict) -> None:
        row = {"update": update, **{k: float(v) for k, v in metrics.items()}}
        self.rows = [r for r in self.rows if int(r["update"]) < update] + [row]  # a resumed run rewrites its tail
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self.rows)
        write_whole(self.path, text.getvalue())
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, float(value), update)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log({k: float(v) for k, v in metrics.items()}, step=update)

    def add_image(self, tag: str, image: np.ndarray, update: int) -> None:
        """A uint8 [H, W, 3] image (e.g. a grid of eval samples) at `update`."""
        if self.writer is not None:
            self.writer.add_image(tag, image, update, dataformats="HWC")
            self.writer.flush()
        if self.wandb is not None:
            import wandb

            self.wandb.log({tag: wandb.Image(image)}, step=update)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def t_quantile(n: int) -> float:
    """The 97.5% quantile of Student's t with n - 1 degrees of freedom: a 95% interval's half-width over n training
    seeds is this times their standard error (4.30 for 3 seeds, where 1.96 would understate it 2.2x)."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def t_half_width(values, axis: int = 0):
    """The 95% interval's half-width of the mean of `values` over `axis` (one entry per training seed): t_quantile(n)
    times their standard error; a float for 1-D values, an array otherwise, None for fewer than two seeds."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    if n < 2:
        return None
    half = t_quantile(n) * values.std(axis=axis, ddof=1) / np.sqrt(n)
    return float(half) if np.ndim(half) == 0 else half


@contextmanager
def figure(path: Path, *grid: int, title: str | None = None, dpi: int = 110, **subplots):
    """`with figure(path, 1, 2, figsize=(11, 4)) as (fig, axes):` draws on a headless matplotlib figure that is laid
    out, titled and written to `path` when the block ends (and closed either way, so long runs hold no figures)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, dpi=dpi, **subplots)
    try:
        yield fig, axes
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def plot_rewards(
    rows: list[dict], path: Path, evals: dict | None = None, title: str = "reward", eval_label: str = "eval (overall)"
) -> None:
    with figure(path, figsize=(6, 3.6), dpi=120) as (fig, ax):
        updates = [r["update"] for r in rows]
        ax.plot(updates, [r["reward_mean"] for r in rows], color="#bbbbbb", lw=1, label="train reward (per update)")
        if len(rows) >= 5:
            k = max(2, len(rows) // 10)
            smooth = np.convolve([r["reward_mean"] for r in rows], np.ones(k) / k, mode="valid")
            ax.plot(updates[k - 1 :], smooth, color="#1f77b4", lw=2, label=f"train reward ({k}-update mean)")
        if evals:
            xs, ys = zip(*sorted((int(u), e["overall"]) for u, e in evals.items()))
            ax.plot(xs, ys, "o-", color="#d62728", label=eval_label)
        ax.set_xlabel("update")
        ax.set_ylabel("score")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def tile(images: np.ndarray, columns: int = 4, gap: int = 2) -> np.ndarray:
    """uint8 [N, h, w, 3] stills (e.g. `Samples.preview()`) laid out `columns` per row on white."""
    n, h, w = images.shape[:3]
    rows = -(-n // columns)
    canvas = np.full((rows * (h + gap) - gap, min(n, columns) * (w + gap) - gap, 3), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        canvas[r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = image
    return canvas


def image_grid(
    columns: list[np.ndarray], labels: list[str], row_titles: list[str], path: Path, scale: int = 4, max_cell: int = 256
) -> None:
    """A labelled grid: columns[c][r] is the uint8 image at row r, column c; small images are enlarged `scale`
    times, and no cell's longer side exceeds `max_cell` pixels (a 1024 px run's grid stays a few MB). Columns may
    differ in shape (an image-to-video run's first frame beside its clips' frame strips): each keeps its own aspect
    ratio at the one scale factor."""
    rows = len(row_titles)
    shapes = [column[0].shape[:2] for column in columns]
    factor = min(scale, max_cell / max(max(shape) for shape in shapes))
    cells = [(max(1, round(w * factor)), max(1, round(h * factor))) for h, w in shapes]
    lefts = [260 + sum(w + 4 for w, _ in cells[:c]) for c in range(len(cells))]
    cell_h, head_h = max(h for _, h in cells), 20
    resample = Image.NEAREST if factor >= 1 else Image.LANCZOS
    canvas = Image.new("RGB", (lefts[-1] + cells[-1][0] + 4, head_h + rows * (cell_h + 4)), "white")
    draw = ImageDraw.Draw(canvas)
    for left, label in zip(lefts, labels):
        draw.text((left + 4, 4), label, fill="black")
    for r, title in enumerate(row_titles):
        draw.text((4, head_h + r * (cell_h + 4) + cell_h // 2 - 6), title[:42], fill="black")
        for c, (left, size) in enumerate(zip(lefts, cells)):
            canvas.paste(Image.fromarray(columns[c][r]).resize(size, resample), (left, head_h + r * (cell_h + 4)))
    canvas.save(path)


def write_report(
    run_dir: Path,
    config_text: str,
    before: dict | None,
    after: dict | None,
    rows: list[dict],
    notes: list[str] = (),
    metric_name: str = "eval metric",
    clips: list[tuple[str, str, str]] = (),
    grid: bool = True,
) -> Path:
    """report.html: the before/after table, the plots and the config, self-contained beside the PNGs; for video
    runs `clips` (prompt, MP4, GIF paths relative to the run folder) play base | tuned side by side; `grid`: whether
    this run wrote before_after.png (not without evaluations)."""
    from flowrl.tasks.base import interval

    def cell(result: dict, tag: str | None) -> str:
        value = number(result["overall"] if tag is None else result["tags"].get(tag))
        spread = interval(result, tag)
        if math.isnan(spread):  # one prompt (or one image per prompt): nothing estimates it
            return f"{value:.3f} &plusmn; n/a"
        return f"{value:.3f}" + (f" &plusmn; {spread:.3f}" if spread else "")

    def table() -> str:
        if not before or not after:
            return "<p>No evaluation recorded.</p>"
        out = ["<table><tr><th>tag</th><th>base</th><th>tuned</th><th>change</th></tr>"]
        for tag in before["tags"]:
            b, a = number(before["tags"][tag]), number(after["tags"].get(tag))
            out.append(
                f"<tr><td>{html.escape(str(tag))}</td><td>{cell(before, tag)}</td><td>{cell(after, tag)}</td>"
                f"<td>{a - b:+.3f}</td></tr>"
            )
        b, a = number(before["overall"]), number(after["overall"])
        out.append(
            f"<tr><th>overall</th><th>{cell(before, None)}</th><th>{cell(after, None)}</th><th>{a - b:+.3f}</th>"
            "</tr></table><p>&plusmn;: 95% interval (1.96 standard errors, the task's conditions as the sampling "
            "unit).</p>"
        )
        return "\n".join(out)

    minutes = sum(r.get("seconds", 0) for r in rows) / 60
    clip_section = (
        ""
        if not clips
        else "<h2>Clips: base | tuned</h2>"
        + "".join(
            f'<figure><img src="{html.escape(gif)}" style="image-rendering:pixelated;height:96px">'
            f'<figcaption>{html.escape(prompt)} (<a href="{html.escape(mp4)}">MP4</a>)</figcaption></figure>'
            for prompt, mp4, gif in clips
        )
    )
    body = f"""<!doctype html><html><head><meta charset="utf-8"><title>flowrl run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}td,th{{padding:2px 10px;text-align:right}}
pre{{background:#f4f4f4;padding:1em;overflow:auto}}</style></head><body>
<h1>flowrl run: {html.escape(run_dir.name)}</h1>
<p>{len(rows)} updates, {minutes:.1f} minutes of training (rollout + update).</p>
<h2>Eval set: {html.escape(metric_name)} (same seeds before and after)</h2>{table()}
{"".join(f"<p>{html.escape(n)}</p>" for n in notes)}
<h2>Reward</h2><img src="reward_curve.png">
{'<h2>Base vs tuned (same prompt, same seed)</h2><img src="before_after.png">' if grid else ""}
{clip_section}
<h2>Config</h2><pre>{html.escape(config_text)}</pre></body></html>"""
    path = run_dir / "report.html"
    path.write_text(body, encoding="utf-8")  # (its meta charset; prompts may hold any script)
    return path


def save_json(path: Path, data) -> None:
    """`data` as JSON, a NaN (an interval nothing estimates) written as null: bare NaN is not JSON (jq, browsers)."""
    write_whole(path, json.dumps(finite_or_none(data), indent=2) + "\n")


def finite_or_none(data):
    """`data` with every non-finite float replaced by None, recursively."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite_or_none(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_or_none(v) for v in data]
    return data


def number(value) -> float:
    """A figure read back from JSON: None (what save_json writes for NaN) as NaN again, so it still formats."""
    return float("nan") if value is None else float(value)
