"""Training-variance plans: from the config's `training_variance` section to single runs.

A *plan* trains one model N times per *arm* on each of its devices. An arm says, for each
source of randomness, whether its seed is the same in every run (``fixed``) or differs
(``per_run``: seed + run), and whether the backend's op determinism is on:

==============  =====  ==========  ============  =======  =============
arm             init   data order  augmentation  dropout  deterministic
==============  =====  ==========  ============  =======  =============
algo_impl       run    run         run           run      no
algo            run    run         run           run      yes
impl            fixed  fixed       fixed         fixed    no
control         fixed  fixed       fixed         fixed    yes
same            fixed  fixed       fixed         fixed    plan's setting
different       run    run         run           run      plan's setting
==============  =====  ==========  ============  =======  =============

``algo_impl``..``control`` are Zhuang et al.'s ALGO+IMPL, ALGO, IMPL and CONTROL;
``same``/``different`` are Morin & Willetts' same and different seeds (seeds s..s+N-1).
Any other arm name gives every switch itself. The `ensemble` section becomes one plan per
learning rate whose arms are fixed/random init x fixed/random batches (hardware proposal,
Figure S4), with and without deterministic ops.
"""

from __future__ import annotations

import copy

from bitdrift.errors import PlanError
from bitdrift.run.training import SOURCES, run_seeds  # noqa: F401 (run_seeds: part of a plan's API)

ARMS = {
    "algo_impl": dict.fromkeys(SOURCES, "per_run") | {"deterministic": False},
    "algo": dict.fromkeys(SOURCES, "per_run") | {"deterministic": True},
    "impl": dict.fromkeys(SOURCES, "fixed") | {"deterministic": False},
    "control": dict.fromkeys(SOURCES, "fixed") | {"deterministic": True},
    "same": dict.fromkeys(SOURCES, "fixed"),
    "different": dict.fromkeys(SOURCES, "per_run"),
}
ARM_LABELS = {"algo_impl": "ALGO+IMPL", "algo": "ALGO", "impl": "IMPL", "control": "CONTROL",
              "same": "same seed", "different": "different seeds"}
def arm_switches(name: str, overrides: dict, plan_deterministic: bool) -> dict:
    """Every switch of an arm: a preset's, replaced by the ones the config gives."""
    switches = dict(ARMS.get(name, {}))
    switches.update(overrides)
    switches.setdefault("deterministic", plan_deterministic)
    missing = [key for key in (*SOURCES, "deterministic") if key not in switches]
    if missing:
        raise PlanError(f"arm {name!r} is not a preset ({', '.join(ARMS)}), so it must set "
                        f"{', '.join(missing)}")
    return switches


def ensemble_arm(init: str, batches: str, deterministic: bool) -> str:
    return f"{init}_init_{batches}_batches" + ("_deterministic" if deterministic else "")


def ensemble_plan_name(rate: float, momentum: float) -> str:
    return f"ensemble_lr_{rate:g}_momentum_{momentum:g}"


def _ensemble_plans(ensemble: dict, models: dict) -> dict:
    model = models[ensemble["model"]]
    plans = {}
    for momentum in ensemble["momentum"]:
        rates = list(ensemble["learning_rates"])
        if momentum > 0 and ensemble.get("matched_step", True):
            # Momentum m multiplies the effective step by 1 / (1 - m): lr x (1 - m) with
            # momentum steps as far as plain SGD at lr, so the two differ in momentum only.
            rates += [matched for rate in ensemble["learning_rates"]
                      if (matched := float(f"{rate * (1 - momentum):.6g}")) not in rates]
        for rate in rates:
            arms = {}
            for deterministic in ensemble["deterministic"]:
                for init in ("fixed", "random"):
                    for batches in ("fixed", "random"):
                        arms[ensemble_arm(init, batches, deterministic)] = {
                            "init": "fixed" if init == "fixed" else "per_run",
                            "data_order": "fixed" if batches == "fixed" else "per_run",
                            "augmentation": "fixed", "dropout": "fixed",
                            "deterministic": deterministic,
                        }
            # Plain SGD, with or without momentum (the proposal reproduces Figure S4 with
            # both because they disagreed), and no augmentation, as the proposal asks.
            spec = copy.deepcopy(model) | {"optimizer": "sgd", "momentum": momentum,
                                           "learning_rate": rate, "augmentation": {}}
            plans[ensemble_plan_name(rate, momentum)] = {
                "study": "ensemble", "model": ensemble["model"], "spec": spec,
                "runs": ensemble["members"], "seed": ensemble["seed"],
                "devices": list(ensemble["devices"]), "arms": arms,
                "resources": ensemble.get("resources", {}),
            }
    return plans


def resolve_plans(config: dict) -> dict:
    """Every plan of a validated config, with arms resolved to their switches."""
    section = config.get("training_variance")
    if not section:
        return {}
    models = section["models"]
    plans = {}
    for name, plan in section.get("plans", {}).items():
        plans[name] = {
            "study": "plan", "model": plan["model"], "spec": copy.deepcopy(models[plan["model"]]),
            "runs": plan["runs"], "seed": plan["seed"], "devices": list(plan["devices"]),
            "arms": {arm: arm_switches(arm, overrides or {}, plan["deterministic"])
                     for arm, overrides in plan["arms"].items()},
            "resources": plan.get("resources", {}),
        }
    if section.get("ensemble"):  # names checked against the plans' by the config check
        plans.update(_ensemble_plans(section["ensemble"], models))
    return plans


def plan_runs(plans: dict) -> list[tuple[str, str, str, int]]:
    """(plan, arm, device, run) of every training run, in config order."""
    return [(name, arm, device, run) for name, plan in plans.items() for arm in plan["arms"]
            for device in plan["devices"] for run in range(plan["runs"])]




def gallery_plan(config: dict, plans: dict) -> tuple[str | None, str | None, int]:
    """(plan, arm, k) of the divergent-examples gallery: the config's choice, else the
    first plan with two runs or more (None when there is none)."""
    choice = (config.get("training_variance") or {}).get("divergence", {})
    plan = choice.get("plan") or next(
        (name for name, entry in plans.items() if entry["runs"] >= 2
         or len(entry["devices"]) >= 2), None)
    return plan, choice.get("arm"), choice.get("top_k", 16)
