"""Builders and fakes for tests and plugin authors; src never imports this.

- ``builders``: endpoints (``make_endpoint``), requests (``make_request``) and parsed bodies
  (``chat_body``, ``completions_body``).
- ``plugins``: ``FakeHandle`` (a Handle over fixed plugins) and ``build`` (a plugin from camelCase
  parameters, as a config would build it).
- ``flowcontrol``: ``FakeQueue`` and ``FakeItem``, a sorted flow queue for policy tests.
- ``waiting``: ``until``, a bounded poll for a condition, instead of fixed sleeps.
- ``clock``: ``ManualClock``, a monotonic clock a test moves by hand (a plugin's ``clock``).

The fake Kubernetes API server is not here: it is the dev-only `epp-kubeapi` distribution
(`kubeapi/`, package ``epp_kubeapi``), which the product wheel does not ship.
"""
