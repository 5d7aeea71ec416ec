"""envhub's extension of vLLM's workers: load pushed weights fetched over HTTP (no shared disk needed).

vLLM starts with `--worker-extension-cls envhub_vllm_weights.WeightFetcher` and this folder on PYTHONPATH; the
trainer then calls `POST /collective_rpc {"method": "envhub_fetch_weights", "kwargs": {"url": ..., "token": ...}}`
between `/pause` and `/resume`. Each worker downloads one safetensors file from the trainer's weight server and
reloads its model in place. This module runs inside vLLM's own virtualenv: it imports only the standard library,
torch and safetensors (both vLLM's dependencies), never envhub.
"""

from __future__ import annotations

import urllib.error
import urllib.request


class WeightFetcher:
    """Mixed into vLLM's worker class; its methods are callable through collective_rpc (arguments are strings)."""

    def envhub_extension(self) -> dict:
        """What this extension serves (the trainer checks it when it attaches)."""
        return {"envhub_fetch_weights": 1}

    def envhub_fetch_weights(self, url: str, token: str, timeout_s: str = "600") -> dict:
        """Download the safetensors file at `url` (bearer `token`) and reload the model's weights from it."""
        from safetensors.torch import load

        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=float(timeout_s)) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"fetching weights from {url} failed: HTTP {exc.code} {exc.read()[:200]!r}") from exc
        except OSError as exc:
            raise RuntimeError(f"fetching weights from {url} failed: {exc}") from exc
        state = load(data)
        self.reload_weights(weights_iterator=iter(state.items()))
        return {"tensors": len(state), "bytes": len(data)}
