"""FK steering's flags on `flowrl sample` (--fk-particles, --fk-lambda, ...): registered by `add_arguments`, their
reward checked before the pipeline loads (`check_reward`), and made into the steer `flowrl sample` draws with
(`steer`). The steering itself is flowrl/fk.py."""

from __future__ import annotations


def add_arguments(parser) -> None:
    """Add FK steering's flags to `flowrl sample`'s parser (0 particles: no steering)."""
    from flowrl.fk import POTENTIALS

    parser.add_argument("--fk-particles", type=int, default=0, help="FK steering with K particles per sample")
    parser.add_argument("--fk-lambda", type=float, default=10.0)
    parser.add_argument("--fk-potential", default="diff", choices=list(POTENTIALS))
    parser.add_argument("--fk-every", type=int, default=2, help="steps between scheduled resamplings")
    parser.add_argument("--fk-reward", default="shapes_clip", help="reward the particles are steered towards")
    parser.add_argument(
        "--fk-reward-params",
        default="{}",
        help='the FK reward\'s parameters as JSON (e.g. \'{"path": "models/PickScore_v1"}\')',
    )


def check_reward(args) -> None:
    """With --fk-particles, a UserError for a wrong --fk-reward name or folder, or --fk-reward-params that are not a
    JSON object, before the pipeline loads (minutes for a large one)."""
    if args.fk_particles:
        from flowrl.cli.arguments import json_object
        from flowrl.rewards import check_reward as check

        check(args.fk_reward, json_object(args.fk_reward_params, "--fk-reward-params"), "--fk-reward")


def steer(args, policy, device):
    """The FK steer the flags ask for (None without --fk-particles): `FKSteer` with its reward built on `device` and
    bound to `policy`; a ConfigError naming the --fk flag out of range."""
    if not args.fk_particles:
        return None
    from flowrl.cli.arguments import json_object
    from flowrl.fk import FKConfig, FKSteer
    from flowrl.rewards import build_reward

    fk = FKConfig(
        num_particles=args.fk_particles,
        lam=args.fk_lambda,
        potential=args.fk_potential,
        resample_every=args.fk_every,
    )
    fk.validate("--fk")
    params = json_object(args.fk_reward_params, "--fk-reward-params")
    fk_reward = build_reward(args.fk_reward, where="--fk-reward", **params).to(device)
    fk_reward.bind_policy(policy)
    return FKSteer(fk, fk_reward)
