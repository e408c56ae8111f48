"""mm-embeddings-cache-producer/-scorer end to end: repeated images go back to the replica that encoded them.

Chat requests with ``image_url`` parts through Envoy to the simulator; the encoder-cache scorer
is the only signal besides an equal queue, so without it the replicas tie and are picked at
random.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.e2e.conftest import make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: mm-embeddings-cache-producer
    parameters:
      cacheSizeInMBPerServer: 2048
  - type: mm-embeddings-cache-scorer
  - type: max-score-picker
  - type: single-profile-handler
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: mm-embeddings-cache-scorer
        weight: 4
      - pluginRef: max-score-picker
"""


async def test_repeated_images_return_to_their_replica(tmp_path: pathlib.Path) -> None:
    async with make_stack(tmp_path, replicas=4, config=CONFIG) as s:

        async def ask(url: str, question: str) -> str:
            parts = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]
            body = {"model": "mock-model", "messages": [{"role": "user", "content": parts}], "max_tokens": 2}
            r = await s.post("/v1/chat/completions", body)
            assert r.status == 200 and r.epp_choice == r.served_by, r.body
            return r.served_by

        urls = [f"https://images.example/{i}.png" for i in range(3)]
        homes = {url: await ask(url, "describe it") for url in urls}
        for n in range(4):  # by chance: (1/4) ** 12
            for url in urls:
                assert await ask(url, f"question {n}") == homes[url]
        metrics = await s.epp_metrics()
        assert "llm_d_epp_encoder_cache_hits_total" in metrics
