"""configs/ci-ray-vllm.yaml on the suite's two real vLLM servers: Ray env workers generate on both, every push
reaches every server over HTTP (no shared disk), and a server killed mid-run is survived."""

import asyncio
import json
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from envhub.trainer.config import config_from_dict
from envhub.trainer.train import Trainer
from tests.vllm_support import TINY_KEY, require_vllm

ray = pytest.importorskip("ray")
from envhub.trainer.rollout.ray_workers import RayOptions  # noqa: E402

# the vLLM group's worker runs it (it shares that worker's servers); its own Ray instance is started and stopped here
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]
REPO = Path(__file__).resolve().parents[3]


def ci_ray_vllm(tmp_path: Path, urls: str) -> dict:
    data = yaml.safe_load((REPO / "configs" / "ci-ray-vllm.yaml").read_text())
    data["engine"] = {**data["engine"], "url": urls, "api_key": TINY_KEY}
    del data["engine"]["servers"]  # the suite's servers are attached, not launched
    data["budget"]["steps"] = 3
    data["out_dir"] = str(tmp_path)
    return data


def weight_version(url: str) -> str:
    """The server's weight-version label, or "down"."""
    try:
        with urllib.request.urlopen(url + "/weight_info", timeout=10) as response:
            return json.load(response)["weight_version"]
    except OSError:
        return "down"


async def test_ray_workers_train_on_two_vllm_servers_and_survive_one_dying(vllm_servers, tokenizer, tmp_path):
    require_vllm()
    shared, second = vllm_servers
    trainer = Trainer(config_from_dict(ci_ray_vllm(tmp_path, f"{shared.url},{second.url}")))
    trainer.ray = RayOptions(workers=2, episodes_per_worker=4)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    seen: list[list[str]] = []

    def after_push(row: dict) -> None:  # the step's push is done; the next step's groups are about to start
        seen.append([weight_version(shared.url), weight_version(second.url)])
        if row["step"] == 1:  # the second server dies (its CLI stops the vLLM processes)
            second.stop()

    trainer.on_step = after_push
    try:
        result = await asyncio.wait_for(trainer.run(), timeout=600)
    finally:
        ray.shutdown()
        from envhub.trainer.engines.vllm.command import TINY_HEADS
        from envhub.trainer.engines.vllm.engine import VLLMEngine
        from envhub.trainer.models import tiny_llama

        restore = VLLMEngine(shared.url, api_key=TINY_KEY)  # later tests expect the served model's weights
        served = tiny_llama(tokenizer, seed=0, num_heads=TINY_HEADS).state_dict()
        await restore.update_weights(served, version=int(await restore.weight_version()) + 1)
        await restore.close()
    assert result.last_step == 3
    # each step's push reached both servers while both lived (labels are the step's version), the survivor after
    assert seen == [["1", "1"], ["2", "down"], ["3", "down"]], seen
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    episodes = [e for e in episodes if e["kind"] == "episode" and e["finish_reason"] != "cancelled"]
    by_version = {v: Counter(u for e in episodes if e["policy_versions"] == [v] for u in e["engines"]) for v in (0, 2)}
    # the first step's episodes were played on both servers, those after the death on the survivor only, and no
    # episode was lost to it (every step trained whole groups; none ended in an error)
    assert set(by_version[0]) == {shared.url, second.url}, by_version
    assert set(by_version[2]) == {shared.url}, by_version
    assert all(e["finish_reason"] != "error" for e in episodes) and len(episodes) >= 3 * 2 * 4
    # the driver met the outage at the next push; the server is not lost yet (engine.max_outage_s is 60 s)
    assert [row.get("engine_outages", 0) for row in result.history] == [0, 1, 1], result.history
