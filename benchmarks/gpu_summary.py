"""The GPU targets (issues 26 and 52) checked against the records of bench_gpu.py and compare_transcoders.py, and
the summary of a gpu_check.sh run, so that one run explains itself.

    python benchmarks/gpu_summary.py OUT/results.jsonl [--out OUT/summary.md]      # prints it but the profiles

summary.md: the machine; per target and model x dtype the measured value, the limit and met / missed (or "not
measured": its stage failed, was stopped at its time limit or was not run); the stages with their budgets, times and
exit; the transcoder comparison's table; each profiled workload in one line (the tables are in OUT/profiles/); the
failed workloads with their errors.
"""

import argparse
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpu_profile import brief


@dataclass(frozen=True)
class Target:
    what: str
    limit: float
    at_most: bool  # the value must be <= limit (else >= limit)
    rows: Callable[[list[dict]], Iterator[tuple[str, float | None, str]]]  # (where, value, detail) per case

    def check(self, value: float | None) -> str:
        if value is None:
            return "not measured"
        return "met" if (value <= self.limit if self.at_most else value >= self.limit) else "MISSED"


def _where(r: dict) -> str:
    return f"{r.get('model', '?')} {r.get('dtype', '?')}"


def _field(workload: str, key: str, detail: Callable[[dict], str] = lambda r: "") -> Callable:
    def rows(records: list[dict]) -> Iterator[tuple[str, float | None, str]]:
        for r in records:
            if r.get("workload") == workload and "failed" not in r:
                yield _where(r), r.get(key), detail(r)
    return rows


def _forward_worst(case: str) -> Callable:
    """Per model x dtype the worst ratio to transformers over the shapes (an OOM counts as infinite)."""
    def rows(records: list[dict]) -> Iterator[tuple[str, float | None, str]]:
        worst: dict[str, tuple[float, str]] = {}
        for r in records:
            if r.get("workload") == "forward" and case in r:
                value = r[case]
                ratio = value.get("ratio", math.inf) if isinstance(value, dict) else math.inf
                if _where(r) not in worst or ratio > worst[_where(r)][0]:
                    worst[_where(r)] = (ratio, r["shape"])
        for where, (ratio, shape) in worst.items():
            yield where, ratio, f"worst at {shape}"
    return rows


def _training_ratio(records: list[dict]) -> Iterator[tuple[str, float | None, str]]:
    by = {(r["model"], r["dtype"]): r["tokens_per_s"] for r in records
          if r.get("workload") == "training" and "tokens_per_s" in r}
    for model in sorted({m for m, _ in by}):
        fp32, bf16 = by.get((model, "fp32")), by.get((model, "bf16"))
        value = bf16 / fp32 if fp32 and bf16 else None
        yield model, value, f"{bf16 or 0:,.0f} / {fp32 or 0:,.0f} tokens/s"


def _backoff(records: list[dict]) -> Iterator[tuple[str, float | None, str]]:
    for r in records:
        if r.get("workload") == "OOM back-off" and "failed" not in r:
            yield _where(r), float(not r["escaped"] and r["same_rows"]), (
                f"{r['rows']} rows x {r['tokens']} tokens, exceeds memory in one batch: {r['exceeds_memory']}")


def _rate(r: dict) -> str:
    return f"{r['rows_per_s']:,.0f} rows/s" if "rows_per_s" in r else ""


TARGETS = [
    Target("30 SAEs observed (8x512), x their multiply-add bound", 1.3, True, _field(
        "dictionaries", "observe_over_bound",
        lambda r: f"observe {r.get('observe_over_plain', math.nan):.2f}x plain, bound {r['bound_ratio']:.2f}x")),
    Target("attributing those features, x observing", 1.2, True, _field("dictionaries", "attribute_over_observe")),
    Target("Capture.all(), x transformers' SDPA forward, every shape", 1.3, True,
           _forward_worst("resid_full_capture")),
    Target("head DLA, fraction of its multiply-add bound", 0.5, False, _field("head DLA", "bound_fraction", _rate)),
    Target("ablation sweep (IOI), fraction of the bound", 0.8, False,
           _field("head ablation sweep", "bound_fraction", _rate)),
    Target("exact patching (IOI), fraction of the bound", 0.8, False,
           _field("exact head patching", "bound_fraction", _rate)),
    Target("dictionary training, bf16 / fp32 tokens/s", 1.5, False, _training_ratio),
    Target("cross-layer transcoder steps, share of the FLOP bound", 0.45, False, _field(
        "clt transcoder steps", "flop_fraction", lambda r: f"{r['tokens_per_s']:,.0f} tokens/s")),
    # issue 26's, still tracked
    Target("plain forward (no capture), x transformers, every shape", 1.05, True, _forward_worst("resid_no_capture")),
    Target("OOM back-off: no error escapes, the small-batch rows (1: yes)", 1, False, _backoff),
]


