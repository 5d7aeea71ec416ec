"""The recording gateway: unmodified agent programs reach the trainer's engine through an OpenAI-compatible
endpoint, one API key per episode; each episode's calls come back token for token and become trajectories.

    gateway = Gateway(engine, tokenizer)
    await gateway.start()
    handle = gateway.open_episode()        # handle.env(): OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL
    ...                                    # the harness runs against handle.base_url with handle.api_key
    calls = gateway.close_episode(handle)
    samples = to_trajectories(calls, reward, task="...")   # merged into one trajectory when the calls extend
"""

from envhub.trainer.gateway.app import Gateway, GatewayConfig
from envhub.trainer.gateway.episodes import EpisodeHandle, RecordedCall
from envhub.trainer.gateway.merge import EpisodeSamples, extends, sample_advantages, to_trajectories

__all__ = [
    "EpisodeHandle",
    "EpisodeSamples",
    "Gateway",
    "GatewayConfig",
    "RecordedCall",
    "extends",
    "sample_advantages",
    "to_trajectories",
]
