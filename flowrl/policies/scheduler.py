"""The scheduler a policy samples and trains with: the pipeline's own when it is the family's sampler's, else the
family's sampler on the shipped scheduler's config, with a logged note (never silently)."""

from __future__ import annotations

import copy
import inspect
import logging


def sampling_scheduler(shipped, sampler_scheduler: str, pipeline_name: str):
    """The scheduler flowrl's steps follow for a `pipeline_name` pipeline shipped with scheduler `shipped`: a copy of
    it when it is a `sampler_scheduler` (a diffusers class name: the family's), else a new `sampler_scheduler` on
    the shipped config (`scheduler_config`), with a warning that outputs differ from the pipeline's own sampler."""
    import diffusers

    if type(shipped).__name__ == sampler_scheduler:
        return copy.deepcopy(shipped)
    cls = getattr(diffusers, sampler_scheduler)
    accepted = inspect.signature(cls.__init__).parameters
    switched = cls.from_config({k: v for k, v in scheduler_config(shipped.config).items() if k in accepted})
    logging.getLogger("flowrl").warning(
        "%s ships %s; flowrl samples and trains with %s steps on its config (outputs differ from the "
        "pipeline's own sampler by the solver's order)",
        pipeline_name,
        type(shipped).__name__,
        sampler_scheduler,
    )
    return switched


def scheduler_config(config) -> dict:
    """The shipped scheduler's `config` as the sampling scheduler reads it (UniPC's flow_shift is Euler's shift)."""
    config = dict(config)
    if "flow_shift" in config and config.get("use_flow_sigmas", True):
        config["shift"] = config["flow_shift"]
    return config
