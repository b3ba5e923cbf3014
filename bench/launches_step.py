"""Operations and host syncs per optimizer step on issue 35's model, counted through
torch's dispatcher (bench/optim_launches.py), as a table; with ``--out`` also
as JSON. Deterministic: the numbers are the same on every CPU.

    python -m bench launches_step [--out bench/results/launches_step.json]
"""

from __future__ import annotations

import argparse
import json

from bench.optim_launches import step_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = step_rows()
    print(f"{'optimizer':32} {'layers':>6} {'between (syncs)':>16} {'refresh (syncs)':>16}")
    for row in rows:
        between, refresh = row["between"], row["refresh"]
        print(f"{row['optimizer']:32} {row['layers']:>6} "
              f"{between[0]:>9} ({between[1]:>3}) {refresh[0]:>9} ({refresh[1]:>3})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
