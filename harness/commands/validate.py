"""``recompute-harness validate``: one configuration through the real TransformerConfig validator.

Exit 0 accepted, 1 rejected (rule id and MCore's message), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from harness.config.coerce import coerce_field, field_types, parse_assignment
from harness.config.fields import RecomputeFields, parse_labels
from harness.config.rules import SUPERSEDED_RULE
from harness.config.validate import config_class_for, validate
from harness.errors import EXIT_FAILED, EXIT_OK, UsageError

RECOMPUTE_FIELDS = tuple(RecomputeFields().as_dict())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--granularity", help="recompute_granularity: full or selective (omit for None)"
    )
    parser.add_argument(
        "--modules", help="recompute_modules, comma-separated; an empty string means []"
    )
    parser.add_argument("--method", help="recompute_method: uniform or block")
    parser.add_argument("--num-layers", type=int, help="recompute_num_layers")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other TransformerConfig field, typed by its declaration (repeatable)",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"accepted", "rule", "message", "effective"}'
    )


def _utf8(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8") from None
    return text


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    for what, text in (
        ("--granularity", args.granularity),
        ("--modules", args.modules),
        ("--method", args.method),
    ):
        if text is not None:
            _utf8(text, what)
    assignments = [parse_assignment(_utf8(item, "--set")) for item in args.set]
    for name, _ in assignments:
        if name in RECOMPUTE_FIELDS:
            raise UsageError(
                f"--set {name}: use --granularity / --modules / --method / --num-layers"
            )
    modules = (
        None
        if args.modules is None
        else ()
        if args.modules == ""
        else parse_labels(args.modules, ",", f"--modules {args.modules!r}")
    )
    fields: dict[str, Any] = RecomputeFields(
        args.granularity, modules, args.method, args.num_layers
    ).as_config_kwargs()
    # multi_latent_attention picks the config class whose field types the other values follow.
    mla = dict(assignments).get("multi_latent_attention")
    if mla is not None:
        fields["multi_latent_attention"] = coerce_field(
            config_class_for({}), "multi_latent_attention", mla
        )
    config_class = config_class_for(fields)
    mla_only = set(field_types(config_class_for({"multi_latent_attention": True}))) - set(
        field_types(config_class)
    )
    for name, text in assignments:
        if name in mla_only:
            raise UsageError(f"--set {name}: an MLA field; add --set multi_latent_attention=true")
        fields[name] = coerce_field(config_class, name, text)
    return fields


def run(args: argparse.Namespace) -> int:
    fields = _fields(args)
    try:
        verdict = validate(fields)
    except (TypeError, AttributeError, KeyError) as exc:
        raise UsageError(f"Megatron Core could not use these field values: {exc}") from None
    result = verdict.as_dict()
    effective = verdict.effective  # None exactly when rejected
    if (
        effective is not None
        and effective.granularity == "full"
        and effective.modules
        and args.modules is not None
    ):
        result["rule"] = SUPERSEDED_RULE
        result["message"] = (
            f"full granularity supersedes the selective labels {list(effective.modules)}: "
            "no per-module recompute is applied"
        )
    if args.json:
        print(json.dumps(result, indent=2))
    elif verdict.accepted:
        print(f"accepted: {json.dumps(result['effective'])}")
        if result["rule"]:
            print(f"note [{result['rule']}]: {result['message']}")
    else:
        print(f"rejected [{verdict.rule}] ({verdict.mcore_exception}): {verdict.message}")
    return EXIT_OK if verdict.accepted else EXIT_FAILED
