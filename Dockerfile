# The EPP image: the project installed from its own files into a venv, run as a non-root user.
# The product only: the simulator and the demo (sim/, distribution epp-sim) are not in it.
FROM python:3.11-slim AS build
# a C compiler for the C extensions and the modules mypyc compiles (hatch_build.py: the prefix
# loops, the ext_proc message decoding, the scoring kernel, the session's and the director's
# per-request path); without one the EPP runs their Python/upb fallbacks (slower, same results).
# The run stage needs only the built modules.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml hatch_build.py README.md ./
COPY protos ./protos
COPY src ./src
RUN python -m venv /opt/epp && /opt/epp/bin/pip install --no-cache-dir . && /opt/epp/bin/pip check

FROM python:3.11-slim
COPY --from=build /opt/epp /opt/epp
COPY config /etc/epp/config
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/opt/epp/bin/epp"]
