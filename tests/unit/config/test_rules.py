"""What recompute configuration means on the installed Megatron Core, against the real validator and
real layers built on CPU."""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.config.fields import RecomputeFields
from harness.config.labels import accepted_labels
from harness.config.rules import RULES_BY_ID
from harness.config.validate import ConfigRejected, check_config, validate


def _fields(**recompute) -> dict:
    return RecomputeFields(**recompute).as_config_kwargs()


def test_selective_empty_list_is_accepted_and_kept_empty():
    verdict = validate(_fields(granularity="selective", modules=()))
    assert verdict.accepted and verdict.effective == RecomputeFields.selective()


def test_selective_without_modules_becomes_core_attn():
    verdict = validate(_fields(granularity="selective"))
    assert verdict.accepted and verdict.effective.modules == ("core_attn",)


@pytest.mark.parametrize(
    "fields, rule, mcore_exception",
    [
        (
            _fields(granularity="selective", modules=("core_attn", "not_a_label")),
            "labels.unknown",
            "AssertionError",
        ),
        (
            _fields(granularity="selective", modules=("moe_act",)),
            "labels.moe_act-needs-grouped-gemm",
            "ValueError",
        ),
        (_fields(granularity="full", num_layers=1), "recompute.full-needs-method", "ValueError"),
        (
            _fields(granularity="full", method="uniform"),
            "recompute.full-needs-num-layers",
            "ValueError",
        ),
        (
            _fields(granularity="selective", num_layers=1),
            "recompute.selective-forbids-num-layers",
            "ValueError",
        ),
    ],
)
def test_rejections_are_normalized_to_a_rule_id_with_mcores_message(fields, rule, mcore_exception):
    with pytest.raises(ConfigRejected) as rejected:
        check_config(fields)
    assert (rejected.value.rule, rejected.value.mcore_exception) == (rule, mcore_exception)
    assert rejected.value.message and rejected.value.message in str(rejected.value)
    assert RULES_BY_ID[rule].raises == mcore_exception


def test_unknown_label_message_names_the_label():
    verdict = validate(_fields(granularity="selective", modules=("mlp", "attention")))
    assert verdict.rule == "labels.unknown" and "attention" in verdict.message


def test_mla_label_validates_through_mla_config():
    assert validate(
        {
            **_fields(granularity="selective", modules=("mla_up_proj",)),
            "multi_latent_attention": True,
        }
    ).accepted


@pytest.mark.parametrize(
    "rule, fields",
    [
        (
            "semantics.selective-ignores-method",
            _fields(granularity="selective", modules=("mlp",), method="block"),
        ),
        ("semantics.num-layers-without-granularity", _fields(num_layers=2)),
        (
            "semantics.full-block-num-layers-zero",
            _fields(granularity="full", method="block", num_layers=0),
        ),
        (
            "runtime.full-uniform-num-layers-zero-hangs",
            _fields(granularity="full", method="uniform", num_layers=0),
        ),
        ("semantics.labels-without-granularity", _fields(modules=("not_a_label",))),
        (
            "semantics.distribute-saved-activations-without-recompute",
            {
                "distribute_saved_activations": True,
                "sequence_parallel": True,
                "tensor_model_parallel_size": 2,
            },
        ),
    ],
)
def test_silent_acceptances_are_recorded_in_the_matrix(rule, fields):
    verdict = validate(fields)
    assert verdict.accepted, verdict.message
    assert RULES_BY_ID[rule].outcome in ("silently-ignored", "hang")
    expected = {**RecomputeFields().as_dict(), **RecomputeFields.from_dict(fields).as_dict()}
    if expected["recompute_modules"] is None:
        expected["recompute_modules"] = ["core_attn"]
    assert verdict.effective.as_dict() == expected  # kept as given: nothing corrects or flags them


# --- full supersedes selective, where it matters: on real layers -------------------------------------


def _recompute_switches(module) -> dict[str, bool]:
    """Every per-module recompute switch MCore set while building ``module``."""
    return {
        f"{name}.{attr}": value
        for name, sub in module.named_modules()
        for attr, value in vars(sub).items()
        if isinstance(value, bool) and ("recompute" in attr or "checkpoint" in attr)
    }


@pytest.fixture(scope="module")
def build():
    adapter = pytest.importorskip(
        "harness.cpu.adapter", reason="needs the CPU adapter (harness/cpu)"
    )
    from harness.models import build_model

    adapter.init_cpu_parallel_state()
    return lambda model, fields: _recompute_switches(build_model(model, fields).module)


def _selective_labels(model: str) -> tuple[str, ...]:
    """The labels this model's real config accepts under selective granularity."""
    from harness.models import style_model, transformer_config

    def accepted(label: str) -> bool:
        try:
            transformer_config(style_model(model), RecomputeFields.selective(label))
        except (AssertionError, ValueError):
            return False
        return True

    return tuple(label for label in sorted(accepted_labels()) if accepted(label))


@pytest.mark.parametrize("model", ["dense-tiny", "moonlight-tiny"])
def test_full_with_labels_turns_on_no_module_switch(build, model):
    labels = tuple(sorted(accepted_labels()))
    full_alone = build(model, RecomputeFields.full("uniform", 1))
    full_with_labels = build(model, RecomputeFields("full", labels, "uniform", 1))
    selective = build(model, RecomputeFields.selective(*_selective_labels(model)))
    assert any(selective.values()), "the same labels under selective must switch modules on"
    assert set(full_with_labels) == set(selective)
    assert full_with_labels == full_alone and not any(full_with_labels.values())


