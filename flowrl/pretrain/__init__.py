"""`flowrl pretrain` recipes that produce the embedded default pipelines from the shapes renderer."""


def source_vae(pipeline_dir) -> str:
    """The pipeline folder whose trained VAE a recipe reuses (shapes-sd, shapes-kontext take shapes-sd3's), checked
    before training: one error naming it, not a loader's traceback (the default path is relative to the checkout)."""
    from pathlib import Path

    from ..errors import UserError

    if not (Path(pipeline_dir) / "vae" / "config.json").is_file():
        raise UserError(
            f"--pipeline {pipeline_dir}: no vae/ folder there; this recipe reuses the VAE of a shapes-sd3 "
            f"pipeline (run from the checkout's root, or pass --pipeline)"
        )
    return str(pipeline_dir)
