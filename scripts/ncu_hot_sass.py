"""The SASS lines where the warps of a profiled kernel stall most, from an ncu report's source page:
ncu --import REPORT --page source --csv --print-source sass > page.csv
python scripts/ncu_hot_sass.py page.csv [TOP]

Prints the share of all stall samples per line, the line's instruction and its top stall reasons
(the columns ncu names "... (All Samples)" per reason, where the report has them)."""

import csv
import sys


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    # ncu writes a "Kernel Name" line before the table's header.
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith('"Address"')):]
    rows = list(csv.DictReader(lines))
    if not rows:
        sys.exit(f"no rows in {path}")
    columns = rows[0].keys()
    total_col = next(c for c in columns if c.startswith("Warp Stall Sampling (All"))
    source_col = next(c for c in columns if c in ("Source", "# Source") or c.endswith("Source"))
    address_col = next((c for c in columns if "Address" in c), None)
    reason_cols = [c for c in columns if c.startswith("stall_") or c.startswith("smsp__pcsamp_warps_issue_stalled")]

    def number(text):
        try:
            return float(str(text).replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(number(r[total_col]) for r in rows) or 1.0
    hot = sorted(rows, key=lambda r: number(r[total_col]), reverse=True)[:top]
    print(f"{len(rows)} SASS lines, {total:.0f} samples; top {top} lines by share of all samples")
    for r in hot:
        reasons = sorted(((number(r[c]), c) for c in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{c.replace('smsp__pcsamp_warps_issue_stalled_', '')} {v / total:.1%}" for v, c in reasons if v)
        where = r[address_col] if address_col else ""
        print(f"{number(r[total_col]) / total:6.1%}  {where:>8}  {r[source_col].strip()[:70]:<70}  {why}")


if __name__ == "__main__":
    main()
