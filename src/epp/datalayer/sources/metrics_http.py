"""``metrics-data-source``: scrape each endpoint's Prometheus metrics over HTTP(S)."""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BeforeValidator, Field, field_validator

from epp.datalayer.api import Endpoint, EndpointEvent
from epp.datalayer.exposition import DEFAULT_MAX_BYTES, ExpositionParser, FamilyConsumer, MetricFamilies
from epp.datalayer.http_client import ScrapeClient, TLSConfigError, tls_client_context
from epp.datalayer.shared_scrapes import ScrapeShare
from epp.errors import ConfigError
from epp.plugin.base import Handle, Plugin, PluginBase, PluginParams

_GO_DURATION_RE: Final = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> object:
    """Go duration text (``"500ms"``, ``"1m30s"``) to seconds; numbers pass through as seconds."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    pos, total = 0, 0.0
    for m in _GO_DURATION_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f'time: invalid duration "{value}"')
    return total


Seconds = Annotated[float, BeforeValidator(parse_duration)]


class HTTPSourceParams(PluginParams):
    """What every HTTP polling source of llm-d-router takes (its ``source/http`` package)."""

    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    interval: Seconds | None = Field(default=None, ge=0)
    ca_cert_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""
    # Ours, not GIE's: a per-poll deadline (default: the runtime's, below the refresh interval)
    # and a bound on the page size.
    timeout: Seconds | None = Field(default=None, gt=0)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BYTES, gt=0)

    @field_validator("scheme")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if v not in ("http", "https"):
            raise ValueError(f"unsupported scheme: {v}")
        return v

    @field_validator("interval", mode="before")
    @classmethod
    def _empty_interval(cls, v: object) -> object:
        return None if v == "" else v  # upstream: empty or omitted is every base tick


class MetricsDataSourceParams(HTTPSourceParams):
    port: int | None = None  # overrides every endpoint's metrics port (not for data-parallel pools)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 65535:
            raise ValueError(f"invalid port {v}: must be between 1 and 65535")
        return v


# --- the deprecated --model-server-metrics-* flags: their one declaration (gie-inventory §1.1, §6.4) ---
# The command line (app/options.py) derives its flags and Options defaults from this table, the
# config builder merges ``ModelServerMetricsFlags.explicit_params()`` below the plugin's
# parameters, and the legacy poller reads the values: each flag is declared here only.


@dataclass(frozen=True, slots=True)
class MetricsFlag:
    """One deprecated flag: its name, the ``ModelServerMetricsFlags`` field it sets, its help."""

    flag: str
    attr: str
    kind: Literal["str", "int", "bool"]
    help: str


MODEL_SERVER_METRICS_FLAGS: Final = (
    MetricsFlag(
        "model-server-metrics-scheme",
        "scheme",
        "str",
        "Deprecated: protocol scheme used in scraping metrics from endpoints (http or https).",
    ),
    MetricsFlag("model-server-metrics-path", "path", "str", "Deprecated: URL path used in scraping metrics."),
    MetricsFlag(
        "model-server-metrics-port",
        "port",
        "int",
        "Deprecated: port to scrape metrics on when the pool has one target port (0: the target port).",
    ),
    MetricsFlag(
        "model-server-metrics-https-insecure-skip-verify",
        "insecure_skip_verify",
        "bool",
        "Deprecated: skip certificate verification when scraping over https.",
    ),
)
_FLAG_ATTRS: Final = {f.flag: f.attr for f in MODEL_SERVER_METRICS_FLAGS}
_PARAM_DEFAULTS: Final = MetricsDataSourceParams()


@dataclass(frozen=True, slots=True)
class ModelServerMetricsFlags:
    """The deprecated flags' values; defaults are the ``metrics-data-source`` parameter defaults.

    ``explicitly_set`` names the fields (or the flag names) the user gave on the command
    line; only those override the ``metrics-data-source`` defaults, and plugin parameters
    in the config override them in turn.  ``port`` is no parameter: it becomes each
    endpoint's ``metrics_port`` when the pool has one target port.
    """

    scheme: str = _PARAM_DEFAULTS.scheme
    path: str = _PARAM_DEFAULTS.path
    port: int = 0
    insecure_skip_verify: bool = _PARAM_DEFAULTS.insecure_skip_verify
    explicitly_set: frozenset[str] = frozenset()

    def explicit_params(self) -> dict[str, Any]:
        """The explicitly set flags as metrics-data-source parameters (camelCase keys)."""
        attrs = {_FLAG_ATTRS.get(name, name) for name in self.explicitly_set}
        return {
            field.alias or name: getattr(self, name)
            for name, field in MetricsDataSourceParams.model_fields.items()
            if name in attrs and name != "port"  # the flag's port is per endpoint, not this override
        }


class MetricsDataSource(PluginBase):
    """Fetches ``scheme://<endpoint metrics host>/path`` and parses it.  Type ``metrics-data-source``.

    The metrics host is the endpoint's address and ``port`` when set, else its ``metrics_port``
    (set from ``--model-server-metrics-port`` when the pool has one target port), else its
    serving port.  All endpoints share one client with one kept-alive connection per endpoint;
    a non-200 answer, a malformed or oversized page, or a timeout is an error for that
    poll only, and the connection it happened on is dropped.  Only the metric families
    the attached extractors name are parsed (all of them if an extractor does not say).

    Output: ``MetricFamilies``.
    Parameters (llm-d-router's): ``scheme`` (``http``|``https``, default ``http``), ``path``
    (``/metrics``), ``port`` (1..65535: one port for every endpoint, e.g. a metrics sidecar;
    not for data-parallel pools, whose ranks each have their own), ``insecureSkipVerify``
    (``true``: skip TLS verification), ``caCertPath`` (PEM bundle to verify the target with,
    unless skipping), ``clientCertPath`` + ``clientKeyPath`` (a client certificate for targets
    that require mTLS), ``interval`` (a Go duration: the scrape period, rounded to a multiple
    of ``--refresh-metrics-interval``; omitted, every tick).  The TLS files are read at startup
    and only for ``https``, as upstream.  Ours: ``timeout`` (per poll, e.g. ``"1s"``; default the
    runtime's) and ``maxBodyBytes`` (16 MiB).  The deprecated ``--model-server-metrics-*``
    flags, when set, are merged in below explicit parameters.
    """

    TYPE: ClassVar[str] = "metrics-data-source"
    PARAMS: ClassVar[type[PluginParams]] = MetricsDataSourceParams
    OUTPUT: ClassVar[type[MetricFamilies]] = MetricFamilies

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        assert isinstance(params, HTTPSourceParams)  # a subclass's own parameters may lack ``port``
        self._params = params
        self._path = params.path if params.path.startswith("/") else "/" + params.path
        self._port = (params.port or 0) if isinstance(params, MetricsDataSourceParams) else 0
        self._interval = params.interval
        self._parser = ExpositionParser(None, max_bytes=params.max_body_bytes)
        self._client: ScrapeClient | None = None
        self._share: ScrapeShare | None = None
        self._share_max_age = 0.0
        self._ssl: ssl.SSLContext | None = None
        if params.scheme == "https":  # built now: a bad certificate path never half-starts
            try:
                self._ssl = tls_client_context(
                    skip_verify=params.insecure_skip_verify,
                    ca_cert_path=params.ca_cert_path,
                    client_cert_path=params.client_cert_path,
                    client_key_path=params.client_key_path,
                )
            except TLSConfigError as e:
                raise ConfigError(f"{self.typed_name}: {e}") from None

    @property
    def poll_timeout(self) -> float | None:
        return self._params.timeout

    @property
    def poll_interval(self) -> float | None:
        """The configured scrape period in seconds (None: every tick)."""
        return self._interval

    @property
    def wanted(self) -> frozenset[str] | None:
        """The families parsed per scrape (``None``: all)."""
        return self._parser.wanted

    def bind(self, extractors: Sequence[Plugin]) -> None:
        """Parse only what the extractors read, if every one of them says what that is."""
        wanted: set[str] = set()
        for ext in extractors:
            if not isinstance(ext, FamilyConsumer):
                wanted_or_all = None
                break
            wanted |= ext.wanted_families()
        else:
            wanted_or_all = frozenset(wanted)
        self._parser = ExpositionParser(wanted_or_all, max_bytes=self._params.max_body_bytes)

    async def start(self) -> None:
        if self._client is None:
            self._client = ScrapeClient(ssl_context=self._ssl, max_body_bytes=self._params.max_body_bytes)

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def target(self, endpoint: Endpoint) -> tuple[str, int]:
        """Where this endpoint's page is served: the port override on its address, else its metrics host."""
        md = endpoint.metadata
        if self._port:
            return md.address, self._port
        return md.metrics_address or md.address, md.metrics_port or md.port

    async def poll(self, endpoint: Endpoint) -> MetricFamilies:
        client = self._client
        if client is None:
            raise RuntimeError(f"{self.typed_name}: poll before start")
        host, port = self.target(endpoint)
        share = self._share
        if share is None:
            return self._parser.parse(await client.get(host, port, self._path))
        key = f"{self.typed_name.name}|{host}:{port}".encode()
        if not share.publishing and (page := share.fresh(key, self._share_max_age)) is not None:
            return self._parser.parse(page)  # worker 0 fetched it (epp.datalayer.shared_scrapes)
        body = await client.get(host, port, self._path)
        if share.publishing:
            share.publish(key, body)
        return self._parser.parse(body)

    def share_scrapes(self, share: ScrapeShare, max_age: float) -> None:
        """``--workers N``: fetch once per pod (worker 0) and reuse its pages while younger than
        ``max_age`` (the others); the data layer binds it (``epp.datalayer.shared_scrapes``)."""
        self._share, self._share_max_age = share, max_age

    def endpoint_event(self, event: EndpointEvent) -> None:
        """Close idle connections of an endpoint that left (and drop its shared page)."""
        if event.type == "Delete" and self._client is not None:
            host, port = self.target(event.endpoint)
            self._client.forget(host, port)
            if self._share is not None:
                self._share.forget(f"{self.typed_name.name}|{host}:{port}".encode())

    def idle_connections(self) -> int:
        return 0 if self._client is None else self._client.idle_connections()
