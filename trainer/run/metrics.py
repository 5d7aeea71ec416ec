"""Training metrics: one JSON line per step, TensorBoard scalars, and a PNG of reward per task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.trainer.run.record import write_failure


class MetricsLogger:
    """Writes metrics.jsonl, TensorBoard events (tb/) and reward_curve.png under `out_dir`."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = True, purge_step: int | None = None) -> None:
        """`purge_step`: a resumed run's first step; TensorBoard hides what an earlier process logged from it on."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.out_dir / "tb"), purge_step=purge_step)
            except ImportError:  # tensorboard is optional: JSONL and the PNG still work
                self._writer = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's metrics (nested dicts become slash-separated keys)."""
        flat = _flatten(metrics)
        try:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": step, **flat}) + "\n")
            if self._writer is not None:
                for key, value in flat.items():
                    if key == "time":  # a wall-clock timestamp, not a curve
                        continue
                    if isinstance(value, (int, float)) and not isinstance(value, bool):  # None: nothing this step
                        self._writer.add_scalar(key, value, step)
                self._writer.flush()  # raises what TensorBoard's writer thread met
        except OSError as exc:
            raise write_failure(Path(exc.filename) if exc.filename else self.path, exc) from exc

    def read(self) -> list[dict[str, Any]]:
        """Every logged row."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def plot_rewards(self, filename: str = "reward_curve.png") -> Path:
        """Plot mean reward per task (and overall) against step; returns the PNG path."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        rows = self.read()
        keys = sorted({k for r in rows for k in r if k.startswith("reward/")})
        fig, ax = plt.subplots(figsize=(7, 4))
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key.split("/", 1)[1])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("learner step")
        ax.set_ylabel("mean episode reward")
        ax.set_title("reward per task")
        if keys:
            ax.legend()
        ax.grid(alpha=0.3)
        path = self.out_dir / filename
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except OSError:  # a full disk: the failed write was reported by `log`
                pass


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def learner_stat(row: dict[str, Any], name: str, default: float) -> float:
    """A learner statistic of a history row: nested (`row["learner"][name]`, as the trainer logs it) or flat."""
    nested = row.get("learner")
    if isinstance(nested, dict) and name in nested:
        return nested[name]
    return row.get(f"learner/{name}", default)


def off_policy_warning(history: list[dict[str, Any]], mode: str, window: int = 3, max_clip: float = 0.5) -> str | None:
    """A warning when async steps keep training on stale samples most of whose tokens fall outside the PPO clip.

    With `max_staleness` >= 1 a batch comes from the policy one step (or more) back; when one step moves the
    policy far (a high lr), the ratio to that behaviour policy leaves the clip range for most tokens, their
    gradient is zero, and the run learns far less than the same config in sync mode. The share is the one `ppo`
    logs for its own ratio (`ppo_clip_{low,high}_fraction`), so the warning follows the variant's actual anchor:
    no other variant logs it, and under `is_correction` with `apply_weight` ppo's ratio is taken against the
    proximal policy, whose clip the staleness does not reach.
    """
    recent = history[-window:]
    if mode != "async" or len(recent) < window:
        return None

    def outside(row: dict[str, Any]) -> float:
        return learner_stat(row, "ppo_clip_low_fraction", 0.0) + learner_stat(row, "ppo_clip_high_fraction", 0.0)

    if all(r.get("staleness", 0) > 0.5 and outside(r) > max_clip for r in recent):
        clip = sum(outside(r) for r in recent) / window
        kl = learner_stat(recent[-1], "kl_behavior", float("nan"))
        return (
            f"warning: the last {window} async steps trained on samples from an older policy and {clip:.0%} of their "
            f"tokens fell outside the PPO clip (KL(behaviour || learner) {kl:.3g}), where ppo's gradient is cut or "
            "scaled down: each step moves the policy too far for off-policy samples to teach. Set "
            "algorithm.pg_variant: vanilla (no ratio to clip), lower algorithm.lr, or set algorithm.mode: sync."
        )
    return None
