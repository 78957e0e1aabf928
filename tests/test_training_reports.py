"""attnbook.reports.training (chapter 11) and attnbook.reports.real_text (chapter 13), on tables built by hand
whose answers are known without the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from attnbook.reports import real_text as RT
from attnbook.reports import real_text_rebalancing as RTB
from attnbook.reports import training as TR
from attnbook.reports import key_bias as KB
from attnbook.reports import sweep as SW

# ---------------------------------------------------------------- chapter 11


def share_row(opt: str, seed: int, share: float, gradient: str = "loss", dtype: str = "float64",
              drift: float = 0.1, u: int = 4, p: int = 16) -> dict:
    return {"task": "toy", "layout": "d=4", "optimiser": opt, "gradient": gradient, "dtype": dtype, "seed": str(seed),
            "median_share": str(share), "max_share": str(share), "chance_mean": "0.5", "chance_rms": "0.5",
            "tangent_dim": str(u), "parameters": str(p), "drift_qk": str(drift), "drift_vo": str(drift),
            "diverged_at": ""}


def test_runs_are_grouped_by_setting_and_sorted_by_seed():
    rows = [share_row("adam", s, 0.1 * s) for s in (3, 1, 2)] + [share_row("sgd", 0, 0.0)]
    runs = TR.group_runs(rows)
    assert [r["seed"] for r in runs["toy", "d=4", "adam", "loss", "float64"]] == ["1", "2", "3"]
    assert TR.settings(runs) == [("toy", "d=4", "adam"), ("toy", "d=4", "sgd")]
    assert TR.problems(runs) == [("toy", "d=4")]


def test_a_share_below_chance_in_every_seed_has_an_interval_below_zero():
    rows = [share_row("adam", s, 0.2 + 0.01 * s) for s in range(10)]
    rows += [share_row("adam", s, 0.5 + 0.01 * s, gradient="random") for s in range(10)]
    runs = TR.group_runs(rows)
    (r,) = TR.share_results(runs, n_boot=200)
    with pytest.raises(ValueError, match="momentum"):
        TR.share_findings(runs, [r])
    runs = TR.group_runs(rows + [share_row("momentum", s, 0.6) for s in range(10)])
    r, m = TR.share_results(runs, n_boot=200)
    assert m.vs_chance.losses == 10 and m.vs_random is None
    assert r.vs_chance.wins == 10 and r.vs_chance.high < 0            # every seed below chance 0.5
    assert r.vs_random.median_difference == pytest.approx(-0.3)       # 0.2 + x against 0.5 + x, seed by seed
    found = TR.share_findings(runs, [r, m])
    assert found["adam-below-chance"] == 1 and found["adam-above-chance"] == 0 and found["share-runs"] == 20
    assert found["momentum-below-chance"] == 0 and found["momentum-share-max"] == pytest.approx(0.6)


def test_a_tangent_dimension_that_differs_between_seeds_is_refused():
    runs = TR.group_runs([share_row("adam", 0, 0.2), share_row("adam", 1, 0.2, u=5)])
    with pytest.raises(ValueError, match="tangent dimension differs"):
        TR.chance_levels(runs)


def model_row(opt: str, seed: int, share: float, model_share: float, gradient: str = "loss") -> dict:
    row = share_row(opt, seed, share, gradient) | {"task": "copy"}
    return row | {"median_model_share": str(model_share), "max_model_share": str(model_share),
                  "model_chance_mean": "0.8", "model_chance_rms": "0.8", "model_dim": "10"}


def test_only_problems_whose_model_adds_directions_are_measured_against_the_model_span():
    rows = [share_row("adam", s, 0.2) | {"model_dim": ""} for s in range(10)]  # teacher-student: no model columns
    rows += [model_row("adam", s, 0.25, 0.4 + 0.01 * s) for s in range(10)]
    rows += [model_row("adam", s, 0.5, 0.7, gradient="random") for s in range(10)]
    rows += [model_row("sgd", s, 1e-15, 2e-15) for s in range(10)]
    runs = TR.group_runs(rows)
    assert set(TR.chance_levels(runs)) == {("toy", "d=4"), ("copy", "d=4")}
    assert set(TR.chance_levels(runs, TR.MODEL)) == {("copy", "d=4")}
    model = TR.share_results(runs, TR.MODEL, n_boot=200)
    assert [r.optimiser for r in model] == ["adam", "sgd"] and model[0].chance.mean == 0.8
    assert TR.largest_sgd_share(runs, span=TR.MODEL) == pytest.approx(2e-15)
    found = TR.model_findings(TR.share_results(runs, n_boot=200), model)
    assert found["model-adam-below-chance"] == 1 and found["model-adam-below-random"] == 1  # 0.4 + x < 0.7 < 0.8
    assert found["model-adam-ratio-min"] == pytest.approx(0.445 / 0.8)  # the median over seeds against chance
    assert found["orbit-adam-ratio-min"] == pytest.approx(0.25 / 0.5) and found["model-u"] == 10


def test_the_fixed_time_drift_slope_of_an_exact_power_law_is_recovered():
    etas = [0.01, 0.02, 0.04, 0.08]
    table = [{"seed": str(s), "step_size": str(e), "drift_qk": str(0.5 * (s + 1) * e ** 1.5), "drift_vo": "0"}
             for s in range(3) for e in reversed(etas)]
    cons = TR.step_size_drift(table)
    assert cons.slopes == pytest.approx([1.5] * 3)
    assert list(cons.per_seed[0][0]) == etas  # sorted by step size


def test_separated_means_every_other_optimiser_above_sgds_largest():
    assert TR.separated({"sgd": np.array([0.1, 0.3]), "adam": np.array([0.31, 0.5])})
    assert not TR.separated({"sgd": np.array([0.1, 0.3]), "adam": np.array([0.29, 0.5])})


def test_key_bias_settings_are_named_as_the_experiment_names_them():
    assert KB.kb_setting("adamw", 0.01, 0.5) == "adamw lr=0.01 decay=0.5"
    assert KB.kb_setting("sgd", 0.5, sink=True) == "sgd lr=0.5 decay=0 sink"


# ---------------------------------------------------------------- chapter 13


def rt_share(seed: int, step: int, share: float, arm: str = "plain", kind: str = "total", dim: int = 3) -> dict:
    return {"layer": "0", "kind": kind, "arm": arm, "seed": str(seed), "step": str(step), "share": str(share),
            "chance": "0.25", "span_dim": str(dim), "params": "48"}


def test_seed_medians_leave_out_step_zero():
    rows = [rt_share(s, t, 0.9 if t == 0 else 0.1 * (s + 1)) for s in range(2) for t in (0, 5, 10)]
    rows += [rt_share(s, t, 0.25, arm="random-gradient") for s in range(2) for t in (0, 5, 10)]
    sh = RT.read_shares(rows)
    assert sh.later == [5, 10] and sh.parameters == 48 and sh.orbit_dim == {"total": 3}
    assert list(sh.seed_medians((0, "total"))) == pytest.approx([0.1, 0.2])
    assert sh.curves((0, "total"), [0, 1]).shape == (2, 3)


def test_shares_without_their_baseline_or_with_two_orbit_dimensions_are_refused():
    with pytest.raises(ValueError, match="random-gradient baseline"):
        RT.read_shares([rt_share(0, 0, 0.1)])
    with pytest.raises(ValueError, match="span dimension"):
        RT.read_shares([rt_share(0, 0, 0.1), rt_share(1, 0, 0.1, dim=4)])


def test_rebalancing_findings_give_the_paired_interval():
    run = {"SEEDS": list(range(8)), "STEPS": 10, "TIE_NATS": 1e-3}
    val = {(arm, s): {0: 3.0, 10: 2.0 - (0.1 if arm == "balanced" else 0.0) + 0.01 * s}
           for arm in ("plain", "balanced") for s in range(8)}
    found, s = RTB.rebalance_findings(val, run, RT.Bootstrap(resamples=200))
    assert s.median_difference == pytest.approx(-0.1) and s.wins == 8
    assert found["rt-rb-high"] < 0 and found["rt-diverged"] == 0  # balanced lower: the interval lies below zero
    assert found["rt-rb-rel"] == pytest.approx(np.median([-0.1 / (2.0 + 0.01 * s) for s in range(8)]))


def test_the_long_pair_and_the_plateau_rule():
    run = {"SEEDS": [0, 1, 2], "STEPS": 10, "LONG_STEPS": 40, "PLATEAU_WINDOW": 20, "PLATEAU_NATS": 0.02, "TIE_NATS": 1e-3}
    val = {("long-plain", s): {10: 3.0, 20: 2.0, 30: 1.995, 40: 1.99} for s in range(3)}
    val |= {("long-balanced", s): {t: v + 0.1 for t, v in val["long-plain", s].items()} for s in range(3)}
    found, s = RTB.rebalance_findings(val, run, RT.Bootstrap(resamples=200), long=True)
    assert found["rt-long-rb-median"] == pytest.approx(0.1) and found["rt-long-rb-losses"] == 3
    plateau = RTB.plateau_findings(val, run)
    assert plateau["rt-plateau-fall"] == pytest.approx(0.01) and plateau["rt-plateau-reached"]
    assert not RTB.plateau_findings(val, run | {"PLATEAU_NATS": 0.005})["rt-plateau-reached"]
    with pytest.raises(ValueError, match="multiple"):
        RTB.plateau_findings(val, run | {"PLATEAU_WINDOW": 25})


def _drift_rows(arm: str, seed: int, ratio: float, vo: float | None = None) -> list[dict]:
    vo = ratio if vo is None else vo  # C_VO's ratio (C_QK's is ``ratio``); the Grams' drift is 1
    cols = dict(zip(RT.DRIFT_COLUMNS, ["1", "1", "1", "1", str(ratio), str(vo), "1", "1"]))
    return [{"arm": arm, "dtype": "float32", "seed": str(seed), "layer": "0", "step": str(t)} | cols for t in (0, 4)]


def test_the_conservation_control_compares_sgd_with_adamw_by_seed():
    rows = [r for s in range(4) for arm, ratio in (("plain", 0.5), ("sgd", 0.01 * (s + 1))) for r in _drift_rows(arm, s, ratio)]
    drift = RT.read_steps(rows, RT.DRIFT_COLUMNS)
    found, table = RT.control_findings(drift, "float32", range(4), 1, RT.Bootstrap(resamples=200))
    assert found["rt-sgd-below"] == 4 and found["rt-sgd-ratio-max"] == pytest.approx(0.04)
    assert found["rt-sgd-over-adamw-0-qk"] == pytest.approx(np.median([0.02, 0.04, 0.06, 0.08]))
    assert found["rt-sgd-parts-below"] == 2 and found["rt-sgd-parts-above"] == 0 and found["rt-sgd-higher-0-vo"] == 0
    assert found["rt-sgd-abs-lower"] == 2  # C's drift itself (the Grams' drift is 1 in both arms)
    # parts are kept apart: SGD above AdamW on C_VO in every seed, below on C_QK
    rows = [r for s in range(4) for arm, qk, vo in (("plain", 0.5, 0.5), ("sgd", 0.1, 0.6 + 0.01 * s)) for r in _drift_rows(arm, s, qk, vo)]
    found, table = RT.control_findings(RT.read_steps(rows, RT.DRIFT_COLUMNS), "float32", range(4), 1, RT.Bootstrap(resamples=200))
    assert found["rt-sgd-parts-below-where"] == "layer 0, C_QK" and found["rt-sgd-parts-above-where"] == "layer 0, C_VO"
    assert found["rt-sgd-higher-0-vo"] == 4 and found["rt-sgd-below"] == 0 and "| layer 0, C_VO |" in table
    assert found["rt-sgd-abs-lower"] == 1
    with pytest.raises(ValueError, match="different steps"):
        RT.last_step(RT.read_steps(rows + [rows[0] | {"seed": "9", "step": "8"}], RT.DRIFT_COLUMNS))


def test_dead_parts_are_read_per_part_and_both_precisions_reported():
    rows = [{"arm": "plain", "dtype": dt, "seed": str(s), "layer": "0", "part": part, "step": str(t),
             "moved": "0.1", "beyond_decay": str(b * (t + 1)), "rms_step_over_lr": str(b)}
            for dt, b in (("float32", 1e-3), ("float64", 1e-9)) for part in ("key_bias", "input_mean")
            for s in range(3) for t in (0, 9)]
    dead = {part: RT.read_steps(rows, RT.DEAD_COLUMNS, part=part) for part in ("key_bias", "input_mean")}
    found, table = RT.dead_findings(dead, "float32", {"LR": 0.01, "WEIGHT_DECAY": 0.1}, RT.Bootstrap(resamples=200))
    assert found["rt-dead-key-bias-beyond32"] == pytest.approx(1e-2) and found["rt-dead-input-mean-beyond64-max"] == pytest.approx(1e-8)
    assert found["rt-dead-key-bias-runs64"] == 3 and found["rt-dead-step"] == 10
    assert "mean directions of W_Q, W_K, W_V" in table


def test_a_bootstrap_finding_names_its_interval():
    found = RT.Bootstrap(resamples=200).findings("x", [1.0, 2.0, 3.0])
    assert set(found) == {"x", "x-low", "x-high"} and found["x"] == 2.0
    assert found["x-low"] <= 2.0 <= found["x-high"]


def _sweep_row(width: int, opt: str, lr: float, seed: int, share: float, diverged: str = "", max_loss: float = 1.0) -> dict:
    # the median with the first step is a little lower here; the chapter's statistic leaves that step out
    return {"d_model": str(width), "optimiser": opt, "lr": str(lr), "seed": str(seed), "chance_rms": "0.5",
            "median_share_after_first": str(share), "median_share": str(0.9 * share), "diverged_at": diverged,
            "first_loss": "1.0", "max_loss": str(max_loss), "final_loss": "0.01"}


def test_the_rate_width_sweep_locates_each_stability_edge():
    rows = [_sweep_row(8, "adam", lr, s, 0.25 * (1 + s), "3" if lr == 1.0 and s == 1 else "") for lr in (0.1, 0.5, 1.0, 2.0)
            for s in range(2)]
    rows += [_sweep_row(16, "adam", lr, s, 0.1) for lr in (0.1, 0.5, 1.0, 2.0) for s in range(2)]
    cells = SW.sweep_cells(rows)
    assert [c.unstable for c in cells[:4]] == [0, 0, 1, 0]
    assert cells[0].ratios.tolist() == pytest.approx([0.5, 1.0])
    # the edge is the first rate where a seed was unstable, whatever happens above it
    assert SW.stability_edges(cells) == {(8, "adam"): (0.5, 1.0), (16, "adam"): (2.0, None)}
    found = SW.sweep_findings(cells)
    assert found["sweep-edges-found"] == 1 and found["sweep-adam-min"] == pytest.approx(0.2)
    # the largest change of a stable cell's median ratio from leaving the first step out: (1 - 0.9) x 0.75 at d = 8
    assert found["sweep-first-step-change"] == pytest.approx(0.075) and found["sweep-adamw-above"] == 0
    table = SW.sweep_markdown(cells)
    assert "| Adam | 1 | 0.5 (1/2 unstable) | 0.2 |" in table and table.splitlines()[0] == "| optimiser | rate | d = 8 | d = 16 |"


def test_a_loss_spike_counts_as_unstable_though_the_loss_stays_finite():
    # Adam's step is bounded, so its loss spikes instead of overflowing: the rule catches both
    spike = SW.SPIKE
    rows = [_sweep_row(8, "adam", 0.1, 0, 0.2, max_loss=spike * 0.99), _sweep_row(8, "adam", 0.4, 0, 0.2, max_loss=spike * 1.01),
            _sweep_row(8, "adam", 1.6, 0, 0.2, diverged="7", max_loss=float("inf"))]
    assert [SW.unstable_run(r) for r in rows] == [False, True, True]
    cells = SW.sweep_cells(rows)
    assert SW.stability_edges(cells) == {(8, "adam"): (0.1, 0.4)}
    assert [c.ratios.size for c in cells] == [1, 0, 0]


def test_the_spike_threshold_is_a_parameter_of_the_rule():
    row = _sweep_row(8, "adam", 0.4, 0, 0.2, max_loss=5.0)
    assert not SW.unstable_run(row) and SW.unstable_run(row, spike=2.0)
    assert SW.sweep_cells([row], spike=2.0)[0].unstable == 1

def test_the_gpu_configuration_makes_the_stated_number_of_passes():
    params = RT.gpu_parameters(train_bytes=1_000_000)
    window = params["BATCH"] * params["SEQ_LEN"]
    assert params["LONG_STEPS"] * window >= RT.GPU_PASSES * 1_000_000 > (params["LONG_STEPS"] - 1) * window
    assert params["SHARES_EVERY"] == 0 and params["D_MODEL"] > 64
    command = RT.gpu_command(params)
    assert command.startswith("make experiments DEVICE=cuda ") and f"-p LONG_STEPS={params['LONG_STEPS']}" in command
    with pytest.raises(ValueError, match="train_bytes"):
        RT.gpu_parameters(0)


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.9, 0.95), (0.5, 0.9)])
def test_adams_step_on_the_extremal_gradients_meets_the_bound(betas):
    b1, b2 = betas
    steps = KB.adam_update_sizes(KB.adam_extremal_gradients(b1, b2, 400), b1, b2)
    assert steps[0] == pytest.approx(1.0, rel=1e-12)  # the first step is the sign
    assert steps[-1] == pytest.approx(KB.adam_step_bound(b1, b2, 400), rel=1e-9)
    assert steps[-1] < KB.adam_step_bound(b1, b2)


@pytest.mark.parametrize("seed", range(5))
def test_no_gradient_sequence_beats_the_bound(seed):
    rng = np.random.default_rng(seed)
    b1, b2 = 0.9, 0.999
    grads = rng.standard_normal(300) * np.exp(rng.uniform(-5, 5, 300))  # wildly varying sizes and signs
    steps = KB.adam_update_sizes(grads, b1, b2)
    bounds = np.array([KB.adam_step_bound(b1, b2, t) for t in range(1, 301)])
    assert np.all(steps <= bounds * (1 + 1e-12))


def test_the_bound_rises_to_its_supremum_and_bad_betas_are_refused():
    b1, b2 = 0.9, 0.999
    bounds = [KB.adam_step_bound(b1, b2, t) for t in (1, 10, 100, 1000, 10_000, 100_000)]
    assert bounds == sorted(bounds) and bounds[0] == pytest.approx(1.0)
    assert bounds[-1] == pytest.approx(KB.adam_step_bound(b1, b2), rel=1e-12)
    assert KB.adam_step_bound(b1, b2) > (1 - b1) / (1 - b2) ** 0.5  # Kingma and Ba's rough bound can be exceeded
    with pytest.raises(ValueError, match="beta1"):
        KB.adam_step_bound(0.99, 0.9)
    with pytest.raises(ValueError, match="count from 1"):
        KB.adam_step_bound(b1, b2, 0)



def test_momentums_peak_is_found_per_problem_and_compared_with_the_mean_chance_share():
    rows = [share_row(o, s, 0.2) for o in ("momentum", "adam") for s in range(3)]
    results = TR.share_results(TR.group_runs(rows), n_boot=100)  # chance_mean 0.5
    curve = lambda opt, step, median, gradient="loss": {"task": "toy", "layout": "d=4", "optimiser": opt, "gradient": gradient,
                                                        "dtype": "float64", "step": str(step), "median": str(median)}
    table = [curve("momentum", 0, 0.0), curve("momentum", 10, 0.4), curve("momentum", 20, 0.3),
             curve("momentum", 30, 0.9, gradient="random"), curve("adam", 10, 0.8)]  # neither counts
    found = TR.momentum_peaks(table, results)
    assert found["momentum-peak-step-max"] == 10 and found["momentum-peak-above"] == 0 and found["momentum-peak-problems"] == 1
    found = TR.momentum_peaks(table + [curve("momentum", 40, 0.6)], results)
    assert found["momentum-peak-above"] == 1 and found["momentum-peak-above-where"] == "toy d=4: 0.60 at step 40 against 0.50"