@pytest.mark.parametrize("model", ["dense-tiny", "moonlight-tiny"])
def test_selective_empty_list_recomputes_no_module(build, model):
    switches = build(model, RecomputeFields.selective())
    assert switches and not any(switches.values())


class _Interrupted(Exception):
    pass


_GROWTH_LIMIT_BYTES = 512 << 20  # a dense-tiny step allocates a few MiB; the hang grows ~300 MiB/s


def _resident_bytes() -> int:
    """This process's resident set now (not its lifetime peak, which an earlier test may have set)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _in_machinery(frame, home) -> bool:
    """Whether a frame between ``home`` (exclusive) and ``frame`` runs a finalizer, the import system
    or pytest: a raise in a finalizer is unraisable, and pytest's report of an unraisable exception
    imports as it runs, so a raise there failed the test ("Failed to process unraisable exception")."""
    while frame is not None and frame is not home:
        code = frame.f_code
        if (
            code.co_name == "__del__"
            or code.co_filename.startswith("<frozen importlib")
            or f"{os.sep}_pytest{os.sep}" in code.co_filename
        ):
            return True
        frame = frame.f_back
    return False


def _trains_within(model, seconds: float) -> bool:
    """One forward+backward finishes within ``seconds`` and without growing the process by 512 MiB (a
    SIGALRM every 50 ms interrupts the Python-level loop). The growth bound matters: the hang below
    saves RNG states on every turn of its loop and took a worker to 19 GB in a loaded tier. Every tick
    past a bound raises again until the step is over: a raise that lands where something swallows it
    (one did, and a worker grew to 23 GB) is followed by the next."""
    deadline = time.monotonic() + seconds
    start = _resident_bytes()
    over = False
    here = sys._getframe()

    def interrupt(_signal, frame):
        # A tick that lands after the step returned, or in the clean-up below, is ignored; so is one
        # that lands outside the step's own code (the next tick, 50 ms later, raises again).
        if (
            not over
            and (time.monotonic() > deadline or _resident_bytes() - start > _GROWTH_LIMIT_BYTES)
            and not _in_machinery(frame, here)
        ):
            raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        model.loss(model.batch()).backward()
        over = True
        return True
    except _Interrupted:
        over = True
        return False
    finally:
        over = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_full_num_layers_zero_is_a_no_op_with_block_and_a_hang_with_uniform(build):
    from harness.models import build_model

    block = build_model("dense-tiny", RecomputeFields.full("block", 0))
    uniform = build_model("dense-tiny", RecomputeFields.full("uniform", 0))
    # The bound only keeps a regression from hanging the tier: returning at all is the no-op.
    started = time.monotonic()
    assert _trains_within(block, 300.0)
    step_s = time.monotonic() - started
    # Uniform's layer loop never advances (it steps by recompute_num_layers=0). Twenty times the step
    # block just took, on this machine at its present load, is far past when a step that ends would.
    window_s = max(2.0, 20 * step_s)
    assert not _trains_within(uniform, window_s), (
        f"full uniform with recompute_num_layers=0 returned within {window_s:.1f} s"
    )


def test_mlp_label_switches_only_dense_layers(build):
    switches = build("moonlight-tiny", RecomputeFields.selective("mlp"))  # layer 0 dense, 1-2 MoE
    assert {name for name, on in switches.items() if on} == {"decoder.layers.0.recompute_mlp"}
    assert RULES_BY_ID["semantics.mlp-on-moe-layers"].outcome == "silently-ignored"


def test_moe_act_is_silently_ignored_outside_te_grouped_mlp(build):
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.process_groups_config import ProcessGroupCollection

    from harness.models import style_model, transformer_config

    fields = RecomputeFields.selective("moe_act")
    assert validate(
        {
            **_fields(granularity="selective", modules=("moe_act",)),
            "num_moe_experts": 4,
            "moe_grouped_gemm": True,
        }
    ).accepted
    # The local spec's experts (SequentialMLP, even with the grouped-GEMM flag) set no switch.
    config = transformer_config(style_model("moonlight-tiny"), fields)
    local_experts = LocalSpecProvider().grouped_mlp_modules(True)(
        4, config, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
    )
    switches = _recompute_switches(local_experts)
    assert type(local_experts).__name__ == "SequentialMLP" and not any(switches.values())
    # The style model's experts are the TE spec's TEGroupedMLP (the adapter's grouped-linear
    # stand-ins without TE): there moe_act is the one switch on.
    switches = build("moonlight-tiny", fields)
    assert [name for name, on in switches.items() if on] == [
        "decoder.layers.1.mlp.experts.activation_recompute",
        "decoder.layers.2.mlp.experts.activation_recompute",
    ]


def test_legacy_moe_layer_recompute_becomes_selective_moe_after_the_label_checks():
    verdict = validate({**_fields(modules=("not_a_label",)), "moe_layer_recompute": True})
    # The unknown label is never checked: granularity was None when the label rules ran.
    assert verdict.accepted and verdict.warning_rules == ("legacy.moe-layer-recompute-deprecated",)
    assert verdict.effective == RecomputeFields("selective", ("not_a_label", "moe"))
    assert (
        RULES_BY_ID["legacy.moe-layer-recompute-becomes-selective-moe"].outcome
        == "silently-ignored"
    )
