"""Write an admissions-like CSV (GRE, GPA, school rank -> admitted yes/no) for configs/csv_example.toml.

Usage: python scripts/make_admissions_csv.py [PATH] [--rows N] [--seed S]
The label follows a noisy linear rule, so softmax regression can learn it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def admissions_rows(rows: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    gre, gpa, rank = rng.integers(300, 800, rows), rng.uniform(2, 4, rows), rng.integers(1, 5, rows)
    admitted = gre / 800 + gpa / 4 - rank / 4 + rng.normal(0, 0.05, rows) > 0.9
    return ["gre,gpa,rank,admitted"] + [f"{a},{b:.3f},{c},{'yes' if d else 'no'}"
                                        for a, b, c, d in zip(gre, gpa, rank, admitted)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="configs/admissions.csv")
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    Path(args.path).write_text("\n".join(admissions_rows(args.rows, args.seed)) + "\n")
    print(f"wrote {args.rows} rows to {args.path}")


if __name__ == "__main__":
    main()
