"""``matroot plan``: the command line of the cluster sizer
(:mod:`matroot.optim.distributed.cluster_sizing`)."""

from __future__ import annotations

import argparse
import json

from .common import UsageError

DESCRIPTION = ("Split a model's Shampoo blocks over torch.distributed ranks from its "
               "parameter shapes: blocks per size, cost balance, memory and all-gather "
               "bytes per rank.")


def configure(parser) -> None:
    from matroot.optim.distributed.cluster_sizing import MODELS

    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", choices=sorted(MODELS),
                        help="a built-in shape set (default: llama-953m)")
    source.add_argument("--shapes", metavar="LIST",
                        help="comma-separated shapes, e.g. 2048x2048,5632x2048,2048")
    source.add_argument("--shapes-json", metavar="FILE",
                        help="JSON list of shapes, or object mapping names to shapes")
    parser.add_argument("--block-size", type=int, default=1024,
                        help="Shampoo block_size (default 1024)")
    parser.add_argument("--world-size", type=int, nargs="+", default=[8, 64, 512],
                        metavar="N", help="world sizes to plan for (default 8 64 512)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="optimizer state dtype (default float32)")
    parser.add_argument("--precondition-1d", action="store_true",
                        help="as Shampoo(precondition_1d=True): vectors get one factor")
    parser.add_argument("--symmetric-packing", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="as Shampoo(symmetric_packing=...): packed factors and roots "
                             "(the optimizer's default; --no-symmetric-packing: full n×n)")
    parser.add_argument("--root-storage-dtype", choices=("float32", "bfloat16", "float16"),
                        help="as Shampoo(root_storage_dtype=...): dtype of the kept roots")
    parser.add_argument("--no-keep-roots", action="store_true",
                        help="as Shampoo(keep_roots=False, precondition_frequency=1): "
                             "no roots kept")
    parser.add_argument("--fsdp2", action="store_true",
                        help="also print per-rank bytes under FSDP2 (fully_shard)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(run=run, prog=parser.prog)


def run(args) -> int:
    from matroot.optim.distributed.cluster_sizing import (
        MODELS,
        format_fsdp2,
        format_summary,
        load_shapes_json,
        parse_shapes,
        plan_summary,
    )

    try:
        if args.shapes is not None:
            shapes, title = parse_shapes(args.shapes), "--shapes"
        elif args.shapes_json is not None:
            shapes, title = load_shapes_json(args.shapes_json), args.shapes_json
        else:
            title = args.model or "llama-953m"
            shapes = MODELS[title]()
        summary = plan_summary(shapes, block_size=args.block_size,
                               world_sizes=args.world_size, dtype=args.dtype,
                               precondition_1d=args.precondition_1d,
                               symmetric_packing=args.symmetric_packing,
                               root_storage_dtype=args.root_storage_dtype,
                               keep_roots=not args.no_keep_roots)
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from None
    if args.json:
        out = dict(summary, blocks=[{"shape": list(k), **v}
                                    for k, v in summary["blocks"].items()])
        print(json.dumps(out, indent=2))
    else:
        print(format_summary(summary, title))
        if args.fsdp2:
            print()
            print(format_fsdp2(summary))
    return 0
