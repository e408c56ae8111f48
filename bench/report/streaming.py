"""Section 4: streamed responses (ext_proc messages and CPU per chunk), and its plot."""

# The report is typeset markdown: the multiplication sign, en dash and minus sign are meant.
# ruff: noqa: RUF001

from __future__ import annotations

from typing import Any

from bench.report.fmt import f, pyplot, save_plot, table


def streaming_section(s: dict[str, Any]) -> list[str]:
    st, paths = s["settings"], s["paths"]
    n = str(st["chunks"])
    out = [
        "## 4. Streamed responses",
        "",
        f"The upstream streams {st['chunks']:,} SSE token events per request, one every "
        f"{st['chunk_gap_us']:g} µs; "
        f"{st['concurrency']} concurrent streams, closed loop, {st['window_s']:g} s windows, "
        f"{st['rounds']} round(s). "
        "A *chunk* is a response-body message Envoy sent to the ext_proc server (Envoy's ext_proc counters; "
        "Envoy merges events that arrive together). Per-chunk CPU = (CPU per request with N events − CPU per "
        "request with 1 event) / (extra messages per request), so per-request costs cancel. Each EPP path "
        "is also set against its fair floor (the no-op server under the same Envoy config asking for the "
        "same phases), per event and by process.",
        "",
    ]
    rows = []
    for name, title in paths.items():
        big = s["table"][name][n]
        one = s["table"][name]["1"]
        pc = s["per_chunk"][name]
        rows.append(
            [
                title,
                f(big["events_per_s"], 0),
                f(big["extproc_msgs_per_req"], 1),
                f(one["extproc_msgs_per_req"], 1),
                f(pc.get("extproc_us_per_chunk"), 1),
                f(pc.get("chunks_per_core_s"), 0),
                f(pc.get("extproc_us_per_event"), 2),
                f(pc.get("envoy_us_per_event"), 2),
                f(pc.get("envoy_us_per_chunk"), 1),
                s.get("floors", {}).get(name, "–"),
                f(pc.get("extproc_us_per_event_over_floor"), 2),
                f(pc.get("envoy_us_per_event_over_floor"), 2),
            ]
        )
    out += [
        table(
            [
                "path",
                "events/s (client)",
                f"ext_proc msgs/req (N={n})",
                "msgs/req (N=1)",
                "ext_proc µs/chunk",
                "chunks per ext_proc core-s",
                "ext_proc µs/event",
                "Envoy µs/event",
                "Envoy µs/chunk",
                "fair floor",
                "ext_proc µs/event over floor",
                "Envoy µs/event over floor",
            ],
            rows,
        ),
        "",
    ]
    img = plot_streaming(s)
    if img:
        out += [f"![Streaming: events per second and ext_proc CPU per event]({img})", ""]
    return out


def plot_streaming(s: dict[str, Any]) -> str:
    plt = pyplot()
    n = str(s["settings"]["chunks"])
    names = list(s["paths"])
    labels = [s["paths"][k] for k in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.barh(labels, [s["table"][k][n]["events_per_s"] for k in names])
    a.set_xlabel("SSE events/s delivered to the client")
    a.set_title(f"Streamed events/s (N={n} per request)")
    b.barh(labels, [max(0.0, s["per_chunk"][k].get("extproc_us_per_event") or 0.0) for k in names])
    b.set_xlabel("ext_proc server CPU µs per streamed event")
    b.set_title("ext_proc CPU per event")
    for ax in (a, b):
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
        ax.tick_params(axis="y", labelsize=7)
    return save_plot(fig, "streaming.png")