def target_rows(records: list[dict]) -> list[dict]:
    """One row per target and case: what, where, value, limit, status, detail."""
    out = []
    for target in TARGETS:
        found = list(target.rows(records))
        for where, value, detail in found or [("-", None, "")]:
            value = None if value is None or (isinstance(value, float) and math.isnan(value)) else value
            out.append(dict(what=target.what, where=where, value=value, limit=target.limit,
                            sign="<=" if target.at_most else ">=", status=target.check(value), detail=detail))
    return out


def targets_table(records: list[dict], measured_only: bool = False) -> str:
    """The target rows as a markdown table (measured_only: without the rows of targets not measured)."""
    lines = ["| target | where | measured | limit | status | detail |", "| --- | --- | --- | --- | --- | --- |"]
    for row in target_rows(records):
        if measured_only and row["value"] is None:
            continue
        value = "-" if row["value"] is None else f"{row['value']:.3g}"
        lines.append(f"| {row['what']} | {row['where']} | {value} | {row['sign']} {row['limit']} | {row['status']} "
                     f"| {row['detail']} |")
    return "\n".join(lines)


def _stages(records: list[dict]) -> list[str]:
    stages = [r for r in records if r.get("workload") == "stage"]
    if not stages:
        return []
    lines = ["", "## Stages", "", "| stage | budget | took | exit |", "| --- | --- | --- | --- |"]
    for r in stages:
        rc = r["rc"]
        exit_ = "ok" if rc == 0 else "stopped at its time limit" if rc in (124, 137) else f"failed (status {rc})"
        lines.append(f"| {r['stage']} | {r['budget_s']} s | {r['seconds']} s | {exit_} |")
    return lines


COMPARISON = ("replacement", "kind", "tokens", "tokens_per_s", "flop_fraction", "fvu", "ce_loss_recovered",
              "kl_spliced", "l0", "dead_fraction", "replacement_score", "completeness_score")


def _comparison(records: list[dict]) -> list[str]:
    rows = [r for r in records if r.get("workload") == "transcoder comparison"]
    if not rows:
        return []
    first = rows[0]
    lines = ["", "## Transcoders compared",
             "", f"{first['model']} ({first['weights']} weights, {first['dtype']}), trained side by side on the same "
             f"batches, {first['tokens']:,} tokens each; evaluate_replacements over {first['windows']} windows of "
             f"{first['window']} tokens and the graphs of {first['prompts']} prompt(s).", "",
             "| " + " | ".join(COMPARISON) + " |", "|" + " --- |" * len(COMPARISON)]

    def fmt(value):
        return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)

    lines += ["| " + " | ".join(fmt(r.get(key, "-")) for key in COMPARISON) + " |" for r in rows]
    return lines


def _profiles(records: list[dict]) -> list[str]:
    lines = [f"- {_where(r)} {r['of']}: {brief(r)}" for r in records if r.get("workload") == "profile"]
    return ["", "## Profiles (one extra call each; tables in profiles/)", "", *lines] if lines else []


def summary(records: list[dict], with_profiles: bool = True) -> str:
    """summary.md's text (with_profiles=False: without the line per profile, for a terminal's last lines)."""
    header = next((r for r in records if r.get("workload") == "header"), {})
    lines = ["# GPU check", "",
             f"{header.get('device', '?')}; torch {header.get('torch', '?')}, transformers "
             f"{header.get('transformers', '?')}, resid {header.get('resid', '?')}; {header.get('weights', '?')} "
             f"weights; started {header.get('started', '?')}", "", "## Targets", "", targets_table(records)]
    lines += _stages(records) + _comparison(records) + (_profiles(records) if with_profiles else [])
    failed = [r for r in records if "failed" in r]
    if failed:
        lines += ["", "## Failed workloads", ""] + [f"- {_where(r)} {r['workload']}: {r['failed']}" for r in failed]
    return "\n".join(lines) + "\n"


def read(path: Path) -> list[dict]:
    """The records of a JSON-lines file; a line cut short by a kill is skipped."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: summary.md beside the results")
    args = parser.parse_args()
    records, out = read(args.results), args.out or args.results.with_name("summary.md")
    out.write_text(summary(records))
    print(summary(records, with_profiles=False) + f"\n(the profiles: {out})")


if __name__ == "__main__":
    main()
